"""SCPO credit (``--credit scpo``): in a group, a failed episode's turns identical to a successful sibling's take
that sibling's advantage (:func:`sdarflow.algo.scpo_advantages`); only the divergent turn and after keep the
failure's."""

from __future__ import annotations

import torch

from sdarflow.algo import scpo_advantages


def _turn_key(r: dict) -> tuple:
    # In a group (one task) an equal prompt at a turn means an equal history; with the action, the same turn.
    return (tuple(r["prompt_token_ids"]), tuple(r["response_token_ids"]))


def scpo_credit(advantages: torch.Tensor, rows: list[dict]) -> torch.Tensor:
    """The rows' GRPO ``advantages`` with SCPO's credit (a credit assigner of :mod:`sdarflow.train.samples`)."""
    return scpo_advantages(
        advantages,
        [r["group_id"] for r in rows],
        [r["traj_id"] for r in rows],
        [int(r["turn"]) for r in rows],
        [_turn_key(r) for r in rows],
        [bool(r["success"]) for r in rows],
    )
