"""The HF engine: seeded per-sample sampling, batch-independent reproducibility, and log-probs that agree with the
trainer's teacher-forced forward pass."""

from __future__ import annotations

import pytest
import torch

from sdarflow.models import load_policy
from sdarflow.models.forward import make_batch, response_logprobs
from sdarflow.rollout.hf_engine import HFEngine, _top_p_mask
from sdarflow.rollout.loop import sample_seed
from sdarflow.rollout.prompt import build_messages, encode_prompt, insert_skills, parse_action


@pytest.fixture(scope="module")
def engine(tiny_model):
    policy = load_policy(str(tiny_model), device="cpu")
    return HFEngine(policy.model, policy.tokenizer, policy.eos_id)


@pytest.fixture(scope="module")
def prompts(engine):
    msgs = [build_messages("cook the apple", ["open fridge"], f"You are in room {i}.") for i in range(3)]
    return [encode_prompt(engine.tokenizer, m) for m in msgs]


def test_same_seed_same_sample_regardless_of_batch(engine, prompts):
    kw = {"max_new_tokens": 8, "temperature": 1.0}
    together = engine.generate(prompts, [11, 12, 13], **kw)
    alone = engine.generate(prompts[1:2], [12], **kw)
    assert together[1].token_ids == alone[0].token_ids


def test_group_samples_differ(engine, prompts):
    same_prompt = [prompts[0]] * 4
    samples = engine.generate(
        same_prompt, [sample_seed(0, f"g{i}", 0) for i in range(4)], max_new_tokens=8, temperature=1.0
    )
    assert len({tuple(s.token_ids) for s in samples}) > 1


def assert_trainer_logprobs(engine, prompts, samples) -> None:
    """Each sample's log-probs are the trainer's teacher-forced forward pass's (within 1e-4)."""
    batch = make_batch(prompts, [s.token_ids for s in samples], engine.tokenizer.pad_token_id)
    with torch.no_grad():
        logp, _ = response_logprobs(engine.model, batch)
    width = batch.targets.shape[1]
    for row, s in enumerate(samples):
        n = len(s.token_ids)
        assert torch.allclose(logp[row, width - n :], torch.tensor(s.logprobs), atol=1e-4)


def test_engine_logprobs_match_the_trainer_forward(engine, prompts):
    samples = engine.generate(prompts, [1, 2, 3], max_new_tokens=8, temperature=1.0)
    assert_trainer_logprobs(engine, prompts, samples)


def test_top_p_keeps_the_smallest_sufficient_prefix():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = torch.isfinite(_top_p_mask(logits, 0.7))
    assert kept.tolist() == [[True, True, False, False]]
    assert torch.isfinite(_top_p_mask(logits, 0.01)).sum() == 1


def test_parse_action_and_skill_insertion():
    assert parse_action("  Take Red Apple ", True) == ("take red apple", True)
    assert parse_action("take apple", False)[1] is False  # truncated: no end-of-turn
    assert parse_action("{json: 1}", True)[1] is False
    msgs = build_messages("goal", [], "obs")
    teacher = insert_skills(msgs, "1. take <item>", "system")
    assert teacher[1] == msgs[1] and "Skills:\n1. take <item>" in teacher[0]["content"]
    assert insert_skills(msgs, "s", "user")[1]["content"].startswith("Skills:\ns\n")
    assert msgs[0]["content"].count("Skills") == 0  # the student's messages are untouched
    with pytest.raises(ValueError, match="teacher_prompt_ids"):  # prefix works on token ids, not messages
        insert_skills(msgs, "s", "prefix")


def test_min_new_tokens_fixes_the_response_length_and_keeps_raw_logprobs(engine, prompts):
    samples = engine.generate(prompts, [1, 2, 3], max_new_tokens=12, temperature=1.0, min_new_tokens=12)
    assert [len(s.token_ids) for s in samples] == [12, 12, 12]
    assert not any(s.finished or engine.eos_id in s.token_ids for s in samples)
    batch = make_batch(prompts, [s.token_ids for s in samples], engine.tokenizer.pad_token_id)
    with torch.no_grad():
        logp, _ = response_logprobs(engine.model, batch)
    # the policy's own log-probs (EOS suppression is sampling, not the distribution the trainer sees)
    assert torch.allclose(logp, torch.tensor([s.logprobs for s in samples]), atol=1e-4)


def test_without_logprobs_the_samples_are_the_same_and_carry_none(engine, prompts):
    kw = {"max_new_tokens": 8, "temperature": 1.0}
    with_lp = engine.generate(prompts, [11, 12, 13], **kw)
    without = engine.generate(prompts, [11, 12, 13], **kw, logprobs=False)
    assert [(s.token_ids, s.text, s.finished) for s in without] == [
        (s.token_ids, s.text, s.finished) for s in with_lp
    ]
    assert all(s.logprobs == [] for s in without) and all(
        len(s.logprobs) == len(s.token_ids) for s in with_lp
    )


def test_repeated_prompts_are_run_once_and_sample_as_if_each_had_its_own(engine, prompts):
    """A group's samples share their prompt: the prompt's forward pass runs once per distinct prompt (left-padded
    rows of several lengths), and every sample is the one the engine draws without sharing, with the trainer's
    log-probs."""
    short = encode_prompt(engine.tokenizer, build_messages("eat", [], "Here."))
    assert len(short) < len(prompts[0])
    batch_prompts = [prompts[0], short, prompts[0], prompts[1], short, prompts[0]]
    seeds = [sample_seed(0, f"e{i}", 0) for i in range(len(batch_prompts))]
    kw = {"max_new_tokens": 8, "temperature": 1.0}
    rows_seen: list[int] = []
    hook = engine.model.get_input_embeddings().register_forward_hook(
        lambda module, args, out: rows_seen.append(args[0].shape[0])
    )
    try:
        shared = engine.generate(batch_prompts, seeds, **kw)
    finally:
        hook.remove()
    assert rows_seen[0] == 3  # the prefill: prompts[0], short and prompts[1] once each
    alone = HFEngine(engine.model, engine.tokenizer, engine.eos_id, share_prompts=False)
    own = alone.generate(batch_prompts, seeds, **kw)
    assert [s.token_ids for s in shared] == [s.token_ids for s in own]
    assert_trainer_logprobs(engine, batch_prompts, shared)
    for mine, theirs in zip(shared, own, strict=True):
        assert torch.allclose(torch.tensor(theirs.logprobs), torch.tensor(mine.logprobs), atol=1e-5)


def test_a_cpu_call_decodes_in_a_cache_of_fixed_width(engine, prompts):
    """On a CPU, generate continues from a cache allocated once for the widest prompt and the new tokens; the tokens
    of left-padded rows of three lengths, greedy and sampled (rows ending at different steps), equal a decode that
    runs each row's whole text every step."""
    from transformers import StaticCache

    batch_prompts = [prompts[0], prompts[1][2:], prompts[2][5:]]
    caches = []
    hook = engine.model.register_forward_pre_hook(
        lambda module, args, kwargs: caches.append(kwargs.get("past_key_values")), with_kwargs=True
    )
    try:
        samples = engine.generate(
            batch_prompts, [1, 2, 3], max_new_tokens=6, min_new_tokens=6, temperature=0.0
        )
    finally:
        hook.remove()
    width = max(map(len, batch_prompts))
    decoding = caches[1:]  # after the prefill
    assert len(decoding) == 6 and all(isinstance(c, StaticCache) and c is decoding[0] for c in decoding)
    assert decoding[0].get_max_length() == width - 1 + 6
    # and sampled, where rows end at their own end-of-turn token, before the others (min_new_tokens 0)
    ending = engine.generate(batch_prompts, [4, 5, 6], max_new_tokens=8, temperature=1.0)
    for prompt, seed, fixed, free in zip(batch_prompts, [4, 5, 6], samples, ending, strict=True):
        assert fixed.token_ids == _uncached(engine, prompt, 6, min_new=6)
        assert free.token_ids == _uncached(engine, prompt, 8, seed=seed)
    assert len({len(s.token_ids) for s in ending}) > 1


def _uncached(engine, prompt: list[int], new: int, min_new: int = 0, seed: int | None = None) -> list[int]:
    """A row's tokens by running its whole text every step, no cache, up to its end-of-turn token: greedy, or with
    ``seed`` the engine's sampling at temperature 1 (the Gumbel-max trick on the sample's own generator's draws)."""
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    text = list(prompt)
    with torch.no_grad():
        while len(text) - len(prompt) < new and (len(text) == len(prompt) or text[-1] != engine.eos_id):
            logits = engine.model(input_ids=torch.tensor([text])).logits[0, -1].float()
            if len(text) - len(prompt) < min_new:
                logits[engine.eos_id] = float("-inf")  # min_new_tokens: no end before then
            if gen is not None:
                logits = logits - torch.log(-torch.log(torch.rand(logits.shape[-1], generator=gen)))
            text.append(int(logits.argmax()))
    return text[len(prompt) :]
