"""Rescoring: ``old_logprobs`` (the policy on the plain context) and ``teacher_logprobs`` (the same policy with the
retrieved skills inserted: SDAR's teacher, so any gap is the effect of the skills), teacher-forced on the sampled
tokens, float32; ``ref_logprobs`` (the base model's, :func:`reference_model`) for the trainer's KL term.

Two batchings give the same numbers (within 1e-5, tested): ``padded`` left-pads rows of similar length into
batches of at most ``max_tokens`` padded tokens; ``packed`` (the default) lays rows end to end into bins of
``pack_length`` tokens (first-fit decreasing) with block-diagonal attention, so little compute goes to padding.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch

from sdarflow import progress
from sdarflow.models.device import model_device
from sdarflow.models.forward import (
    make_batch,
    make_packed_batch,
    pack_bins,
    packed_response_logprobs,
    response_logprobs,
    to_device,
    token_budget_batches,
)
from sdarflow.rollout.prompt import loads, prompt_text, teacher_prompt_ids
from sdarflow.skills.library import SkillLibrary

log = logging.getLogger(__name__)

Batching = Literal["packed", "padded"]
BATCHINGS: tuple[str, ...] = ("packed", "padded")


@dataclass
class TeacherInputs:
    prompts: list[list[int]]
    skill_ids: list[list[str]]
    hits: list[bool]  # a task-specific skill was retrieved
    matched: list[bool]  # the skill of the row's own task type was retrieved
    unchanged: int  # rows whose teacher prompt equals the student prompt (no skill text went in)


def teacher_prompts(
    rows: list[dict],
    lib: SkillLibrary,
    strategy,
    tokenizer,
    place: str,
    max_tokens: int | None = None,
    texts: list[str] | None = None,
) -> TeacherInputs:
    """Each row's teacher prompt: its retrieved skills at ``place``, left-truncated to ``max_tokens``; with
    ``texts``, each row's own privileged text there instead (a solution; "" keeps the student prompt), and no skill
    is retrieved or credited.

    As the reference's ``build_teacher_batch`` (ZJU-REAL/SDAR ``verl/trainer/ppo/rlsd_ray_trainer.py``), the
    student prompt ids are decoded with special tokens and that text is what keyword retrieval reads and what the
    ``prefix`` place puts the skills in front of.
    """
    out = TeacherInputs([], [], [], [], 0)
    for i, row in enumerate(rows):
        student = list(row["prompt_token_ids"])
        text = prompt_text(tokenizer, student)
        if texts is None:
            got = strategy(lib, row["task_type"], text)
            privileged, ids, hit, matched = got.text, got.ids, got.hit, got.matched
        else:
            privileged, ids, hit, matched = texts[i], [], False, False
        messages = loads(row["prompt_messages"]) if place != "prefix" else []
        prompt = teacher_prompt_ids(
            tokenizer, student, messages, privileged, place, max_tokens, student_text=text
        )
        out.prompts.append(prompt)
        out.skill_ids.append(ids)
        out.hits.append(hit)
        out.matched.append(matched)
        out.unchanged += prompt == student
    return out


@contextlib.contextmanager
def reference_model(model, base_path: str, flash_attention: bool) -> Iterator[torch.nn.Module]:
    """The reference policy pi_ref of the KL term: the base model, without the adapter ``model`` carries (a PEFT
    model's ``disable_adapter()``, no copy; a full fine-tune has no base left: loaded from ``base_path`` beside
    it, as the policy was, ``flash_attention`` included, so packed batches stay separate sequences)."""
    from peft import PeftModel

    if isinstance(model, PeftModel):
        with model.disable_adapter():
            yield model
        return
    from sdarflow.models import load_policy

    log.info(
        "rescore: the policy is a full fine-tune; loading the base model beside it for the reference log-probs"
    )
    weights = next(model.parameters())
    yield load_policy(
        base_path, device=str(weights.device), dtype=weights.dtype, flash_attention=flash_attention
    ).model


def k1_mean(logprobs: list[list[float]], ref_logprobs: list[list[float]]) -> float:
    """Mean over all response tokens of ``logprobs - ref_logprobs`` (the k1 estimator of KL(pi || pi_ref))."""
    diffs = [
        a - b for lp, rp in zip(logprobs, ref_logprobs, strict=True) for a, b in zip(lp, rp, strict=True)
    ]
    return sum(diffs) / max(1, len(diffs))


def pack_capacity(lengths: list[int], pack_length: int) -> int:
    """Bin size: ``pack_length`` if set, else the longest row.

    With sdpa on CPU the block-diagonal mask is dense, so attention costs (bin length)^2 per bin whatever the
    rows inside: bins as long as the longest row cost no more attention than a padded batch of that row, and
    measured on the tiny model (attention-heavy: hidden 128) they beat padding by ~10%; 1024-token bins were 30%
    slower there. Larger models (hidden >= 1k) are dominated by the linear layers and gain from larger bins.
    """
    return pack_length if pack_length > 0 else max(lengths)


@torch.inference_mode()
def score(
    model,
    prompts: list[list[int]],
    responses: list[list[int]],
    pad_id: int,
    max_tokens: int,
    desc: str = "rescore",
    batching: Batching = "packed",
    pack_length: int = 0,
) -> list[list[float]]:
    """Teacher-forced float32 log-probs of each response given its prompt; ``max_tokens`` bounds the tokens of one
    forward pass (padded width x rows), ``pack_length`` is the packed bin size (0: :func:`pack_capacity`)."""
    out: list[list[float]] = [[] for _ in prompts]
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses, strict=True)]
    if not lengths:
        return out
    device = model_device(model)
    if batching == "padded":
        for idx in progress.bar(token_budget_batches(lengths, max_tokens), desc=desc, unit="batch"):
            batch = to_device(
                make_batch([prompts[i] for i in idx], [responses[i] for i in idx], pad_id), device
            )
            logp, _ = response_logprobs(model, batch)
            r_max = batch.targets.shape[1]
            for row, i in enumerate(idx):
                n = len(responses[i])
                out[i] = logp[row, r_max - n :].tolist() if n else []
        return out
    bins = pack_bins(lengths, pack_capacity(lengths, pack_length))
    used = [sum(lengths[i] for i in b) for b in bins]
    for group in progress.bar(token_budget_batches(used, max_tokens), desc=desc, unit="batch"):
        batch = to_device(make_packed_batch(prompts, responses, [bins[g] for g in group], pad_id), device)
        logp = packed_response_logprobs(model, batch)
        for i, start, n in batch.spans:
            out[i] = logp[start : start + n].tolist()
    return out


def padding_share(lengths: list[int], max_tokens: int, batching: Batching, pack_length: int = 0) -> float:
    """Share of the tokens run through the model that are padding, for the stage metrics."""
    if not lengths:
        return 0.0
    if batching == "padded":
        groups = [[lengths[i] for i in b] for b in token_budget_batches(lengths, max_tokens)]
    else:
        bins = pack_bins(lengths, pack_capacity(lengths, pack_length))
        used = [sum(lengths[i] for i in b) for b in bins]
        groups = [[used[i] for i in b] for b in token_budget_batches(used, max_tokens)]
    total = sum(max(g) * len(g) for g in groups)
    return 1.0 - sum(lengths) / total
