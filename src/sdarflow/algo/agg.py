"""Loss aggregation: the one function that turns a (B, T) per-token loss into a scalar, for every loss.

Every loss in :mod:`sdarflow.algo` reduces through :func:`agg_loss`, so micro-batching and the choice of loss
never change what "mean" means. Modes follow verl's ``agg_loss`` (``verl/trainer/ppo/core_algos.py``).
Masks are (B, T), bool or 0/1; masked-out entries of the loss are ignored even if they hold inf/NaN.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

from sdarflow.names import NameRegistry

AggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]

_AGG: NameRegistry[Callable[[Tensor, Tensor], Tensor]] = NameRegistry("loss aggregation mode")


def _masked(loss_mat: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Returns (loss with masked entries set to 0, bool mask); ``where`` keeps inf/NaN padding out of sums."""
    keep = mask.bool()
    return torch.where(keep, loss_mat, torch.zeros_like(loss_mat)), keep


@_AGG.register("token-mean")
def _token_mean(loss_mat: Tensor, mask: Tensor) -> Tensor:
    return masked_mean(loss_mat, mask)


@_AGG.register("seq-mean-token-sum")
def _seq_mean_token_sum(loss_mat: Tensor, mask: Tensor) -> Tensor:
    loss, _ = _masked(loss_mat, mask)
    return loss.sum(-1).mean()


@_AGG.register("seq-mean-token-mean")
def _seq_mean_token_mean(loss_mat: Tensor, mask: Tensor) -> Tensor:
    # an empty row counts as a sequence with loss 0
    loss, keep = _masked(loss_mat, mask)
    return (loss.sum(-1) / keep.sum(-1).clamp(min=1)).mean()


@_AGG.register("seq-mean-token-sum-norm")
def _seq_mean_token_sum_norm(loss_mat: Tensor, mask: Tensor) -> Tensor:
    # Dr. GRPO's constant normaliser T = mask.shape[-1], so long and short responses are not re-weighted. As verl
    # defines it: a sum over sequences, not a mean (the scale grows with the batch).
    loss, _ = _masked(loss_mat, mask)
    return loss.sum() / max(1, mask.shape[-1])


AGG_MODES: tuple[str, ...] = _AGG.names()


def agg_loss(loss_mat: Tensor, mask: Tensor, mode: AggMode | str = "token-mean") -> Tensor:
    """A (B, T) per-token loss -> a 0-dim tensor, by ``mode``:

        ``token-mean``              sum m*l / sum m (every token weighs the same, whatever its sequence's length)
        ``seq-mean-token-sum``      mean_b sum_t m*l
        ``seq-mean-token-mean``     mean_b (sum_t m*l / sum_t m)
        ``seq-mean-token-sum-norm`` sum_{b,t} m*l / T

    Denominators are clamped to >= 1, so an empty mask gives 0, never NaN.
    """
    if loss_mat.shape != mask.shape:
        raise ValueError(f"loss_mat {tuple(loss_mat.shape)} and mask {tuple(mask.shape)} must have one shape")
    return _AGG.get(mode)(loss_mat, mask)


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """sum m*x / max(1, sum m) over all entries; x and mask share a shape. Used for metrics and token-mean."""
    vals, keep = _masked(x, mask)
    return vals.sum() / keep.sum().clamp(min=1)


def masked_mean_value(x: Tensor, mask: Tensor) -> float:
    """:func:`masked_mean` of a detached tensor, as a python float for metric dicts."""
    with torch.no_grad():
        return float(masked_mean(x.detach().float(), mask))
