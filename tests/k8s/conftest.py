"""Fixtures for the Kubernetes tests: a fake PEFT adapter (tests/factories.py) and an eval report of it (the
registry tests' conftest fixtures are not visible from this folder)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from factories import FAKE_BASE_ID, fake_adapter, fake_adapter_id


@pytest.fixture
def make_adapter(tmp_path: Path) -> Callable[..., Path]:
    """A tiny PEFT-format LoRA adapter folder (:func:`tests.factories.fake_adapter`)."""
    return lambda rank=8, name="adapter": fake_adapter(tmp_path / name, rank)


@pytest.fixture
def report() -> Callable[..., dict]:
    def make(test1: float, testk: float, ood1: float, k: int = 4) -> dict:
        split = {"n_tasks": 10, "samples_per_task": k, "ci95": {}, "by_task_type": {}}
        return {
            "adapter": "file:///adapter",
            "base_model": "tiny",
            "adapter_id": fake_adapter_id(),  # what make_adapter() makes
            "base_id": FAKE_BASE_ID,
            "splits": {
                "test": {**split, "pass_at_k": {"1": test1, str(k): testk}},
                "ood": {**split, "pass_at_k": {"1": ood1, str(k): ood1}},
            },
        }

    return make
