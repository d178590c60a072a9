"""The training objective: the loss's settings (:class:`Objective`, the only place each is declared: the train
stage's config is one), the methods that compose the loss terms of :mod:`sdarflow.algo.losses` as the SDAR
reference trains each one, and :func:`method_loss`, the one entry point the trainer calls, with the config itself
(as verl's policy losses take the actor config). Symbols in the help are the SDAR paper's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from sdarflow.algo.advantages import rlsd_advantages, rlsd_lambda, rlsd_weights
from sdarflow.algo.agg import AGG_MODES, agg_loss, masked_mean_value
from sdarflow.algo.losses import (
    KL_KINDS,
    Metrics,
    kl_penalty,
    ppo_clip_loss,
    sdar_gate,
    sdar_loss,
    skill_sd_loss,
)
from sdarflow.config import opt
from sdarflow.names import NameRegistry

# A loss's named scalar terms, each with its weight applied (pg, aux = coef * L_aux, kl, entropy); the loss is their
# sum. Named so the trainer can measure each one's gradient (:func:`aux_grad_share`).
Terms = dict[str, Tensor]
# (logprobs, old_logprobs, teacher_logprobs, advantages, mask, cfg, step) -> (terms, metrics); tensors are (B, T).
MethodFn = Callable[[Tensor, Tensor, Tensor | None, Tensor, Tensor, "Objective", int], tuple[Terms, Metrics]]

METHOD_REGISTRY: NameRegistry[MethodFn] = NameRegistry("method")
register_method = METHOD_REGISTRY.register


# Methods: config name -> composed loss, as the SDAR reference's scripts train each one (examples/<method>_trainer).
# Each returns (terms, metrics with loss/pg and the *unweighted* loss/aux where the method has them); method_terms
# adds the KL and entropy terms to every method.


def _teacher(teacher: Tensor | None, method: str) -> Tensor:
    if teacher is None:
        raise ValueError(f"method {method!r} distills from the teacher: teacher_logprobs must be given")
    return teacher


def _pg(logp: Tensor, old: Tensor, adv: Tensor, mask: Tensor, cfg: Objective) -> tuple[Tensor, Metrics]:
    c = cfg.clip_ratio_c or None  # 0 turns the dual clip off
    return ppo_clip_loss(logp, old, adv, mask, cfg.clip_low, cfg.clip_high, cfg.agg, c)


def _combine(
    metrics: Metrics, pg: Tensor | None = None, aux: Tensor | None = None, coef: float = 1.0
) -> tuple[Terms, Metrics]:
    """The method's terms, ``{"pg": pg, "aux": coef * aux}`` over those it has, with the ``loss/*`` metrics."""
    terms: Terms = {}
    if pg is not None:
        terms["pg"] = pg
        metrics["loss/pg"] = float(pg.detach())
    if aux is not None:
        terms["aux"] = coef * aux
        metrics["loss/aux"] = float(aux.detach())
        metrics["loss/aux_coef"] = coef
    return terms, metrics  # method_terms adds the KL and entropy terms; method_loss records loss/total


@register_method("grpo")
def _grpo(logp, old, teacher, adv, mask, cfg, step):
    """GRPO: dual-clip PPO on group-relative advantages; no critic, no distillation."""
    pg, m = _pg(logp, old, adv, mask, cfg)
    return _combine(m, pg=pg)


@register_method("opsd")
def _opsd(logp, old, teacher, adv, mask, cfg, step):
    """OPSD: the gated distillation term alone, ``lambda * L_SDAR(beta)``; no policy gradient (the reference runs
    ``main_sdar`` with ``pg_loss_coef=0``, ``examples/opsd_trainer``)."""
    aux, m = sdar_loss(logp, _teacher(teacher, "opsd"), mask, cfg.gate_beta, cfg.agg)
    return _combine(m, aux=aux, coef=cfg.sdar_coef)


@register_method("grpo_opsd")
def _grpo_opsd(logp, old, teacher, adv, mask, cfg, step):
    """Naive GRPO + OPSD: ``L_GRPO + lambda * L_SDAR(beta=0)``, every token distilled with gate 0.5 (the reference
    runs ``main_sdar`` with ``gate_beta=0.0``, ``examples/grpo_opsd_trainer``)."""
    pg, m = _pg(logp, old, adv, mask, cfg)
    aux, m_aux = sdar_loss(logp, _teacher(teacher, "grpo_opsd"), mask, 0.0, cfg.agg)
    return _combine(m | m_aux, pg=pg, aux=aux, coef=cfg.sdar_coef)


@register_method("rlsd")
def _rlsd(logp, old, teacher, adv, mask, cfg, step):
    """RLSD: GRPO whose per-token advantages are re-weighted by the teacher's gap to the rollout log-probs, with
    the weight decaying to 0 over ``rlsd_warmdown_steps`` RL steps; no auxiliary loss."""
    teacher = _teacher(teacher, "rlsd")
    lam = rlsd_lambda(step, cfg.rlsd_lam, cfg.rlsd_warmdown_steps)
    pg, m = _pg(logp, old, rlsd_advantages(adv, old, teacher, mask, lam, cfg.rlsd_clip_eps), mask, cfg)
    m["rlsd/weight_mean"] = masked_mean_value(rlsd_weights(adv, old, teacher, lam, cfg.rlsd_clip_eps), mask)
    m["rlsd/lambda"] = lam
    return _combine(m, pg=pg)


@register_method("skill_sd")
def _skill_sd(logp, old, teacher, adv, mask, cfg, step):
    """Skill-SD: ``L_GRPO + skill_sd_coef * SDL`` (:func:`skill_sd_loss`; coefficient 0.001 in
    ``examples/skillsd_trainer``)."""
    pg, m = _pg(logp, old, adv, mask, cfg)
    aux, m_aux = skill_sd_loss(logp, _teacher(teacher, "skill_sd"), old, mask, cfg.agg)
    return _combine(m | m_aux, pg=pg, aux=aux, coef=cfg.skill_sd_coef)


@register_method("sdar")
def _sdar(logp, old, teacher, adv, mask, cfg, step):
    """SDAR: ``L_GRPO + lambda * L_SDAR`` with the sigmoid gate (paper: lambda 0.01, beta 5)."""
    pg, m = _pg(logp, old, adv, mask, cfg)
    aux, m_aux = sdar_loss(logp, _teacher(teacher, "sdar"), mask, cfg.gate_beta, cfg.agg)
    return _combine(m | m_aux, pg=pg, aux=aux, coef=cfg.sdar_coef)


METHODS: tuple[str, ...] = METHOD_REGISTRY.names()


@dataclass
class Objective:
    """The loss's settings; defaults are the SDAR paper's and its reference scripts' (``sdar_coef`` and
    ``gate_beta`` are ``algorithm.sdar.sdar_coef`` / ``gate_beta`` in ``examples/sdar_trainer``)."""

    method: str = opt(
        "sdar",
        "objective (docs/training.md): grpo; sdar = grpo + lambda * gated distillation; opsd = lambda * gated "
        "distillation alone; grpo_opsd = sdar with beta 0; rlsd = grpo with teacher-reweighted advantages; "
        "skill_sd = grpo + skill_sd_coef * SDL",
        choices=METHODS,
    )
    sdar_coef: float = opt(
        0.01, "lambda: weight of the gated distillation loss; paper 0.01 (0.1 lets it dominate)", ge=0
    )
    gate_beta: float = opt(
        5.0, "beta: gate sharpness, g = sigmoid(beta * (teacher - student)); paper 5, 0 = ungated", ge=0
    )
    clip_low: float = opt(0.2, "PPO ratio clip below 1", ge=0, le=1)
    clip_high: float = opt(0.2, "PPO ratio clip above 1", ge=0)
    clip_ratio_c: float = opt(
        3.0, "dual-clip PPO: for A < 0 the loss is at most -A * c; reference 3; 0 = off", ge=0
    )
    kl_coef: float | None = opt(
        None,
        "KL loss to the reference policy (base model; needs rescored ref_logprobs); unset = --preset's: 0.01 "
        "alfworld/webshop, 0.001 search",
        ge=0,
    )
    kl_kind: str = opt("low_var_kl", "KL estimator (reference: low_var_kl, Schulman's k3)", choices=KL_KINDS)
    entropy_coef: float = opt(
        0.001, "entropy bonus: loss - coef * agg(entropy); reference 0.001; 0 = off", ge=0
    )
    rlsd_lam: float = opt(
        0.5, "RLSD: initial share of the advantage re-weighted by the teacher gap", ge=0, le=1
    )
    rlsd_clip_eps: float = opt(0.2, "RLSD: clip of the re-weighting factor", ge=0)
    rlsd_warmdown_steps: int = opt(
        100,
        "RLSD: the share decays linearly to 0 over this many RL rounds (step = round + 1); 0 = no decay",
        ge=0,
    )
    skill_sd_coef: float = opt(0.001, "Skill-SD: weight of the self-distillation loss; reference 0.001", ge=0)
    agg: str = opt("token-mean", "loss aggregation", choices=AGG_MODES)


def method_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    teacher_logprobs: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    cfg: Objective,
    *,
    ref_logprobs: Tensor | None = None,
    entropy: Tensor | None = None,
    step: int = 1,
) -> tuple[Tensor, Metrics]:
    """The scalar training loss of ``cfg.method`` and its namespaced metrics (``loss/total``, ``loss/pg``, ...):
    the sum of :func:`method_terms`."""
    terms, metrics = method_terms(
        logprobs,
        old_logprobs,
        teacher_logprobs,
        advantages,
        mask,
        cfg,
        ref_logprobs=ref_logprobs,
        entropy=entropy,
        step=step,
    )
    return total_loss(terms, metrics), metrics


def total_loss(terms: Terms, metrics: Metrics) -> Tensor:
    """``sum(terms)``, recorded as ``metrics["loss/total"]``."""
    values = list(terms.values())
    loss = sum(values[1:], values[0])
    metrics["loss/total"] = float(loss.detach())
    return loss


def method_terms(
    logprobs: Tensor,
    old_logprobs: Tensor,
    teacher_logprobs: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    cfg: Objective,
    *,
    ref_logprobs: Tensor | None = None,
    entropy: Tensor | None = None,
    step: int = 1,
) -> tuple[Terms, Metrics]:
    """The weighted loss terms of ``cfg.method`` (:data:`Terms`: ``pg``, ``aux`` = coef * L_aux, where the method
    has them) and its namespaced metrics, with ``kl = kl_coef * agg(kl_penalty(logprobs, ref_logprobs, kl_kind))``
    whenever ``ref_logprobs`` is given (verl's ``use_kl_loss``; the presets' coefficients are the reference
    scripts') and ``entropy = -entropy_coef * agg(entropy)`` whenever ``entropy`` (the policy's per-token entropy,
    with gradient) is given (verl's actor: ``pg_loss - entropy_coeff * entropy``). The loss is their sum.

    All tensors are (B, T); ``logprobs`` and ``entropy`` carry the gradient, the others are constants. ``step`` is
    the RL step (the reference's ``global_steps``, 1 for the first update), which RLSD's decaying weight reads.
    With a teacher, every method's metrics carry the gate diagnostics (what the gate is at ``gate_beta``), so a
    GRPO run also shows whether the teacher is informative. Raises :class:`UnknownNameError` for an unregistered
    method and ``ValueError`` for mismatched shapes, a missing teacher, or ``kl_coef > 0`` without reference
    log-probs."""
    fn = METHOD_REGISTRY.get(cfg.method)
    _check_shapes(
        mask,
        logprobs=logprobs,
        old_logprobs=old_logprobs,
        teacher_logprobs=teacher_logprobs,
        advantages=advantages,
        ref_logprobs=ref_logprobs,
        entropy=entropy,
    )
    kl_coef = cfg.kl_coef or 0.0
    if kl_coef != 0 and ref_logprobs is None:
        raise ValueError(
            f"kl_coef ({kl_coef}) needs ref_logprobs: the KL term compares with a reference policy"
        )
    terms, metrics = fn(logprobs, old_logprobs, teacher_logprobs, advantages, mask, cfg, step)
    if ref_logprobs is not None:
        kl = agg_loss(kl_penalty(logprobs, ref_logprobs.detach(), cfg.kl_kind), mask, cfg.agg)
        terms["kl"] = kl_coef * kl
        metrics["actor/kl_loss"] = float(kl.detach())
        metrics["actor/kl_coef"] = kl_coef
    if entropy is not None:
        if cfg.entropy_coef != 0:
            terms["entropy"] = -cfg.entropy_coef * agg_loss(entropy, mask, cfg.agg)
        metrics["actor/entropy"] = masked_mean_value(entropy, mask)
    if teacher_logprobs is not None and "sdar/gate_mean" not in metrics:
        gate = sdar_gate(logprobs, teacher_logprobs, cfg.gate_beta)
        metrics["sdar/gate_mean"] = masked_mean_value(gate, mask)
        metrics["sdar/gate_active_ratio"] = masked_mean_value((gate > 0.5).float(), mask)
        metrics["sdar/teacher_gap_mean"] = masked_mean_value(teacher_logprobs - logprobs.detach(), mask)
    return terms, metrics


def aux_grad_share(terms: Terms, params: list[Tensor]) -> dict[str, float | None]:
    """How much the auxiliary term moves the update next to the policy gradient, over the trainable ``params``:
    ``grad/aux_share = ||d aux / d params|| / ||d pg / d params||`` (L2 norms over all of them; ``aux`` is the
    weighted term, coef * L_aux), with both norms (``grad/pg_norm``, ``grad/aux_norm``). None for each quantity a
    method lacks a term for (grpo and rlsd: no aux; opsd: no pg), and for the share when the policy gradient is 0
    (every advantage 0). Both backward passes keep the graph, so the loss can still be backpropagated after."""
    norms: dict[str, float | None] = {}
    for name in ("pg", "aux"):
        term = terms.get(name)
        if term is None or not term.requires_grad:
            norms[name] = None
            continue
        grads = torch.autograd.grad(term, params, retain_graph=True, allow_unused=True)
        norms[name] = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads if g is not None))
    pg, aux = norms["pg"], norms["aux"]
    share = aux / pg if pg and aux is not None else None
    return {"grad/aux_share": share, "grad/pg_norm": pg, "grad/aux_norm": aux}


def _check_shapes(mask: Tensor, **tensors: Tensor | None) -> None:
    # A (B,) advantage against (B, T) log-probs would broadcast silently along the wrong axis when B == T.
    if mask.dim() != 2:
        raise ValueError(f"mask must be (B, T), got shape {tuple(mask.shape)}")
    for name, t in tensors.items():
        if t is not None and t.shape != mask.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected the mask's {tuple(mask.shape)}")
