"""The fused LM-head log-prob: equal to log_softmax(h W^T) gathered, with equal gradients, chunk-size invariant."""

from __future__ import annotations

import pytest
import torch

from sdarflow.algo import linear_entropy, linear_token_logprobs


def reference(h, w, labels):
    return torch.log_softmax(h @ w.T, dim=-1).gather(-1, labels[..., None]).squeeze(-1)


@pytest.mark.parametrize("chunk", [1, 3, 7, 1024])
def test_values_and_gradients_match_the_unfused_reference(chunk):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(2, 5, 8, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(13, 8, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(13, (2, 5), generator=g)
    upstream = torch.randn(2, 5, generator=g, dtype=torch.float64)
    got = linear_token_logprobs(h, w, labels, chunk_size=chunk)
    ref = reference(h, w, labels)
    assert torch.allclose(got, ref, atol=1e-12)
    gh, gw = torch.autograd.grad((got * upstream).sum(), (h, w))
    rh, rw = torch.autograd.grad((ref * upstream).sum(), (h, w))
    assert torch.allclose(gh, rh, atol=1e-12) and torch.allclose(gw, rw, atol=1e-12)


def test_gradcheck():
    g = torch.Generator().manual_seed(1)
    h = torch.randn(4, 3, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(6, 3, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(6, (4,), generator=g)
    assert torch.autograd.gradcheck(lambda a, b: linear_token_logprobs(a, b, labels, 3), (h, w))


def test_float32_output_for_low_precision_inputs_and_entropy():
    h = torch.randn(6, 4).to(torch.bfloat16)
    w = torch.randn(9, 4).to(torch.bfloat16)
    assert linear_token_logprobs(h, w, torch.zeros(6, dtype=torch.long), 4).dtype == torch.float32
    x = h.float() @ w.float().T
    p = torch.softmax(x, -1)
    assert torch.allclose(linear_entropy(h, w, 4), -(p * torch.log(p)).sum(-1), atol=1e-5)


@pytest.mark.parametrize("chunk", [1, 4, 1024])
def test_entropy_values_and_gradients_match_the_unfused_reference(chunk):
    # the entropy bonus trains through this: H = -sum p log p of softmax(h W^T)
    g = torch.Generator().manual_seed(2)
    h = torch.randn(3, 4, 6, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(11, 6, generator=g, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(3, 4, generator=g, dtype=torch.float64)
    got = linear_entropy(h, w, chunk)
    logp = torch.log_softmax(h @ w.T, dim=-1)
    ref = -(logp.exp() * logp).sum(-1)
    assert torch.allclose(got, ref, atol=1e-12)
    gh, gw = torch.autograd.grad((got * upstream).sum(), (h, w))
    rh, rw = torch.autograd.grad((ref * upstream).sum(), (h, w))
    assert torch.allclose(gh, rh, atol=1e-12) and torch.allclose(gw, rw, atol=1e-12)


def test_entropy_gradcheck():
    g = torch.Generator().manual_seed(3)
    h = torch.randn(4, 3, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, 3, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: linear_entropy(a, b, 3), (h, w))
