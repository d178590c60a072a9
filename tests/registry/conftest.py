"""Fixtures for the registry tests: a moto S3 server over HTTP, registry roots (local and S3), fake adapters and
eval reports."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture
def s3_registry(s3_root: str) -> str:
    """A fresh registry prefix in the moto bucket, with the AWS environment pointing at the server."""
    return s3_root


@pytest.fixture
def local_registry(tmp_path: Path) -> str:
    return str(tmp_path / "registry")


@pytest.fixture(params=["local", "s3"])
def registry_uri(request: pytest.FixtureRequest) -> str:
    """Each test using it runs once on a local folder and once on S3."""
    return request.getfixturevalue(f"{request.param}_registry")


@pytest.fixture
def make_adapter(tmp_path: Path) -> Callable[..., Path]:
    """A tiny PEFT-format LoRA adapter folder: adapter_config.json and adapter_model.safetensors."""
    import torch
    from safetensors.torch import save_file

    counter = iter(range(1_000_000))

    def make(rank: int = 8, seed: int = 0) -> Path:
        folder = tmp_path / f"adapter-{next(counter)}"
        folder.mkdir()
        config = {
            "peft_type": "LORA",
            "r": rank,
            "lora_alpha": 2 * rank,
            "target_modules": ["q_proj", "v_proj"],
            "base_model_name_or_path": "tiny-qwen2",
        }
        (folder / "adapter_config.json").write_text(json.dumps(config))
        generator = torch.Generator().manual_seed(seed)
        tensors = {
            "base_model.model.layers.0.q_proj.lora_A.weight": torch.randn(rank, 16, generator=generator)
        }
        save_file(tensors, str(folder / "adapter_model.safetensors"))
        return folder

    return make


def eval_report(test1: float, testk: float, ood1: float | None = None, k: int = 4) -> dict:
    """An eval report in the shape `sdarflow evaluate` writes; ``ood1=None`` leaves the ood split out."""
    splits = {
        "test": {
            "n_tasks": 20,
            "samples_per_task": k,
            "pass_at_k": {"1": test1, "2": (test1 + testk) / 2, str(k): testk},
            "ci95": {},
            "by_task_type": {},
        }
    }
    if ood1 is not None:
        splits["ood"] = {"n_tasks": 10, "samples_per_task": k, "pass_at_k": {"1": ood1, str(k): ood1}}
    return {"adapter": "file:///adapter", "base_model": "tiny-qwen2", "splits": splits}


@pytest.fixture
def report() -> Callable[..., dict]:
    return eval_report


@pytest.fixture
def lineage() -> dict:
    return {
        "run_id": "run-1",
        "base_model": "tiny-qwen2",
        "config_hash": "abc123",
        "data_uris": ["s3://data/runs/run-1/round=0/rescore"],
        "skill_library_version": "3",
    }
