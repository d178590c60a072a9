"""Attention on a CPU for models whose query heads share KV heads (grouped-query attention: SmolLM2, Qwen2, Llama 3).

transformers' ``sdpa`` copies every KV head once per query head that reads it (``repeat_kv``) whenever an attention
mask is given, since CUDA's fused kernels take shared KV heads only without a mask. A rollout's batch is left-padded,
so it always has one, and that copy of each layer's whole KV cache at every new token was the largest cost of
generating on SmolLM2 (9 query heads on 3 KV heads): 2.2 GB a token at 32 rows of ~470 tokens, a third of the
call's time (docs/capacity.md#generation-engines). torch's CPU kernel reads shared KV heads with a mask
(``enable_gqa``) and gives the same output, bit for bit in the forward pass; ``load_policy`` puts a model that
runs sdpa on this attention on a CPU.
"""

from __future__ import annotations

import torch

NAME = "sdarflow_cpu_sdpa"


def cpu_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' attention-function signature: query (B, H, q, d), key and value (B, H_kv, k, d), the additive
    or boolean mask (B, 1, q, k) or None; returns ((B, q, H, d), None). Without a mask, shared heads or with an
    argument only transformers' function handles (a position bias, a paged cache), it is that function."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    plain = kwargs.get("position_bias") is None and kwargs.get("cache") is None
    if attention_mask is None or getattr(module, "num_key_value_groups", 1) == 1 or not plain:
        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
    )
    return out.transpose(1, 2).contiguous(), None


def cpu_attention() -> str:
    """The attention-implementation name of ``cpu_sdpa`` for transformers (registered, with sdpa's masks)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, cpu_sdpa)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME
