"""Fixtures for the rollout tests: a real PEFT LoRA adapter trained on nothing (random weights, so it changes the
model's outputs) for the tiny base model, with the base-model fingerprint the train stage writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def lora_adapter(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model

    from sdarflow.models import load_policy
    from sdarflow.models.policy import BASE_FILE, DEFAULT_LORA_TARGETS, base_fingerprint

    torch.manual_seed(0)
    policy = load_policy(str(tiny_model))
    # init_lora_weights=False: B is random too, so the adapter is not the identity.
    config = LoraConfig(r=8, lora_alpha=16, target_modules=DEFAULT_LORA_TARGETS, init_lora_weights=False)
    model = get_peft_model(policy.model, config)
    out = tmp_path_factory.mktemp("adapters") / "random-lora"
    model.save_pretrained(out)
    (out / BASE_FILE).write_text(json.dumps({"fingerprint": base_fingerprint(str(tiny_model))}))
    return out
