"""LoRA targets come from the architecture (PEFT's all-linear), not a Qwen2-only list: every projection inside the
blocks of Qwen2 (the tiny model), Llama (SmolLM2) and GPT-2 alike, never the output head."""

from __future__ import annotations

from sdarflow.models import load_policy
from sdarflow.models.policy import new_lora

PROJECTIONS = ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]


def _targets(model) -> list[str]:
    """The adapted layers' own names (PEFT may record full paths for some architectures)."""
    return sorted({t.rsplit(".", 1)[-1] for t in new_lora(model, 4, 8).peft_config["default"].target_modules})


def test_qwen2_and_llama_get_every_block_projection(tiny_model, smollm2):
    assert _targets(load_policy(str(tiny_model), trainable=True, device="cpu").model) == PROJECTIONS
    assert _targets(load_policy(str(smollm2), trainable=True, device="cpu").model) == PROJECTIONS


def test_gpt2_gets_its_own_layers_and_named_targets_still_win():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64))
    assert _targets(gpt2) == ["c_attn", "c_fc", "c_proj"]
    named = new_lora(
        GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)), 4, 8, ["c_attn"]
    )
    assert sorted(named.peft_config["default"].target_modules) == ["c_attn"]
