"""Advantage estimators: GRPO's group-relative advantage, its per-token broadcast, and RLSD's teacher re-weighting.

GRPO (DeepSeekMath, arXiv:2402.03300) needs no critic: an episode's advantage is its reward standardised within
its group (all rollouts of one task in one round). RLSD re-weights that advantage per token by how much the
teacher (the same policy with privileged context) prefers the sampled token, as benchmarked in the SDAR paper.
Advantages carry no gradient.
"""

from __future__ import annotations

import torch
from torch import Tensor


def grpo_advantages(
    rewards: Tensor, group_ids: Tensor, norm_by_std: bool = True, eps: float = 1e-6
) -> Tensor:
    """Group-relative advantages, one per episode.

    Args:
        rewards: (N,) float, one scalar per episode.
        group_ids: (N,) integer group index per episode (any values; need not be contiguous or sorted).
        norm_by_std: divide by the group's standard deviation (GRPO); False gives Dr. GRPO's ``r - mean``.
        eps: added to the std so a group of identical rewards gives 0, not NaN.
    Returns:
        (N,) ``A_i = (r_i - mean_g) / (std_g + eps)`` with ``std_g`` the *unbiased* (n - 1) standard deviation,
        as ``torch.std`` and verl compute it. A group of size 1 gets advantage 0 (nothing to compare against).
    """
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_ids must both be (N,), got {tuple(rewards.shape)} and {tuple(group_ids.shape)}"
        )
    r = rewards.detach()
    _, inv, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    n = counts.to(r.dtype)  # (G,)
    mean = torch.zeros_like(n).index_add_(0, inv, r) / n
    centered = r - mean[inv]  # (N,); exactly 0 for a singleton group
    if not norm_by_std:
        return centered
    sq = torch.zeros_like(n).index_add_(0, inv, centered.square())
    std = (
        sq / (n - 1).clamp(min=1)
    ).sqrt()  # clamp: singleton groups have no spread, and centered is 0 there
    return centered / (std[inv] + eps)


def broadcast_advantages(advantages: Tensor, mask: Tensor) -> Tensor:
    """Per-episode advantages to per-token ones: (B,) x (B, T) -> (B, T), ``A_b * m_bt`` (0 on masked tokens)."""
    if advantages.dim() != 1 or mask.dim() != 2 or advantages.shape[0] != mask.shape[0]:
        raise ValueError(
            f"need advantages (B,) and mask (B, T), got {tuple(advantages.shape)}, {tuple(mask.shape)}"
        )
    return advantages.detach()[:, None] * mask.to(advantages.dtype)


def rlsd_weights(
    advantages: Tensor,
    student_logprobs: Tensor,
    teacher_logprobs: Tensor,
    lam: float = 0.5,
    clip_eps: float = 0.2,
) -> Tensor:
    """RLSD's per-token advantage multiplier, (B, T) in [1 - lam*clip_eps, 1 + lam*clip_eps].

    ``w_t = (1 - lam) + lam * clip(exp(sign(A_t) * delta_t), 1 - clip_eps, 1 + clip_eps)``, with the teacher gap
    ``delta_t = q_t - s_t`` detached: a token the teacher likes more than the student gets a larger push when
    A > 0 and a smaller penalty when A < 0.
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
    lam: float = 0.5,
    clip_eps: float = 0.2,
) -> Tensor:
    """RLSD advantages: ``A_t * w_t`` (see :func:`rlsd_weights`) on response tokens, 0 on masked ones.

    Args:
        advantages: (B, T) per-token advantages (the episode's GRPO advantage broadcast over its tokens).
        student_logprobs, teacher_logprobs: (B, T) ``s_t`` and ``q_t``; both treated as constants.
        mask: (B, T) bool or 0/1.
        lam: mixing weight; 0 returns the advantages unchanged (on the mask).
        clip_eps: trust range of the teacher/student ratio.
    Returns:
        (B, T) detached advantages.
    """
    a = advantages.detach()
    w = rlsd_weights(a, student_logprobs, teacher_logprobs, lam, clip_eps)
    # where, not multiply: padded log-probs may be -inf, and (-inf) - (-inf) is NaN.
    return torch.where(mask.bool(), a * w, torch.zeros_like(a))
