"""The training-method registry that ``--method`` selects, and the inputs every method's loss receives.

The methods themselves are defined in :mod:`sdarflow.algo.losses` (importing :mod:`sdarflow.algo` registers them);
:func:`sdarflow.algo.objective.method_loss` is the single entry point the trainer calls, so no caller branches on
the method name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from sdarflow.names import NameRegistry

Metrics = dict[str, float]


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

METHOD_REGISTRY: NameRegistry[MethodFn] = NameRegistry("method")
register_method = METHOD_REGISTRY.register
