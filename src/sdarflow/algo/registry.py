"""Name -> function registries, and the training-method registry that config values select.

Config strings (``grpo``, ``sdar``, ``token-mean``, ...) are registry keys: a decorator binds each name once, and a
failed look-up raises :class:`UnknownNameError` listing the valid names. The methods themselves are defined in
:mod:`sdarflow.algo.losses` (importing :mod:`sdarflow.algo` registers them); :func:`method_loss` is the single
entry point the trainer calls, so no caller branches on the method name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from torch import Tensor

from sdarflow.errors import ConfigError

T = TypeVar("T")

Metrics = dict[str, float]


class UnknownNameError(ConfigError, ValueError):
    """A config value names no registered entry; the message lists the valid names."""

    def __init__(self, kind: str, name: str, valid: tuple[str, ...]) -> None:
        super().__init__(f"unknown {kind} {name!r}: choose one of {', '.join(valid)}")
        self.kind = kind
        self.name = name
        self.valid = valid


class Registry(Generic[T]):
    """A write-once mapping from names to objects, filled by the :meth:`register` decorator."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator binding ``name``; binding a name twice is a programming error (``ValueError``)."""

        def bind(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered to {self._items[name]!r}")
            self._items[name] = obj
            return obj

        return bind

    def get(self, name: str) -> T:
        """The object bound to ``name``; raises :class:`UnknownNameError` listing the valid names."""
        try:
            return self._items[name]
        except KeyError:
            raise UnknownNameError(self.kind, name, self.names()) from None

    def names(self) -> tuple[str, ...]:
        """Registered names, in registration order."""
        return tuple(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items


@dataclass(frozen=True)
class MethodInputs:
    """Everything a method's loss may use. Tensors are (B, T), one row per training sample (agent turn).

    ``advantages`` are per token (the row's GRPO advantage broadcast over its response tokens);
    ``teacher_logprobs`` may be None only for methods that do not distill (``grpo``). ``step`` is the RL step
    (the reference's ``global_steps``, 1 for the first update), which RLSD's decaying weight reads.
    """

    logprobs: Tensor
    old_logprobs: Tensor
    teacher_logprobs: Tensor | None
    advantages: Tensor
    mask: Tensor
    lam: float
    beta: float
    clip_low: float
    clip_high: float
    clip_ratio_c: float | None
    rlsd_lam: float
    rlsd_clip_eps: float
    rlsd_warmdown_steps: int
    skill_sd_coef: float
    step: int
    agg: str


MethodFn = Callable[[MethodInputs], tuple[Tensor, Metrics]]

METHOD_REGISTRY: Registry[MethodFn] = Registry("method")
register_method = METHOD_REGISTRY.register


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
    # Imported here: both modules import this one (agg for Registry, losses to register the methods).
    from sdarflow.algo.agg import agg_loss
    from sdarflow.algo.losses import kl_penalty

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
    inputs = MethodInputs(
        logprobs=logprobs,
        old_logprobs=old_logprobs,
        teacher_logprobs=teacher_logprobs,
        advantages=advantages,
        mask=mask,
        lam=lam,
        beta=beta,
        clip_low=clip_low,
        clip_high=clip_high,
        clip_ratio_c=clip_ratio_c,
        rlsd_lam=rlsd_lam,
        rlsd_clip_eps=rlsd_clip_eps,
        rlsd_warmdown_steps=rlsd_warmdown_steps,
        skill_sd_coef=skill_sd_coef,
        step=step,
        agg=agg,
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
