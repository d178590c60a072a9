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

    ``advantages`` are per token (the episode's GRPO advantage broadcast over its response tokens);
    ``teacher_logprobs`` may be None only for methods that do not distill (``grpo``).
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
    rlsd_lam: float
    rlsd_clip_eps: float
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
) -> tuple[Tensor, Metrics]:
    """The scalar training loss of ``method`` and its namespaced metrics (``loss/total``, ``loss/pg``, ...).

    All tensors are (B, T); ``logprobs`` carries the gradient, the others are treated as constants. Defaults are
    the SDAR paper's (lambda 0.01, beta 5). Raises :class:`UnknownNameError` for an unregistered method and
    ``ValueError`` for mismatched shapes or a missing teacher.
    """
    fn = METHOD_REGISTRY.get(method)
    _check_shapes(
        mask,
        logprobs=logprobs,
        old_logprobs=old_logprobs,
        teacher_logprobs=teacher_logprobs,
        advantages=advantages,
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
        rlsd_lam=rlsd_lam,
        rlsd_clip_eps=rlsd_clip_eps,
        agg=agg,
    )
    return fn(inputs)


def _check_shapes(mask: Tensor, **tensors: Tensor | None) -> None:
    # A (B,) advantage against (B, T) log-probs would broadcast silently along the wrong axis when B == T.
    if mask.dim() != 2:
        raise ValueError(f"mask must be (B, T), got shape {tuple(mask.shape)}")
    for name, t in tensors.items():
        if t is not None and t.shape != mask.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected the mask's {tuple(mask.shape)}")
