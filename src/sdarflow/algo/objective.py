"""The training objective: the chosen method's loss plus the KL term to the reference policy.

:func:`method_loss` is what the trainer calls; it looks the method up by its config name, checks the shapes once
for every method, and adds ``kl_coef * agg(kl_penalty)`` when reference log-probs are given.
"""

from __future__ import annotations

import dataclasses

from torch import Tensor

from sdarflow.algo.agg import agg_loss
from sdarflow.algo.losses import kl_penalty
from sdarflow.algo.registry import METHOD_REGISTRY, MethodInputs, Metrics


def method_loss(
    method: str,
    *,
    logprobs: Tensor,
    old_logprobs: Tensor,
    teacher_logprobs: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    lam: float = 0.01,
    beta: float = 5.0,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    rlsd_lam: float = 0.5,
    rlsd_clip_eps: float = 0.2,
    agg: str = "token-mean",
    ref_logprobs: Tensor | None = None,
    kl_coef: float = 0.0,
    kl_kind: str = "low_var_kl",
    clip_ratio_c: float | None = 3.0,
    skill_sd_coef: float = 0.001,
    step: int = 0,
    rlsd_warmdown_steps: int = 100,
) -> tuple[Tensor, Metrics]:
    """The scalar training loss of ``method`` and its namespaced metrics (``loss/total``, ``loss/pg``, ...).

    ``L = L_method + kl_coef * agg(kl_penalty(logprobs, ref_logprobs, kl_kind))``, the KL term whenever
    ``ref_logprobs`` is given (verl's ``use_kl_loss``; the reference scripts use ``low_var_kl`` at 0.01 for
    ALFWorld/WebShop and 0.001 for search). The entropy bonus is the trainer's, from the logits it computes.

    All tensors are (B, T); ``logprobs`` carries the gradient, the others are treated as constants. Defaults are
    the SDAR paper's and its reference scripts' (lambda 0.01, beta 5, dual clip 3, Skill-SD 0.001, RLSD warm-down
    100 steps). Raises :class:`UnknownNameError` for an unregistered method and ``ValueError`` for mismatched
    shapes, a missing teacher, or ``kl_coef > 0`` without reference log-probs.
    """
    # Every MethodInputs field is a parameter of the same name.
    given = locals()
    inputs = MethodInputs(**{f.name: given[f.name] for f in dataclasses.fields(MethodInputs)})
    fn = METHOD_REGISTRY.get(method)
    _check_shapes(
        mask,
        logprobs=logprobs,
        old_logprobs=old_logprobs,
        teacher_logprobs=teacher_logprobs,
        advantages=advantages,
        ref_logprobs=ref_logprobs,
    )
    if kl_coef != 0 and ref_logprobs is None:
        raise ValueError(
            f"kl_coef ({kl_coef}) needs ref_logprobs: the KL term compares with a reference policy"
        )
    loss, metrics = fn(inputs)
    if ref_logprobs is not None:
        kl = agg_loss(kl_penalty(logprobs, ref_logprobs.detach(), kl_kind), mask, agg)
        loss = loss + kl_coef * kl
        metrics["actor/kl_loss"] = float(kl.detach())
        metrics["actor/kl_coef"] = kl_coef
        metrics["loss/total"] = float(loss.detach())
    return loss, metrics


def _check_shapes(mask: Tensor, **tensors: Tensor | None) -> None:
    # A (B,) advantage against (B, T) log-probs would broadcast silently along the wrong axis when B == T.
    if mask.dim() != 2:
        raise ValueError(f"mask must be (B, T), got shape {tuple(mask.shape)}")
    for name, t in tensors.items():
        if t is not None and t.shape != mask.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected the mask's {tuple(mask.shape)}")
