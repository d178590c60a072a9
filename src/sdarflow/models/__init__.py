"""Policy models: load an HF causal LM (with an optional LoRA adapter), build the tiny demo model, chat template."""

from sdarflow.models.policy import Policy, load_policy, load_tokenizer

__all__ = ["Policy", "load_policy", "load_tokenizer"]
