"""Attention on a CPU for grouped KV heads: the formula by hand, the same model outputs and gradients as
transformers' sdpa on a left-padded batch, and load_policy using it on a CPU."""

from __future__ import annotations

import math

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from sdarflow.models import load_policy
from sdarflow.models.attention import NAME, cpu_attention, cpu_sdpa


class _Layer(torch.nn.Module):
    num_key_value_groups = 3


def test_grouped_heads_read_their_kv_head_under_the_mask():
    """softmax(q k^T / sqrt(d) + mask) v per query head h, with the KV head h // groups, computed by hand."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(2, 6, 3, 4, generator=g),
        torch.randn(2, 2, 5, 4, generator=g),
        torch.randn(2, 2, 5, 4, generator=g),
    )
    keep = torch.ones(2, 1, 3, 5, dtype=torch.bool)
    keep[0, :, :, :2] = False  # row 0 left-padded by two positions
    out, weights = cpu_sdpa(_Layer(), q, k, v, keep)
    assert weights is None and out.shape == (2, 3, 6, 4)  # (batch, query, head, dim)
    for b in range(2):
        for h in range(6):
            for i in range(3):
                scores = [float(q[b, h, i] @ k[b, h // 3, j]) / math.sqrt(4) for j in range(5)]
                exp = [math.exp(s) if keep[b, 0, i, j] else 0.0 for j, s in enumerate(scores)]
                expected = sum(e * v[b, h // 3, j] for j, e in enumerate(exp)) / sum(exp)
                assert torch.allclose(out[b, i, h], expected, atol=1e-6)


def _grouped_model(attention: str) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=64, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=6,
        num_key_value_heads=2, max_position_embeddings=64, attn_implementation=attention,
    )  # fmt: skip
    return Qwen2ForCausalLM(config)


def test_a_grouped_model_gives_sdpas_logits_and_gradients_on_a_padded_batch(monkeypatch):
    ids = torch.randint(1, 64, (3, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding, so transformers builds a mask
    mask[2, :1] = 0
    sdpa, calls = torch.nn.functional.scaled_dot_product_attention, []

    def spy(query, key, value, **kwargs):  # records how torch's kernel was asked, then runs it
        calls.append((key.shape[1], kwargs.get("enable_gqa", False), kwargs.get("attn_mask") is not None))
        return sdpa(query, key, value, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    runs = []
    for attention in ("sdpa", cpu_attention()):
        model = _grouped_model(attention)
        calls.clear()
        logits = model(input_ids=ids, attention_mask=mask).logits
        # sdpa copies the 2 KV heads to the 6 query heads; ours reads the 2 in place, under the padding mask
        assert calls == [(6, False, True)] * 2 if attention == "sdpa" else [(2, True, True)] * 2
        logits[mask.bool()].logsumexp(-1).sum().backward()
        runs.append((logits.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (sdpa_logits, sdpa_grads), (ours, our_grads) = runs
    assert torch.equal(ours[mask.bool()], sdpa_logits[mask.bool()])  # the forward pass bit for bit
    for name, grad in sdpa_grads.items():  # the backward sums a KV head's query heads in another order
        assert torch.allclose(our_grads[name], grad, atol=1e-5), name


def test_load_policy_uses_it_on_a_cpu(tiny_model):
    assert load_policy(str(tiny_model), device="cpu").model.config._attn_implementation == NAME
