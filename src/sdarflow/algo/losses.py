"""Policy loss terms: dual-clip PPO, SDAR's gated distillation, Skill-SD's self-distillation loss, KL penalties.

SDAR (the SDAR paper, Self-Distilled Agentic RL) trains with ``L = L_GRPO + lambda * L_SDAR``: GRPO's clipped
policy gradient plus on-policy self-distillation toward a teacher that is the same policy given retrieved skills,
gated per token by ``sigmoid(beta * (q_t - s_t))`` so only tokens the teacher prefers are pulled. The methods
composing these terms as the SDAR reference code (ZJU-REAL/SDAR, a verl-agent fork) trains each baseline are in
:mod:`sdarflow.algo.objective`.

All tensors are (B, T) (one row per agent turn, T response tokens; masks bool or 0/1); every loss reduces through
:func:`sdarflow.algo.agg.agg_loss` and returns ``(loss, metrics)`` with python-float, namespaced metrics.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from sdarflow.algo.agg import AggMode, agg_loss, masked_mean_value
from sdarflow.names import UnknownNameError

Metrics = dict[str, float]

# exp of a log-ratio beyond this overflows float32; the KL and Skill-SD terms clamp there as verl does.
_LOG_RATIO_CLAMP = 20.0


def ppo_clip_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float,
    clip_high: float,
    agg: AggMode | str,
    clip_ratio_c: float | None,
) -> tuple[Tensor, Metrics]:
    """PPO's clipped surrogate (arXiv:1707.06347) with dual clip for negative advantages (arXiv:1912.09729).

    verl's ``compute_policy_loss`` (``verl/trainer/ppo/core_algos.py``), as the SDAR reference trains every method.
    ``logprobs`` carries the gradient; the rollout-time ``old_logprobs`` and ``advantages`` are constants. The trust
    region is ``[1 - clip_low, 1 + clip_high]`` (asymmetric allows DAPO's clip-higher); ``clip_ratio_c`` is the
    dual-clip bound ``c > 1``, None turns the dual clip off.

    Returns:
        ``agg(L_t)`` with ``r = exp(logprobs - old_logprobs)`` (not clamped, as in the reference),
        ``L1 = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))`` and ``L_t = min(L1, -A c)`` where ``A < 0``,
        else ``L1``. Metrics: ``actor/clipfrac`` (share of tokens where the clipped term is the larger one),
        ``actor/clipfrac_lower`` (share where the dual clip is active), ``actor/ppo_kl`` (masked mean of
        ``old - new``, verl's; k1, negative on a batch where the update raised the sampled tokens),
        ``actor/approx_kl`` (masked mean of k3, ``r - 1 - log r``: the same KL(old || new) estimate but never
        negative, Schulman's "Approximating KL Divergence" as Stable-Baselines3's PPO early stop reads it) and
        ``actor/ratio_mean``.
    """
    if clip_ratio_c is not None and clip_ratio_c <= 1.0:
        raise ValueError(
            f"clip_ratio_c ({clip_ratio_c}) must be > 1: it bounds -A * ratio for A < 0, or None"
        )
    log_ratio = logprobs - old_logprobs.detach()
    ratio = torch.exp(log_ratio)
    adv = advantages.detach()
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss_mat = torch.maximum(unclipped, clipped)
    lower = torch.zeros_like(adv, dtype=torch.bool)
    if clip_ratio_c is not None:
        dual = -adv * clip_ratio_c
        lower = (adv < 0) & (loss_mat > dual)
        loss_mat = torch.where(adv < 0, torch.minimum(loss_mat, dual), loss_mat)
    loss = agg_loss(loss_mat, mask, agg)
    metrics = {
        "actor/clipfrac": masked_mean_value((clipped > unclipped).float(), mask),
        "actor/clipfrac_lower": masked_mean_value(lower.float(), mask),
        "actor/ppo_kl": masked_mean_value(-log_ratio, mask),
        "actor/approx_kl": masked_mean_value(kl_penalty(old_logprobs.detach(), logprobs.detach()), mask),
        "actor/ratio_mean": masked_mean_value(ratio, mask),
    }
    return loss, metrics


def sdar_gate(student_logprobs: Tensor, teacher_logprobs: Tensor, beta: float) -> Tensor:
    """SDAR's per-token gate, (B, T) in (0, 1): ``g_t = sigmoid(beta * (q_t - s_t))``, detached.

    ``beta = 0`` gives 0.5 everywhere (naive GRPO+OPSD: every token distilled alike); large beta approaches a
    hard "teacher prefers this token" indicator.
    """
    delta = (teacher_logprobs - student_logprobs).detach()
    return torch.sigmoid(beta * delta)


def sdar_loss(
    student_logprobs: Tensor,
    teacher_logprobs: Tensor,
    mask: Tensor,
    beta: float,
    agg: AggMode | str = "token-mean",
) -> tuple[Tensor, Metrics]:
    """SDAR's gated on-policy self-distillation loss (the SDAR paper; ``compute_sdar_loss`` in
    ``verl/trainer/ppo/sdar_utils.py``).

    Args:
        student_logprobs: (B, T) ``s_t = log pi_theta(y_t | history)``; the only input that carries gradient.
        teacher_logprobs: (B, T) ``q_t = log pi_theta(y_t | history + skills)``; treated as a constant.
        beta: gate sharpness (the paper's beta; ``gate_beta`` in the config).
    Returns:
        ``agg(g_t * (q_t - s_t))`` with ``g_t = sigmoid(beta * (q_t - s_t))`` detached, so the gradient is
        ``-g_t * grad log pi(y_t)``: tokens the teacher prefers are pulled up, the rest barely touched. Metrics:
        ``sdar/gate_mean``, ``sdar/gate_active_ratio`` (share of tokens with g > 0.5), ``sdar/teacher_gap_mean``
        (masked mean of ``q - s``), ``sdar/loss``.
    """
    gate = sdar_gate(student_logprobs, teacher_logprobs, beta)
    q = teacher_logprobs.detach()
    delta = q - student_logprobs.detach()
    loss = agg_loss(gate * (q - student_logprobs), mask, agg)
    metrics = {
        "sdar/gate_mean": masked_mean_value(gate, mask),
        "sdar/gate_active_ratio": masked_mean_value((gate > 0.5).float(), mask),
        "sdar/teacher_gap_mean": masked_mean_value(delta, mask),
        "sdar/loss": float(loss.detach()),
    }
    return loss, metrics


def skill_sd_loss(
    student_logprobs: Tensor,
    teacher_logprobs: Tensor,
    old_logprobs: Tensor,
    mask: Tensor,
    agg: AggMode | str = "token-mean",
) -> tuple[Tensor, Metrics]:
    """Skill-SD's self-distillation loss (SDL): an importance-weighted k3 estimate of KL(student || teacher).

    ``compute_sdl_loss`` in ``verl/trainer/ppo/skillsd_utils.py``. With ``l_t = s_t - q_t``:
        ``k3_t = exp(min(-l_t, 20)) - 1 + l_t`` (>= 0, zero where student and teacher agree),
        ``rho_t = exp(min(s_t - old_t, 10))`` (the on-policy ratio, *not* detached),
        loss ``agg(rho_t * k3_t)``.

    ``s_t`` carries the gradient (through both ``k3`` and ``rho``), ``q_t`` and the rollout-time ``old_t`` are
    constants. Its gradient ``rho * (k3 + 1 - exp(-l))`` pulls ``s`` toward ``q`` from above and below. Metrics:
    ``skill_sd/k3_mean``, ``skill_sd/rho_mean``, ``skill_sd/loss``.
    """
    ell = student_logprobs - teacher_logprobs.detach()
    k3 = torch.exp((-ell).clamp(max=_LOG_RATIO_CLAMP)) - 1.0 + ell
    rho = torch.exp((student_logprobs - old_logprobs.detach()).clamp(max=10.0))
    loss = agg_loss(rho * k3, mask, agg)
    metrics = {
        "skill_sd/k3_mean": masked_mean_value(k3, mask),
        "skill_sd/rho_mean": masked_mean_value(rho, mask),
        "skill_sd/loss": float(loss.detach()),
    }
    return loss, metrics


KlKind = Literal["kl", "abs", "mse", "low_var_kl", "k1", "k2", "k3"]
_KL_ALIASES = {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}
KL_KINDS: tuple[str, ...] = ("kl", "abs", "mse", "low_var_kl", *_KL_ALIASES)


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, kind: KlKind | str = "low_var_kl") -> Tensor:
    """Per-token KL estimate between the policy and a reference, (B, T) -> (B, T) (Schulman's k1/k2/k3).

    With ``d = logprobs - ref_logprobs``:
        ``kl`` (k1): ``d``; ``abs``: ``|d|``; ``mse`` (k2): ``0.5 * d^2``;
        ``low_var_kl`` (k3): ``exp(-d) - (-d) - 1``, non-negative and unbiased, clamped to [-10, 10] as verl's
        ``kl_penalty`` (``verl/trainer/ppo/core_algos.py``) does, because one outlier token can otherwise dominate
        the batch. ``-d`` is also clamped to [-20, 20]: the values stay verl's (k3 already exceeds 10 there), but
        an ``exp`` overflowing to inf would turn the clamped token's zero gradient into NaN.
    Not aggregated: pass the result to :func:`sdarflow.algo.agg.agg_loss`.
    """
    name = _KL_ALIASES.get(kind, kind)
    if name not in KL_KINDS:
        raise UnknownNameError("kl penalty", kind, KL_KINDS)
    diff = logprobs - ref_logprobs
    if name == "kl":
        return diff
    if name == "abs":
        return diff.abs()
    if name == "mse":
        return 0.5 * diff.square()
    log_ratio = (-diff).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)  # ref - logprobs
    return (torch.exp(log_ratio) - log_ratio - 1.0).clamp(-10.0, 10.0)
