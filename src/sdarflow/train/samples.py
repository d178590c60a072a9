"""Rescored turn rows -> RL training samples: each row's GRPO advantage (as verl-agent computes it) and the
sample the trainer takes (prompt, response, old/teacher/reference log-probs, advantage)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sdarflow.algo import grpo_advantages, penalized_scores


@dataclass
class RLSample:
    prompt: list[int]
    response: list[int]
    old_logprobs: list[float]
    teacher_logprobs: list[float]
    advantage: float
    ref_logprobs: list[float] | None = None


def row_advantages(
    rows: list[dict], norm_by_std: bool = True, penalty: float = 0.0, per_episode: bool = False
) -> list[float]:
    """GRPO advantage of each turn row, as verl-agent computes it: the row's score is its episode's return minus
    ``penalty`` if its action did not parse, standardised within its group over rows (or over episodes, one
    score each, with ``per_episode``)."""
    scores = penalized_scores(
        torch.tensor([float(r["episode_return"]) for r in rows], dtype=torch.float32),
        torch.tensor([bool(r["format_ok"]) for r in rows]),
        penalty,
    )
    groups = [r["group_id"] for r in rows]
    trajs = [r["traj_id"] for r in rows] if per_episode else None
    return grpo_advantages(scores, groups, norm_by_std=norm_by_std, traj_ids=trajs).tolist()


def advantage_stats(rows: list[dict], advantages: list[float]) -> dict[str, float]:
    """What GRPO has to learn from: the share of groups whose rows all got advantage 0 (every rollout scored
    alike, so the group gives no policy gradient) and the spread of the row advantages."""
    groups: dict[str, list[float]] = {}
    for r, a in zip(rows, advantages, strict=True):
        groups.setdefault(r["group_id"], []).append(a)
    zero = sum(all(abs(a) < 1e-6 for a in values) for values in groups.values())
    t = torch.tensor(advantages, dtype=torch.float64)
    return {
        "adv/zero_group_share": zero / max(1, len(groups)),
        "adv/std": float(t.std()) if t.numel() > 1 else 0.0,
        "adv/abs_mean": float(t.abs().mean()) if t.numel() else 0.0,
    }


def make_samples(rows: list[dict], advantages: list[float] | None = None) -> list[RLSample]:
    """Training samples from rescored rows with their :func:`row_advantages` (default settings when None).

    Advantages use every row (a turn without a response still counts in its group's statistics, as in the
    reference), but only rows with a response train."""
    adv = row_advantages(rows) if advantages is None else advantages
    return [
        RLSample(
            r["prompt_token_ids"],
            r["response_token_ids"],
            r["old_logprobs"],
            r["teacher_logprobs"],
            a,
            r.get("ref_logprobs"),
        )
        for r, a in zip(rows, adv, strict=True)
        if r["response_token_ids"]
    ]
