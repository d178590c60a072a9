"""Step-level credit on top of GRPO's outcome advantage: SCPO's sibling credit, the progress term, and the
per-state value estimate that FORCE-style filtering drops rollouts by.

GRPO gives every turn of an episode the episode's advantage, so a failed rollout's first turns, identical to a
successful sibling's, are pushed down while the sibling's same turns are pushed up. The functions here correct
that from what the group already holds (no critic): SCPO (arXiv:2606.25852) hands the shared turns the
successful sibling's credit; the state value compares the rollouts that reached the same state. Turns and states
are identified by hashable keys the caller builds. Everything here carries no gradient.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch
from torch import Tensor

from sdarflow.algo.advantages import Ids, _codes


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
    groups = _codes(group_ids, n, "group_ids")
    trajs = _codes(traj_ids, n, "traj_ids")
    for name, values in (("turns", turns), ("turn_keys", turn_keys), ("success", success)):
        _codes(values, n, name)
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


def progress_advantages(
    advantages: Tensor, logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, coef: float
) -> Tensor:
    """Outcome advantage plus the progress term: ``A'_t = A_t + coef * (log pi(y_t) - log pi_ref(y_t))``.

    The log-ratio to the reference policy (the base model) says how far training has already moved each token;
    as a step-level term it separates the tokens of one turn that GRPO weighs alike. It is the negative of a
    KL-in-reward penalty (it rewards moving away from the reference, against a KL loss) and 0 while the policy is
    the reference (round 0). All (B, T); the log-probs are constants (sdarflow passes the rescored ones of the
    policy that generated the rows); 0 on masked tokens (``where``: padded log-probs may be -inf).
    """
    a = advantages.detach() + coef * (logprobs.detach() - ref_logprobs.detach())
    return torch.where(mask.bool(), a, torch.zeros_like(a))


def turn_progress(logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor) -> Tensor:
    """Per-turn progress, the turn's log-likelihood ratio ``sum_t m_t (log pi(y_t) - log pi_ref(y_t))``:
    (B, T) -> (B,). Exported with the rescored rows, so a failure can be traced to the turns that moved most."""
    diff = torch.where(mask.bool(), logprobs - ref_logprobs, torch.zeros_like(logprobs))
    return diff.sum(dim=-1)


def perplexity_delta(nll_before: Tensor, nll_after: Tensor) -> Tensor:
    """OPERA-style turn reward: the drop in the policy's log-perplexity on the task's reference continuation,
    ``r_t = NLL(ref | context before turn t) - NLL(ref | context after turn t)``, each the mean per-token negative
    log-likelihood. Positive: the turn (its action and what it observed) made the solution likelier. (N,) -> (N,).
    """
    return (nll_before - nll_after).detach()


def state_values(scores: Tensor, group_ids: Ids, traj_ids: Ids, state_keys: Sequence[Hashable]) -> Tensor:
    """Monte-Carlo value of each row's state relative to its group, one vote per episode:
    ``V(s_i) - mean_g = mean_{e reached s_i} S_e - mean_{e in g} S_e``.

    ``S_e`` is episode e's score, the mean of its rows' scores; an episode counts once in its group's mean and
    once in each state it reached, however many turns it took. Negative: the episodes that reached this state did
    worse than the group's episodes on average. (N,) -> (N,).
    """
    n = scores.shape[0]
    groups = _codes(group_ids, n, "group_ids")
    trajs = _codes(traj_ids, n, "traj_ids")
    _codes(state_keys, n, "state_keys")
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


def fit_value_head(
    features: Tensor, targets: Tensor, prior: Tensor | None = None, l2: float = 1e-2
) -> Tensor:
    """A linear value head ``V(s) = [x_s, 1] . w`` fitted to Monte-Carlo returns by ridge regression anchored at
    the previous head, so a warm-up's rounds accumulate what they saw (FORCE-style):

        w* = argmin_w (1/n) sum_i ([x_i, 1] . w - y_i)^2 + l2 * ||w - w0||^2
           = (X^T X / n + l2 I)^-1 (X^T y / n + l2 w0),    X = [features, 1],  w0 = prior (0 when None)

    Solved in float64. ``features`` (N, H), ``targets`` (N,), ``prior`` (H + 1,) -> ``w`` (H + 1,), no gradient.
    """
    if l2 <= 0:
        raise ValueError(f"l2 must be > 0 (it makes the system solvable for any N), got {l2}")
    x = torch.cat([features.detach().double(), features.new_ones(features.shape[0], 1).double()], dim=1)
    y = targets.detach().double()
    n, d = x.shape
    w0 = torch.zeros(d, dtype=torch.float64) if prior is None else prior.detach().double()
    if w0.shape != (d,):
        raise ValueError(f"prior must be (H + 1,) = ({d},) for features (N, {d - 1}), got {tuple(w0.shape)}")
    lhs = x.T @ x / max(n, 1) + l2 * torch.eye(d, dtype=torch.float64)
    return torch.linalg.solve(lhs, x.T @ y / max(n, 1) + l2 * w0)


def head_values(features: Tensor, weights: Tensor) -> Tensor:
    """The head's value of each state, ``[x_i, 1] . w``: (N, H), (H + 1,) -> (N,) float64."""
    return features.detach().double() @ weights[:-1].double() + weights[-1].double()


def relative_to_start(values: Tensor, group_ids: Ids, turns: Sequence[int]) -> Tensor:
    """Each row's state value relative to its group's start: ``v_i - mean of v over group g's rows at its first
    turn``. With Monte-Carlo values the start's is the group's mean return (:func:`state_values`); with a
    learned head, negative says the head expects less from this state than from the task's first one. (N,) ->
    (N,)."""
    n = values.shape[0]
    groups = _codes(group_ids, n, "group_ids")
    first: dict[Hashable, int] = {}
    for g, t in zip(groups, turns, strict=True):
        first[g] = min(first.get(g, int(t)), int(t))
    start: dict[Hashable, list[float]] = {}
    for g, t, v in zip(groups, turns, values.tolist(), strict=True):
        if int(t) == first[g]:
            start.setdefault(g, []).append(v)
    base = torch.tensor([sum(start[g]) / len(start[g]) for g in groups], dtype=values.dtype)
    return values.detach() - base
