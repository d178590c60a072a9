"""Chunked token log-probs and entropy: equal to the unchunked reference, values and gradients."""

import math

import pytest
import torch

from sdarflow.algo import entropy_from_logits, token_logprobs

V = 13


def _inputs(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(2, 5, V, generator=g) * 3).to(dtype).requires_grad_()  # N = 10 tokens
    labels = torch.randint(0, V, (2, 5), generator=g)
    return logits, labels


def test_hand_value():
    logits = torch.tensor([[0.0, math.log(3.0)]])  # softmax = [0.25, 0.75]
    out = token_logprobs(logits, torch.tensor([1]))
    assert out.tolist() == pytest.approx([math.log(0.75)], rel=1e-6)
    assert entropy_from_logits(logits).tolist() == pytest.approx(
        [-(0.25 * math.log(0.25) + 0.75 * math.log(0.75))], rel=1e-6
    )


@pytest.mark.parametrize("chunk_size", [1, 3, 4, 7, 1024])
def test_token_logprobs_match_unchunked_with_gradients(chunk_size):
    logits, labels = _inputs()
    weights = torch.randn(2, 5, generator=torch.Generator().manual_seed(1))
    ref = torch.log_softmax(logits.float(), -1).gather(-1, labels[..., None]).squeeze(-1)
    (ref_grad,) = torch.autograd.grad((ref * weights).sum(), logits)
    out = token_logprobs(logits, labels, chunk_size=chunk_size)
    (grad,) = torch.autograd.grad((out * weights).sum(), logits)
    assert out.shape == (2, 5) and out.dtype == torch.float32
    assert torch.allclose(out, ref, atol=1e-6, rtol=0)
    assert torch.allclose(grad, ref_grad, atol=1e-6, rtol=0)


@pytest.mark.parametrize("chunk_size", [1, 3, 4, 7, 1024])
def test_entropy_matches_unchunked_with_gradients(chunk_size):
    logits, _ = _inputs()
    weights = torch.randn(2, 5, generator=torch.Generator().manual_seed(2))
    logp = torch.log_softmax(logits.float(), -1)
    ref = -(logp.exp() * logp).sum(-1)
    (ref_grad,) = torch.autograd.grad((ref * weights).sum(), logits)
    out = entropy_from_logits(logits, chunk_size=chunk_size)
    (grad,) = torch.autograd.grad((out * weights).sum(), logits)
    assert torch.allclose(out, ref, atol=1e-5, rtol=0)
    assert torch.allclose(grad, ref_grad, atol=1e-5, rtol=0)


def test_gradcheck_float64():
    logits, labels = _inputs(torch.float64)
    assert torch.autograd.gradcheck(lambda x: token_logprobs(x, labels, chunk_size=3), (logits,))
    assert torch.autograd.gradcheck(lambda x: entropy_from_logits(x, chunk_size=3), (logits,))


def test_bf16_logits_give_float32_and_bf16_grad():
    logits, labels = _inputs(torch.bfloat16)
    out = token_logprobs(logits, labels, chunk_size=3)
    assert out.dtype == torch.float32
    ref = torch.log_softmax(logits.float(), -1).gather(-1, labels[..., None]).squeeze(-1)
    assert torch.allclose(out, ref, atol=1e-6)
    out.sum().backward()
    assert logits.grad.dtype == torch.bfloat16


def test_ignore_index_gives_zero_and_no_gradient():
    logits, labels = _inputs()
    labels = labels.clone()
    labels[1, 3:] = -100
    out = token_logprobs(logits, labels, chunk_size=4)
    assert out[1, 3:].eq(0).all()
    out.sum().backward()
    assert logits.grad[1, 3:].eq(0).all()
    assert logits.grad[0].abs().sum() > 0


def test_bad_arguments():
    logits, labels = _inputs()
    with pytest.raises(ValueError, match="chunk_size"):
        token_logprobs(logits, labels, chunk_size=0)
    with pytest.raises(ValueError, match="labels"):
        token_logprobs(logits, labels[:, :3])
    with pytest.raises(ValueError, match="chunk_size"):
        entropy_from_logits(logits, chunk_size=-1)
