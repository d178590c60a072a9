"""Rescoring: ``old_logprobs`` (the policy on the plain context) and ``teacher_logprobs`` (the same policy with the
retrieved skills inserted), teacher-forced on the sampled tokens, float32.

The teacher is the policy itself given privileged context (SDAR): same weights, so any gap between the two
log-probs is the effect of the skills.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from sdarflow.models.forward import make_batch, response_logprobs, token_budget_batches
from sdarflow.rollout.loop import encode_prompt
from sdarflow.rollout.prompt import insert_skills, loads
from sdarflow.skills.library import SkillLibrary

log = logging.getLogger(__name__)


@dataclass
class TeacherInputs:
    prompts: list[list[int]]
    skill_ids: list[list[str]]
    hits: list[bool]


def teacher_prompts(rows: list[dict], lib: SkillLibrary, strategy, tokenizer, place: str) -> TeacherInputs:
    """Render each row's messages with its retrieved skills inserted at ``place``."""
    prompts, ids, hits = [], [], []
    for row in rows:
        messages = loads(row["prompt_messages"])
        goal = messages[-1]["content"]
        got = strategy(lib, row["task_type"], goal)
        prompts.append(encode_prompt(tokenizer, insert_skills(messages, got.text, place)))
        ids.append(got.ids)
        hits.append(got.hit)
    return TeacherInputs(prompts, ids, hits)


@torch.inference_mode()
def score(
    model,
    prompts: list[list[int]],
    responses: list[list[int]],
    pad_id: int,
    max_tokens: int,
    desc: str = "rescore",
) -> list[list[float]]:
    """Teacher-forced float32 log-probs of each response given its prompt, batched by token budget."""
    out: list[list[float]] = [[] for _ in prompts]
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses, strict=True)]
    for idx in tqdm(token_budget_batches(lengths, max_tokens), desc=desc, unit="batch", leave=False):
        batch = make_batch([prompts[i] for i in idx], [responses[i] for i in idx], pad_id)
        logp, _ = response_logprobs(model, batch)
        r_max = batch.targets.shape[1]
        for row, i in enumerate(idx):
            n = len(responses[i])
            out[i] = logp[row, r_max - n :].tolist() if n else []
    return out


def gap_stats(old: list[list[float]], teacher: list[list[float]]) -> dict[str, float]:
    gaps = [t - s for o, q in zip(old, teacher, strict=True) for s, t in zip(o, q, strict=True)]
    if not gaps:
        return {
            "rescore/gap_mean": 0.0,
            "rescore/gap_positive_share": 0.0,
            "rescore/teacher_logprob_mean": 0.0,
        }
    flat_teacher = [t for q in teacher for t in q]
    return {
        "rescore/gap_mean": sum(gaps) / len(gaps),
        "rescore/gap_positive_share": sum(g > 0 for g in gaps) / len(gaps),
        "rescore/teacher_logprob_mean": sum(flat_teacher) / len(flat_teacher),
        "rescore/tokens": float(len(gaps)),
    }


def uniform_logprob(vocab_size: int) -> float:
    return -math.log(vocab_size)
