"""SCPO credit (``--credit scpo``): in a group, a failed episode's turns identical to a successful sibling's take
that sibling's advantage (:func:`scpo_advantages`, SCPO, arXiv:2606.25852); only the divergent turn and after keep the
failure's."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch
from torch import Tensor

from sdarflow.algo.advantages import Ids, codes


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


def scpo_advantages(
    advantages: Tensor,
    group_ids: Ids,
    traj_ids: Ids,
    turns: Sequence[int],
    turn_keys: Sequence[Hashable],
    success: Sequence[bool],
) -> Tensor:
    """SCPO credit: a failed rollout's turns shared with a successful sibling take the sibling's advantage.

    For each failed episode f of a group, ``k_s`` is the number of leading turns (0, 1, ...) whose keys equal
    successful sibling s's turns, and s* the sibling with the largest ``k_s`` (first in row order on a tie). Then
    ``A'_{f,t} = A_{s*,t}`` for ``t < k_{s*}`` and ``A'_{f,t} = A_{f,t}`` from the first divergent turn on.
    Successful episodes, and failed ones with no successful sibling or none sharing their first turn, keep
    their advantages.

    All arguments are per row (N,): ``turns`` its index within its episode, ``turn_keys`` its identity (equal keys
    = the same prompt and the same action), ``success`` its episode's. Returns the (N,) credited advantages.
    """
    n = advantages.shape[0]
    groups = codes(group_ids, n, "group_ids")
    trajs = codes(traj_ids, n, "traj_ids")
    for name, values in (("turns", turns), ("turn_keys", turn_keys), ("success", success)):
        codes(values, n, name)
    episodes: dict[tuple, dict[int, int]] = {}  # (group, traj) -> turn -> row, in row order
    for i, (g, tr, t) in enumerate(zip(groups, trajs, turns, strict=True)):
        if int(t) in episodes.setdefault((g, tr), {}):
            raise ValueError(f"scpo_advantages: turn {int(t)} of episode {tr} appears twice")
        episodes[(g, tr)][int(t)] = i
    in_group: dict[int, list[dict[int, int]]] = {}
    for (g, _), rows in episodes.items():
        in_group.setdefault(g, []).append(rows)
    a = advantages.detach()
    out = a.clone()
    for group in in_group.values():
        wins = [e for e in group if success[next(iter(e.values()))]]
        for f_rows in group:
            if success[next(iter(f_rows.values()))]:
                continue
            best, best_len = None, 0
            for s_rows in wins:
                k = _shared_prefix(f_rows, s_rows, turn_keys)
                if k > best_len:
                    best, best_len = s_rows, k
            for t in range(best_len):
                out[f_rows[t]] = a[best[t]]
    return out


def _shared_prefix(a: dict[int, int], b: dict[int, int], keys: Sequence[Hashable]) -> int:
    """Leading turns 0, 1, ... present in both episodes with equal keys."""
    k = 0
    while k in a and k in b and keys[a[k]] == keys[b[k]]:
        k += 1
    return k
