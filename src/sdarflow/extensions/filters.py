"""The negative-value filter (``--filter negative-value``): drop the turns taken from a state the rollouts did worse
from than from the task's first one, whose negative advantage mostly blames them for the turns that led there."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch
from torch import Tensor

from sdarflow.algo.advantages import Ids, codes


def negative_value_rows(
    rows: list[dict], scores: torch.Tensor, values: torch.Tensor | None = None
) -> list[bool]:
    """Which rows the filter drops (a row filter of :mod:`sdarflow.train.samples`): those whose state (the turn's
    index and prompt, in its group) has a negative value relative to the group's start.

    The value is the group's Monte-Carlo estimate from the rows' GRPO ``scores``
    (:func:`state_values`), or, given ``values`` (each row's state value from a learned head,
    :mod:`sdarflow.extensions.value_head`), that head's value minus its value at the group's first turn
    (:func:`relative_to_start`)."""
    groups = [r["group_id"] for r in rows]
    if values is not None:
        relative = relative_to_start(values, groups, [int(r["turn"]) for r in rows])
    else:
        keys = [(int(r["turn"]), tuple(r["prompt_token_ids"])) for r in rows]
        relative = state_values(scores.double(), groups, [r["traj_id"] for r in rows], keys)
    return (relative < -1e-9).tolist()


def state_values(scores: Tensor, group_ids: Ids, traj_ids: Ids, state_keys: Sequence[Hashable]) -> Tensor:
    """Monte-Carlo value of each row's state relative to its group, one vote per episode:
    ``V(s_i) - mean_g = mean_{e reached s_i} S_e - mean_{e in g} S_e``.

    ``S_e`` is episode e's score, the mean of its rows' scores; an episode counts once in its group's mean and
    once in each state it reached, however many turns it took. Negative: the episodes that reached this state did
    worse than the group's episodes on average. (N,) -> (N,).
    """
    n = scores.shape[0]
    groups = codes(group_ids, n, "group_ids")
    trajs = codes(traj_ids, n, "traj_ids")
    codes(state_keys, n, "state_keys")
    s = scores.detach().to(torch.float64)
    rows_of: dict[tuple, list[int]] = {}  # (group, episode) -> its rows
    for i, pair in enumerate(zip(groups, trajs, strict=True)):
        rows_of.setdefault(pair, []).append(i)
    episode = {pair: float(s[rows].mean()) for pair, rows in rows_of.items()}
    reached: dict[tuple, set] = {}  # (group, state) -> the episodes that reached it
    for g, tr, key in zip(groups, trajs, state_keys, strict=True):
        reached.setdefault((g, key), set()).add(tr)
    group_scores: dict[Hashable, list[float]] = {}
    for (g, _), value in episode.items():
        group_scores.setdefault(g, []).append(value)
    mean = {g: sum(v) / len(v) for g, v in group_scores.items()}
    values = [
        sum(episode[(g, e)] for e in reached[(g, key)]) / len(reached[(g, key)]) - mean[g]
        for g, key in zip(groups, state_keys, strict=True)
    ]
    return torch.tensor(values, dtype=scores.dtype)


def relative_to_start(values: Tensor, group_ids: Ids, turns: Sequence[int]) -> Tensor:
    """Each row's state value relative to its group's start: ``v_i - mean of v over group g's rows at its first
    turn``. With Monte-Carlo values the start's is the group's mean return (:func:`state_values`); with a
    learned head, negative says the head expects less from this state than from the task's first one. (N,) ->
    (N,)."""
    n = values.shape[0]
    groups = codes(group_ids, n, "group_ids")
    first: dict[Hashable, int] = {}
    for g, t in zip(groups, turns, strict=True):
        first[g] = min(first.get(g, int(t)), int(t))
    start: dict[Hashable, list[float]] = {}
    for g, t, v in zip(groups, turns, values.tolist(), strict=True):
        if int(t) == first[g]:
            start.setdefault(g, []).append(v)
    base = torch.tensor([sum(start[g]) / len(start[g]) for g in groups], dtype=values.dtype)
    return values.detach() - base
