"""The negative-value filter (``--filter negative-value``): drop the turns taken from a state the rollouts did worse
from than from the task's first one, whose negative advantage mostly blames them for the turns that led there."""

from __future__ import annotations

import torch

from sdarflow.algo import relative_to_start, state_values


def negative_value_rows(
    rows: list[dict], scores: torch.Tensor, values: torch.Tensor | None = None
) -> list[bool]:
    """Which rows the filter drops (a row filter of :mod:`sdarflow.train.samples`): those whose state (the turn's
    index and prompt, in its group) has a negative value relative to the group's start.

    The value is the group's Monte-Carlo estimate from the rows' GRPO ``scores``
    (:func:`sdarflow.algo.state_values`), or, given ``values`` (each row's state value from a learned head,
    :mod:`sdarflow.extensions.value_head`), that head's value minus its value at the group's first turn
    (:func:`sdarflow.algo.relative_to_start`)."""
    groups = [r["group_id"] for r in rows]
    if values is not None:
        relative = relative_to_start(values, groups, [int(r["turn"]) for r in rows])
    else:
        keys = [(int(r["turn"]), tuple(r["prompt_token_ids"])) for r in rows]
        relative = state_values(scores.double(), groups, [r["traj_id"] for r in rows], keys)
    return (relative < -1e-9).tolist()
