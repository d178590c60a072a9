"""Fixtures for the registry tests: a moto S3 server over HTTP, registry roots (local and S3), fake adapters and
eval reports."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest
from factories import FAKE_BASE_ID, FAKE_PROTOCOL, fake_adapter, fake_adapter_id


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
    """A tiny PEFT-format LoRA adapter folder (:func:`tests.factories.fake_adapter`), a new folder each call."""
    counter = iter(range(1_000_000))
    return lambda rank=8, seed=0: fake_adapter(tmp_path / f"adapter-{next(counter)}", rank, seed)


def _pass_at(c: int, n: int, k: int) -> float:
    return 1 - math.comb(n - c, k) / math.comb(n, k)


def task_split(counts: list[int], n: int = 4, ks: tuple[int, ...] = (1, 2, 4)) -> dict:
    """A report split as `sdarflow evaluate` writes it, from each task's successes (of ``n`` samples)."""
    ks = tuple(k for k in ks if k <= n)
    return {
        "n_tasks": len(counts),
        "samples_per_task": n,
        "pass_at_k": {str(k): sum(_pass_at(c, n, k) for c in counts) / len(counts) for k in ks},
        "ci95": {},
        "by_task_type": {},
        "task_successes": {f"task-{i:03d}": c for i, c in enumerate(counts)},
    }


def task_report(
    test: list[int], ood: list[int] | None = None, n: int = 4, adapter: str = "file:///a"
) -> dict:
    """An eval report from per-task success counts; ``ood=None`` leaves the ood split out."""
    splits = {"test": task_split(test, n)} | ({} if ood is None else {"ood": task_split(ood, n)})
    return {
        "adapter": adapter,
        "base_model": "tiny-qwen2",
        "splits": splits,
        "env": "tool-use",
        "protocol": FAKE_PROTOCOL | {"tasks": len(test)},  # evaluate plays as many tasks on every split
        # evaluated the default make_adapter() (tests.factories.bound binds a report to another adapter)
        "adapter_id": None if adapter in ("", "base") else fake_adapter_id(),
        "base_id": FAKE_BASE_ID,
    }


def _spread(rate: float, reach: float, n: int, counts: tuple[int, ...] = (20, 50, 100)) -> list[int]:
    """Per-task successes with ``reach`` of the tasks solved at least once and ``rate`` of all samples solved,
    spread as evenly as they go, on the fewest tasks (of ``counts``) that make both whole numbers."""
    for tasks in counts:
        solved, total = reach * tasks, rate * n * tasks
        if abs(solved - round(solved)) < 1e-9 and abs(total - round(total)) < 1e-9:
            solved, total = round(solved), round(total)
            assert solved <= total <= solved * n, (rate, reach)
            base, extra = divmod(total, solved) if solved else (0, 0)
            return [base + (i < extra) for i in range(solved)] + [0] * (tasks - solved)
    raise AssertionError(f"no task count fits pass@1 {rate} and pass@{n} {reach}")


def eval_report(test1: float, testk: float, ood1: float | None = None, k: int = 4) -> dict:
    """An eval report with test pass@1 ``test1`` and pass@k ``testk`` (and ood pass@1 ``ood1``, each ood task
    solved by all or none of its samples; None leaves the ood split out), with per-task results that agree."""
    test = _spread(test1, testk, k)
    ood = None if ood1 is None else _spread(ood1, ood1, k, tuple(c for c in (20, 50, 100) if c >= len(test)))
    if ood is not None and len(ood) > len(test):  # one task count on both splits, as evaluate plays them
        test = _spread(test1, testk, k, (len(ood),))
    return task_report(test, ood, n=k)


@pytest.fixture
def report() -> Callable[..., dict]:
    return eval_report


@pytest.fixture
def tasks() -> Callable[..., dict]:
    return task_report


@pytest.fixture
def lineage() -> dict:
    return {
        "run_id": "run-1",
        "base_model": "tiny-qwen2",
        "config_hash": "abc123",
        "data_uris": ["s3://data/runs/run-1/round=0/rescore"],
        "skill_library_version": "3",
    }
