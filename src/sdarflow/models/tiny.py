"""The tiny demo policy: a BPE tokenizer trained on environment text and a Qwen2-architecture model, saved as a
normal HF folder that loads through the same ``from_pretrained`` path as a real model."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger(__name__)

EOS = "<|im_end|>"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", EOS]

# Qwen's ChatML layout; generation stops at <|im_end|>.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class TinyShape:
    """Model shape. head_dim = hidden / heads = 64, the smallest vLLM's CPU attention supports."""

    vocab_size: int = 2048
    hidden_size: int = 128
    intermediate_size: int = 512
    num_layers: int = 4
    num_heads: int = 2
    num_kv_heads: int = 2
    max_positions: int = 1024


def train_tokenizer(texts: Iterable[str], vocab_size: int):
    """Byte-level BPE on the given texts, wrapped as a transformers fast tokenizer with the chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, pad_token="<|endoftext|>", bos_token=None, unk_token=None
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(tokenizer, shape: TinyShape, seed: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        max_position_embeddings=shape.max_positions,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.convert_tokens_to_ids(EOS),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    log.info("built tiny Qwen2 model: %.2fM parameters", sum(p.numel() for p in model.parameters()) / 1e6)
    return model


def save(model, tokenizer, out_dir: str | Path) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config.eos_token_id = tokenizer.convert_tokens_to_ids(EOS)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
