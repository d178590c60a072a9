"""Memory-bounded token log-probs and entropies from logits.

A (N, V) float32 ``log_softmax`` over a 150k vocabulary is gigabytes for a few thousand tokens, and autograd would
keep one per chunk alive until backward. These functions walk the flattened token dimension in chunks, in the
forward *and* the backward (custom autograd functions that recompute the softmax per chunk), so at most
``chunk_size x V`` upcast values exist at a time. The only full-size tensors are the logits and their gradient,
both in the logits' own dtype.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable


def _compute_dtype(x: Tensor) -> torch.dtype:
    # bf16/fp16 logits are upcast (their log-softmax loses the small gaps the losses depend on); fp64 stays fp64.
    return torch.promote_types(x.dtype, torch.float32)


def _chunks(n: int, chunk_size: int) -> list[slice]:
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    return [slice(s, min(s + chunk_size, n)) for s in range(0, n, chunk_size)]


class _ChunkedTokenLogprobs(torch.autograd.Function):
    """(N, V) logits, (N,) labels -> (N,) ``x[label] - logsumexp(x)``; grad ``g * (onehot(label) - softmax(x))``."""

    @staticmethod
    def forward(ctx: FunctionCtx, logits: Tensor, labels: Tensor, chunk_size: int) -> Tensor:
        dtype = _compute_dtype(logits)
        out = torch.empty(logits.shape[0], dtype=dtype, device=logits.device)
        for sl in _chunks(logits.shape[0], chunk_size):
            x = logits[sl].to(dtype)  # (c, V)
            out[sl] = x.gather(-1, labels[sl, None]).squeeze(-1) - torch.logsumexp(x, dim=-1)
        ctx.save_for_backward(logits, labels)
        ctx.chunk_size = chunk_size
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad_out: Tensor) -> tuple[Tensor, None, None]:
        logits, labels = ctx.saved_tensors
        grad = torch.empty_like(logits)
        for sl in _chunks(logits.shape[0], ctx.chunk_size):
            g = grad_out[sl, None]  # (c, 1)
            chunk = -torch.softmax(logits[sl].to(g.dtype), dim=-1) * g
            chunk.scatter_add_(-1, labels[sl, None], g)
            grad[sl] = chunk.to(grad.dtype)
        return grad, None, None


class _ChunkedEntropy(torch.autograd.Function):
    """(N, V) logits -> (N,) ``H = logsumexp(x) - sum p x``; grad ``-g * p * (x - sum p x)``."""

    @staticmethod
    def forward(ctx: FunctionCtx, logits: Tensor, chunk_size: int) -> Tensor:
        dtype = _compute_dtype(logits)
        out = torch.empty(logits.shape[0], dtype=dtype, device=logits.device)
        for sl in _chunks(logits.shape[0], chunk_size):
            x = logits[sl].to(dtype)
            out[sl] = torch.logsumexp(x, dim=-1) - (torch.softmax(x, dim=-1) * x).sum(-1)
        ctx.save_for_backward(logits)
        ctx.chunk_size = chunk_size
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad_out: Tensor) -> tuple[Tensor, None]:
        (logits,) = ctx.saved_tensors
        grad = torch.empty_like(logits)
        for sl in _chunks(logits.shape[0], ctx.chunk_size):
            x = logits[sl].to(grad_out.dtype)
            p = torch.softmax(x, dim=-1)
            mean_x = (p * x).sum(-1, keepdim=True)
            grad[sl] = (-grad_out[sl, None] * p * (x - mean_x)).to(grad.dtype)
        return grad, None


def token_logprobs(
    logits: Tensor, labels: Tensor, chunk_size: int = 1024, ignore_index: int = -100
) -> Tensor:
    """Log-probability of each label under its logits: ``log_softmax(logits.float())[..., label]``, (..., V) ->
    (...) float32 (float64 for float64 logits), in chunks of ``chunk_size`` tokens. Positions whose label is
    ``ignore_index`` get log-prob 0 and no gradient."""
    if labels.shape != logits.shape[:-1]:
        raise ValueError(
            f"labels {tuple(labels.shape)} must match logits {tuple(logits.shape)} without the vocab"
        )
    flat_logits = logits.reshape(-1, logits.shape[-1])  # (N, V)
    flat_labels = labels.reshape(-1).long()  # (N,)
    ignored = flat_labels == ignore_index
    safe_labels = torch.where(ignored, torch.zeros_like(flat_labels), flat_labels)
    out = _ChunkedTokenLogprobs.apply(flat_logits, safe_labels, chunk_size)
    out = torch.where(ignored, torch.zeros_like(out), out)
    return out.reshape(labels.shape)


def entropy_from_logits(logits: Tensor, chunk_size: int = 1024) -> Tensor:
    """Entropy of the softmax over the last axis, ``H = logsumexp(x) - sum_v softmax(x)_v x_v``: (..., V) -> (...)
    float32 (float64 for float64 logits), in chunks of ``chunk_size`` tokens."""
    flat_logits = logits.reshape(-1, logits.shape[-1])
    return _ChunkedEntropy.apply(flat_logits, chunk_size).reshape(logits.shape[:-1])


class _FusedLinearLogprobs(torch.autograd.Function):
    """(N, H) hidden, (V, H) head weight, (N,) labels -> (N,) log-probs without an (N, V) tensor.

    Forward keeps only the per-token logsumexp; backward recomputes each chunk's logits and accumulates
    ``dh = G @ W`` and ``dW = G^T @ h`` with ``G = g * (onehot(label) - softmax(h W^T))``.
    """

    @staticmethod
    def forward(ctx: FunctionCtx, hidden: Tensor, weight: Tensor, labels: Tensor, chunk_size: int) -> Tensor:
        dtype = _compute_dtype(hidden)
        w = weight.to(dtype)
        out = torch.empty(hidden.shape[0], dtype=dtype, device=hidden.device)
        lse = torch.empty_like(out)
        for sl in _chunks(hidden.shape[0], chunk_size):
            x = hidden[sl].to(dtype) @ w.T  # (c, V)
            lse[sl] = torch.logsumexp(x, dim=-1)
            out[sl] = x.gather(-1, labels[sl, None]).squeeze(-1) - lse[sl]
        ctx.save_for_backward(hidden, weight, labels, lse)
        ctx.chunk_size = chunk_size
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad_out: Tensor) -> tuple[Tensor, Tensor, None, None]:
        hidden, weight, labels, lse = ctx.saved_tensors
        w = weight.to(grad_out.dtype)
        grad_h = torch.empty_like(hidden)
        grad_w = torch.zeros_like(w)
        for sl in _chunks(hidden.shape[0], ctx.chunk_size):
            h = hidden[sl].to(grad_out.dtype)
            g = grad_out[sl, None]  # (c, 1)
            G = -torch.exp(h @ w.T - lse[sl, None]) * g  # (c, V)
            G.scatter_add_(-1, labels[sl, None], g)
            grad_h[sl] = (G @ w).to(grad_h.dtype)
            grad_w += G.T @ h
        return grad_h, grad_w.to(weight.dtype), None, None


def linear_token_logprobs(hidden: Tensor, weight: Tensor, labels: Tensor, chunk_size: int = 1024) -> Tensor:
    """``log_softmax(hidden @ weight.T)[..., label]`` chunk by chunk, fused with the LM head: hidden (..., H),
    weight (V, H), labels (...) -> (...) float32 (float64 for float64 inputs). The (N, V) logits and their gradient
    never exist at once: peak extra memory is ``chunk_size x V`` plus one weight-sized gradient."""
    flat_h = hidden.reshape(-1, hidden.shape[-1])
    out = _FusedLinearLogprobs.apply(flat_h, weight, labels.reshape(-1).long(), chunk_size)
    return out.reshape(labels.shape)


class _FusedLinearEntropy(torch.autograd.Function):
    """(N, H) hidden, (V, H) head weight -> (N,) entropies ``H = lse(x) - sum p x`` of ``x = h W^T``, chunked.

    Backward recomputes each chunk's logits: ``G = -g * p * (x - sum p x)``, ``dh = G @ W``, ``dW = G^T @ h``.
    """

    @staticmethod
    def forward(ctx: FunctionCtx, hidden: Tensor, weight: Tensor, chunk_size: int) -> Tensor:
        dtype = _compute_dtype(hidden)
        w = weight.to(dtype)
        out = torch.empty(hidden.shape[0], dtype=dtype, device=hidden.device)
        for sl in _chunks(hidden.shape[0], chunk_size):
            x = hidden[sl].to(dtype) @ w.T  # (c, V)
            out[sl] = torch.logsumexp(x, dim=-1) - (torch.softmax(x, dim=-1) * x).sum(-1)
        ctx.save_for_backward(hidden, weight)
        ctx.chunk_size = chunk_size
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad_out: Tensor) -> tuple[Tensor, Tensor, None]:
        hidden, weight = ctx.saved_tensors
        w = weight.to(grad_out.dtype)
        grad_h = torch.empty_like(hidden)
        grad_w = torch.zeros_like(w)
        for sl in _chunks(hidden.shape[0], ctx.chunk_size):
            h = hidden[sl].to(grad_out.dtype)
            x = h @ w.T  # (c, V)
            p = torch.softmax(x, dim=-1)
            G = -grad_out[sl, None] * p * (x - (p * x).sum(-1, keepdim=True))
            grad_h[sl] = (G @ w).to(grad_h.dtype)
            grad_w += G.T @ h
        return grad_h, grad_w.to(weight.dtype), None


def linear_entropy(hidden: Tensor, weight: Tensor, chunk_size: int = 1024) -> Tensor:
    """Entropy of ``softmax(hidden @ weight.T)`` per token, chunked and fused with the LM head like
    :func:`linear_token_logprobs`: (..., H), (V, H) -> (...); differentiable, for the entropy bonus."""
    flat_h = hidden.reshape(-1, hidden.shape[-1])
    return _FusedLinearEntropy.apply(flat_h, weight, chunk_size).reshape(hidden.shape[:-1])


def turn_progress(logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor) -> Tensor:
    """Per-turn progress, the turn's log-likelihood ratio ``sum_t m_t (log pi(y_t) - log pi_ref(y_t))``:
    (B, T) -> (B,). Exported with the rescored rows, so a failure can be traced to the turns that moved most."""
    diff = torch.where(mask.bool(), logprobs - ref_logprobs, torch.zeros_like(logprobs))
    return diff.sum(dim=-1)
