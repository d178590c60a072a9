"""Advantage estimators: GRPO's group-relative advantage as verl-agent computes it for multi-turn agents, the
invalid-action penalty on its scores, and RLSD's teacher re-weighting with its decaying weight.

GRPO (DeepSeekMath, arXiv:2402.03300) needs no critic: a turn row's advantage is its score standardised within its
group (all rollouts of one task in one round). The SDAR reference (ZJU-REAL/SDAR, a verl-agent fork) scores every
turn row with its episode's return minus an invalid-action penalty and takes a group's statistics over its rows
(``compute_grpo_outcome_advantage`` in ``verl/trainer/ppo/core_algos.py``, ``compute_mean_std_cross_steps=True``).
Advantages carry no gradient.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch
from torch import Tensor

Ids = Tensor | Sequence[Hashable]


def codes(ids: Ids, n: int, name: str) -> list[Hashable]:
    """``ids`` as a list of N hashables; ValueError naming ``name`` when it is not (N,)."""
    values = ids.tolist() if isinstance(ids, Tensor) else list(ids)
    if len(values) != n or (isinstance(ids, Tensor) and ids.dim() != 1):
        shape = tuple(ids.shape) if isinstance(ids, Tensor) else (len(values),)
        raise ValueError(f"{name} must be (N,) with N = {n} like the scores, got {shape}")
    return values


def grpo_advantages(
    scores: Tensor,
    group_ids: Ids,
    norm_by_std: bool = True,
    eps: float = 1e-6,
    traj_ids: Ids | None = None,
) -> Tensor:
    """Group-relative advantages, one per row.

    Args:
        scores: (N,) float, one score per row (a turn row carries its episode's penalized return).
        group_ids: (N,) group of each row: a tensor or a list of hashables (strings); any order.
        norm_by_std: divide by the group's standard deviation (GRPO); False gives Dr. GRPO's ``s - mean``.
        eps: added to the std so a group of identical scores gives 0, not NaN.
        traj_ids: (N,) episode of each row. None: every row is a sample of its group (verl-agent's default,
            ``compute_mean_std_cross_steps=True``, so long episodes weigh more in the statistics). Given: each
            (group, episode) pair is one sample, scored by the mean of its rows' scores, and every row of it gets
            that sample's advantage (episode-level GRPO). verl-agent's ``compute_mean_std_cross_steps=False``
            counts each episode's first row instead but standardises every row with its own score, which divides
            a per-turn penalty by ``eps`` where a group's episodes tie (advantages near 1e5 for a 0.1 penalty,
            measured in a learning check); here an episode's rows never differ.
    Returns:
        (N,) ``A = (x - mean_g) / (std_g + eps)`` with ``x`` the row's sample score (its own, or its episode's
        mean), ``mean_g`` and ``std_g`` (unbiased, n - 1) over the samples of its group. A group of one sample gets
        mean 0 and std 1, so it keeps ``x / (1 + eps)``, as the reference does.
    """
    if scores.dim() != 1:
        raise ValueError(f"scores must be (N,), got {tuple(scores.shape)}")
    n = scores.shape[0]
    s = scores.detach()
    groups = codes(group_ids, n, "group_ids")
    keys = list(enumerate(groups)) if traj_ids is None else list(zip(groups, codes(traj_ids, n, "traj_ids")))
    first: dict = {}  # sample -> its first row, whose group is the sample's
    for row, key in enumerate(keys):
        first.setdefault(key, row)
    sample_of = {k: i for i, k in enumerate(first)}
    row_sample = torch.tensor([sample_of[k] for k in keys], dtype=torch.long, device=s.device)  # (N,)
    index = {g: i for i, g in enumerate(dict.fromkeys(groups))}
    inv = torch.tensor([index[groups[r]] for r in first.values()], dtype=torch.long, device=s.device)  # (S,)
    ones = torch.ones(n, dtype=s.dtype, device=s.device)
    per_sample = torch.zeros(len(sample_of), dtype=s.dtype, device=s.device)
    x = per_sample.index_add(0, row_sample, s) / per_sample.index_add(
        0, row_sample, ones
    )  # (S,) sample scores
    zeros = torch.zeros(len(index), dtype=s.dtype, device=s.device)
    count = zeros.index_add(0, inv, torch.ones_like(x))  # (G,) samples per group
    mean = zeros.index_add(0, inv, x) / count
    sq = zeros.index_add(0, inv, (x - mean[inv]).square())
    std = (sq / (count - 1).clamp(min=1)).sqrt()
    single = count == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    centered = x - mean[inv]
    advantage = centered / (std[inv] + eps) if norm_by_std else centered
    return advantage[row_sample]


def episode_length_scale(tokens: Tensor, group_ids: Ids, traj_ids: Ids) -> Tensor:
    """Per-row advantage multiplier that makes every episode weigh the same in a token-mean policy gradient.

    Under token-mean aggregation a turn row of episode e contributes ``A_e`` on each of its tokens, so episode e
    weighs ``A_e * N_e`` with ``N_e`` its response tokens over all its turns: in a multi-turn group where failed
    episodes run longer, the negative advantages outweigh the positive ones (the group's token-weighted
    advantage is below 0 although its episode advantages sum to 0), and the update lowers the probability of
    what was sampled on net. Scaling each row's advantage by

        ``c_row = Nbar_g / N_e``,  ``Nbar_g`` = the mean of ``N_e`` over the episodes of the row's group g

    gives every episode the weight ``A_e * Nbar_g``: the GRPO objective's ``1/|o_i|`` (DeepSeekMath,
    arXiv:2402.03300, eq. 3) with the whole episode as the output ``o_i``, at the token-mean's scale.

    Args:
        tokens: (N,) response tokens of each row (a turn); rows of one episode sum to ``N_e``.
        group_ids: (N,) group of each row; traj_ids: (N,) episode of each row (an episode is a (group, traj) pair).
    Returns:
        (N,) float ``c_row``; 0 for the rows of an episode without response tokens (they train nothing), which
        also leave ``Nbar_g``.
    """
    if tokens.dim() != 1:
        raise ValueError(f"tokens must be (N,), got {tuple(tokens.shape)}")
    n = tokens.shape[0]
    if bool((tokens < 0).any()):
        raise ValueError("tokens must be >= 0")
    pairs = list(zip(codes(group_ids, n, "group_ids"), codes(traj_ids, n, "traj_ids"), strict=True))
    t = tokens.detach().to(torch.float64)
    episode_tokens: dict = {}
    for pair, count in zip(pairs, t.tolist(), strict=True):
        episode_tokens[pair] = episode_tokens.get(pair, 0.0) + count
    lengths: dict = {}  # group -> the token counts of its episodes that have any
    for (group, _), count in episode_tokens.items():
        if count > 0:
            lengths.setdefault(group, []).append(count)
    scale = [
        sum(lengths[g]) / len(lengths[g]) / episode_tokens[(g, e)] if episode_tokens[(g, e)] > 0 else 0.0
        for g, e in pairs
    ]
    return torch.tensor(scale, dtype=torch.float32, device=tokens.device)


def penalized_scores(episode_returns: Tensor, format_ok: Tensor, coef: float) -> Tensor:
    """Per-row GRPO scores with the invalid-action penalty: ``R_ep - coef * (1 - format_ok)``, (N,) -> (N,), as
    verl-agent's ``apply_invalid_action_penalty`` (``verl/trainer/ppo/ray_trainer.py``); the reference scripts use
    coef 0.1 (ALFWorld, WebShop) and 0.01 (search)."""
    if episode_returns.shape != format_ok.shape:
        raise ValueError(
            f"episode_returns {tuple(episode_returns.shape)} and format_ok {tuple(format_ok.shape)} must match"
        )
    return episode_returns - coef * (1.0 - format_ok.to(episode_returns.dtype))


def broadcast_advantages(advantages: Tensor, mask: Tensor) -> Tensor:
    """Per-row advantages to per-token ones: (B,) x (B, T) -> (B, T), ``A_b * m_bt`` (0 on masked tokens)."""
    if advantages.dim() != 1 or mask.dim() != 2 or advantages.shape[0] != mask.shape[0]:
        raise ValueError(
            f"need advantages (B,) and mask (B, T), got {tuple(advantages.shape)}, {tuple(mask.shape)}"
        )
    return advantages.detach()[:, None] * mask.to(advantages.dtype)


def rlsd_lambda(step: int, lam0: float, warmdown_steps: int) -> float:
    """RLSD's mixing weight at RL step ``step``: ``lam0 * max(0, 1 - step / warmdown_steps)``, a linear decay to 0
    (100 steps in the reference scripts, ``RLSDRayTrainer._get_rlsd_lambda`` in
    ``verl/trainer/ppo/rlsd_ray_trainer.py``; its first training step is 1); ``warmdown_steps <= 0``: no decay."""
    if warmdown_steps <= 0:
        return lam0
    return lam0 * max(0.0, 1.0 - step / warmdown_steps)


def rlsd_weights(
    advantages: Tensor,
    student_logprobs: Tensor,
    teacher_logprobs: Tensor,
    lam: float,
    clip_eps: float,
) -> Tensor:
    """RLSD's per-token advantage multiplier, (B, T) in [1 - lam*clip_eps, 1 + lam*clip_eps].

    ``w_t = (1 - lam) + lam * clip(exp(sign(A_t) * delta_t), 1 - clip_eps, 1 + clip_eps)``, with the teacher gap
    ``delta_t = q_t - s_t`` detached: a token the teacher likes more than the student gets a larger push when
    A > 0 and a smaller penalty when A < 0. The reference passes the rollout-time (old) log-probs as ``s_t``.
    """
    delta = (teacher_logprobs - student_logprobs).detach()
    # exp overflows to inf for large gaps; the clip turns inf into 1 + clip_eps, so no NaN can appear.
    scale = torch.exp(torch.sign(advantages.detach()) * delta).clamp(1.0 - clip_eps, 1.0 + clip_eps)
    return (1.0 - lam) + lam * scale


def rlsd_advantages(
    advantages: Tensor,
    student_logprobs: Tensor,
    teacher_logprobs: Tensor,
    mask: Tensor,
    lam: float,
    clip_eps: float,
) -> Tensor:
    """RLSD advantages: ``A_t * w_t`` (see :func:`rlsd_weights`) on response tokens, 0 on masked ones; all (B, T),
    the result detached (``compute_rlsd_token_advantage`` in ``verl/trainer/ppo/rlsd_utils.py``)."""
    a = advantages.detach()
    w = rlsd_weights(a, student_logprobs, teacher_logprobs, lam, clip_eps)
    # where, not multiply: padded log-probs may be -inf, and (-inf) - (-inf) is NaN.
    return torch.where(mask.bool(), a * w, torch.zeros_like(a))
