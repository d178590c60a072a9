"""Policy losses (PPO clip, SDAR's gated distillation, ungated OPSD, KL penalties) and the methods built on them.

SDAR (the SDAR paper, Self-Distilled Agentic RL) trains with ``L = L_GRPO + lambda * L_SDAR``: GRPO's clipped
policy gradient plus on-policy self-distillation toward a teacher that is the same policy given retrieved skills,
gated per token by ``sigmoid(beta * (q_t - s_t))`` so only tokens the teacher prefers are pulled. The methods at
the bottom compose these losses and register under their config names; the trainer reaches them only through
:func:`sdarflow.algo.registry.method_loss`.

All tensors are (B, T) (one row per agent turn, T response tokens); every loss reduces through
:func:`sdarflow.algo.agg.agg_loss` and returns ``(loss, metrics)`` with python-float, namespaced metrics.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from sdarflow.algo.advantages import rlsd_advantages, rlsd_weights
from sdarflow.algo.agg import AggMode, agg_loss, masked_mean_value
from sdarflow.algo.registry import METHOD_REGISTRY, MethodInputs, Metrics, UnknownNameError, register_method

# exp of a log-ratio beyond this overflows or underflows float32 and poisons the batch (verl uses the same bound).
_LOG_RATIO_CLAMP = 20.0


def ppo_clip_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    agg: AggMode | str = "token-mean",
) -> tuple[Tensor, Metrics]:
    """PPO's clipped surrogate (arXiv:1707.06347), as GRPO uses it.

    Args:
        logprobs: (B, T) current policy ``log pi_theta(y_t)``; carries the gradient.
        old_logprobs: (B, T) rollout-time log-probs (constant).
        advantages: (B, T) per-token advantages (constant).
        mask: (B, T) bool or 0/1.
        clip_low, clip_high: ratio trust region ``[1 - clip_low, 1 + clip_high]`` (asymmetric allows DAPO's
            clip-higher).
    Returns:
        ``agg(max(-A * r, -A * clip(r, 1 - clip_low, 1 + clip_high)))`` with ``r = exp(logprobs - old_logprobs)``,
        and metrics ``actor/clipfrac`` (share of tokens where the clipped term is the active one),
        ``actor/ppo_kl`` (masked mean of ``old - new``) and ``actor/ratio_mean``.
    """
    log_ratio = (logprobs - old_logprobs.detach()).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    adv = advantages.detach()
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = agg_loss(torch.maximum(unclipped, clipped), mask, agg)
    metrics = {
        "actor/clipfrac": masked_mean_value((clipped > unclipped).float(), mask),
        "actor/ppo_kl": masked_mean_value(-log_ratio, mask),
        "actor/ratio_mean": masked_mean_value(ratio, mask),
    }
    return loss, metrics


def sdar_gate(student_logprobs: Tensor, teacher_logprobs: Tensor, beta: float = 5.0) -> Tensor:
    """SDAR's per-token gate, (B, T) in (0, 1): ``g_t = sigmoid(beta * (q_t - s_t))``, detached.

    ``beta = 0`` gives 0.5 everywhere (uniform, ungated distillation up to a factor); large beta approaches a hard
    "teacher prefers this token" indicator.
    """
    delta = (teacher_logprobs - student_logprobs).detach()
    return torch.sigmoid(beta * delta)


def _distill_loss(
    student_logprobs: Tensor,
    teacher_logprobs: Tensor,
    mask: Tensor,
    gate: Tensor,
    agg: AggMode | str,
) -> tuple[Tensor, Metrics]:
    """``agg(g_t * (q_t - s_t))`` with g and q constant, so ``d/ds_t = -g_t`` times the aggregation weight."""
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


def sdar_loss(
    student_logprobs: Tensor,
    teacher_logprobs: Tensor,
    mask: Tensor,
    beta: float = 5.0,
    agg: AggMode | str = "token-mean",
) -> tuple[Tensor, Metrics]:
    """SDAR's gated on-policy self-distillation loss (the SDAR paper).

    Args:
        student_logprobs: (B, T) ``s_t = log pi_theta(y_t | history)``; the only input that carries gradient.
        teacher_logprobs: (B, T) ``q_t = log pi_theta(y_t | history + skills)``; treated as a constant.
        mask: (B, T) bool or 0/1.
        beta: gate sharpness (paper default 5).
    Returns:
        ``agg(g_t * (q_t - s_t))`` with ``g_t = sigmoid(beta * (q_t - s_t))`` detached, so the gradient is
        ``-g_t * grad log pi(y_t)``: tokens the teacher prefers are pulled up, the rest barely touched. Metrics:
        ``sdar/gate_mean``, ``sdar/gate_active_ratio`` (share of tokens with g > 0.5), ``sdar/teacher_gap_mean``
        (masked mean of ``q - s``), ``sdar/loss``.
    """
    gate = sdar_gate(student_logprobs, teacher_logprobs, beta)
    return _distill_loss(student_logprobs, teacher_logprobs, mask, gate, agg)


def opsd_loss(
    student_logprobs: Tensor,
    teacher_logprobs: Tensor,
    mask: Tensor,
    agg: AggMode | str = "token-mean",
) -> tuple[Tensor, Metrics]:
    """Ungated on-policy self-distillation: :func:`sdar_loss` with ``g_t = 1``, i.e. ``agg(q_t - s_t)``.

    Same shapes and metric names as :func:`sdar_loss` (``sdar/gate_mean`` is 1), so runs compare on one chart.
    """
    gate = torch.ones_like(student_logprobs.detach())
    return _distill_loss(student_logprobs, teacher_logprobs, mask, gate, agg)


KlKind = Literal["kl", "abs", "mse", "low_var_kl", "k1", "k2", "k3"]
_KL_ALIASES = {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}
KL_KINDS: tuple[str, ...] = ("kl", "abs", "mse", "low_var_kl", *_KL_ALIASES)


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, kind: KlKind | str = "low_var_kl") -> Tensor:
    """Per-token KL estimate between the policy and a reference, (B, T) -> (B, T) (Schulman's k1/k2/k3).

    With ``d = logprobs - ref_logprobs``:
        ``kl`` (k1): ``d``; ``abs``: ``|d|``; ``mse`` (k2): ``0.5 * d^2``;
        ``low_var_kl`` (k3): ``exp(-d) - (-d) - 1``, non-negative and unbiased, with ``-d`` clamped to [-20, 20]
        and the result to [-10, 10] as verl does, because one outlier token can otherwise dominate the batch.
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


# ---------------------------------------------------------------------------------------------------------------
# Methods: config name -> composed loss. Each returns (scalar loss, metrics with loss/total and loss/pg, loss/aux
# where the method has that term). loss/aux is the *unweighted* auxiliary loss; loss/total = pg + lam * aux.
# ---------------------------------------------------------------------------------------------------------------


def _teacher(x: MethodInputs, method: str) -> Tensor:
    if x.teacher_logprobs is None:
        raise ValueError(f"method {method!r} distills from the teacher: teacher_logprobs must be given")
    return x.teacher_logprobs


def _pg(x: MethodInputs, advantages: Tensor) -> tuple[Tensor, Metrics]:
    return ppo_clip_loss(x.logprobs, x.old_logprobs, advantages, x.mask, x.clip_low, x.clip_high, x.agg)


def _combine(
    metrics: Metrics, pg: Tensor | None = None, aux: Tensor | None = None, lam: float = 1.0
) -> tuple[Tensor, Metrics]:
    """``pg + lam * aux`` over the terms a method has, with the ``loss/*`` metrics added."""
    terms = []
    if pg is not None:
        terms.append(pg)
        metrics["loss/pg"] = float(pg.detach())
    if aux is not None:
        terms.append(lam * aux)
        metrics["loss/aux"] = float(aux.detach())
    total = sum(terms[1:], terms[0])
    metrics["loss/total"] = float(total.detach())
    return total, metrics


@register_method("grpo")
def _grpo(x: MethodInputs) -> tuple[Tensor, Metrics]:
    """GRPO: PPO clip on group-relative advantages; no critic, no distillation."""
    pg, m = _pg(x, x.advantages)
    return _combine(m, pg=pg)


@register_method("opsd")
def _opsd(x: MethodInputs) -> tuple[Tensor, Metrics]:
    """OPSD alone: the ungated distillation loss with weight 1, no policy-gradient term."""
    aux, m = opsd_loss(x.logprobs, _teacher(x, "opsd"), x.mask, x.agg)
    return _combine(m, aux=aux)


@register_method("grpo_opsd")
def _grpo_opsd(x: MethodInputs) -> tuple[Tensor, Metrics]:
    """Naive GRPO + OPSD: ``L_GRPO + lam * OPSD`` with no gate (every token distilled alike)."""
    pg, m = _pg(x, x.advantages)
    aux, m_aux = opsd_loss(x.logprobs, _teacher(x, "grpo_opsd"), x.mask, x.agg)
    return _combine(m | m_aux, pg=pg, aux=aux, lam=x.lam)


@register_method("rlsd")
def _rlsd(x: MethodInputs) -> tuple[Tensor, Metrics]:
    """RLSD: GRPO whose per-token advantages are re-weighted by the teacher gap; no auxiliary loss."""
    teacher = _teacher(x, "rlsd")
    adv = rlsd_advantages(x.advantages, x.logprobs, teacher, x.mask, x.rlsd_lam, x.rlsd_clip_eps)
    pg, m = _pg(x, adv)
    w = rlsd_weights(x.advantages, x.logprobs, teacher, x.rlsd_lam, x.rlsd_clip_eps)
    m["rlsd/weight_mean"] = masked_mean_value(w, x.mask)
    return _combine(m, pg=pg)


@register_method("skill_sd")
def _skill_sd(x: MethodInputs) -> tuple[Tensor, Metrics]:
    """Skill-SD: ``L_GRPO + lam * ungated distillation``.

    Identical loss form to ``grpo_opsd``; the difference is upstream (teacher context = retrieved skills). Kept
    as its own name so experiment configs and reports match the paper's baselines.
    """
    pg, m = _pg(x, x.advantages)
    aux, m_aux = opsd_loss(x.logprobs, _teacher(x, "skill_sd"), x.mask, x.agg)
    return _combine(m | m_aux, pg=pg, aux=aux, lam=x.lam)


@register_method("sdar")
def _sdar(x: MethodInputs) -> tuple[Tensor, Metrics]:
    """SDAR: ``L_GRPO + lam * L_SDAR`` with the sigmoid gate (paper defaults lam 0.01, beta 5)."""
    pg, m = _pg(x, x.advantages)
    aux, m_aux = sdar_loss(x.logprobs, _teacher(x, "sdar"), x.mask, x.beta, x.agg)
    return _combine(m | m_aux, pg=pg, aux=aux, lam=x.lam)


METHODS: tuple[str, ...] = METHOD_REGISTRY.names()
