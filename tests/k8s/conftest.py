"""Fixtures for the Kubernetes tests: a fake PEFT adapter and an eval report, as tests/registry/conftest.py builds
them (that conftest's fixtures are not visible from this folder)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture
def make_adapter(tmp_path: Path) -> Callable[..., Path]:
    """A tiny PEFT-format LoRA adapter folder: adapter_config.json and adapter_model.safetensors."""
    import torch
    from safetensors.torch import save_file

    def make(rank: int = 8, name: str = "adapter") -> Path:
        folder = tmp_path / name
        folder.mkdir()
        config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": ["q_proj"]}
        (folder / "adapter_config.json").write_text(json.dumps(config))
        save_file({"lora_A.weight": torch.zeros(rank, 16)}, str(folder / "adapter_model.safetensors"))
        return folder

    return make


@pytest.fixture
def report() -> Callable[..., dict]:
    def make(test1: float, testk: float, ood1: float, k: int = 4) -> dict:
        split = {"n_tasks": 10, "samples_per_task": k, "ci95": {}, "by_task_type": {}}
        return {
            "adapter": "file:///adapter",
            "base_model": "tiny",
            "splits": {
                "test": {**split, "pass_at_k": {"1": test1, str(k): testk}},
                "ood": {**split, "pass_at_k": {"1": ood1, str(k): ood1}},
            },
        }

    return make
