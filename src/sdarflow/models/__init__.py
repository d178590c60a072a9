"""Policy models: load an HF causal LM (with an optional LoRA adapter), build the tiny demo model, chat template.

The policy names are imported on first use, so ``sdarflow.models.identity`` (fingerprints, safetensors headers) is
usable without importing torch."""

from __future__ import annotations

__all__ = ["Policy", "load_policy", "load_tokenizer"]


def __getattr__(name: str):
    if name in __all__:
        from sdarflow.models import policy

        return getattr(policy, name)
    raise AttributeError(f"module 'sdarflow.models' has no attribute {name!r}")
