"""Evaluation metrics: the unbiased pass@k estimator, confidence intervals that hold for small counts (Wilson for a
proportion, a task-level bootstrap for pass@k), and the per-split summary that becomes a report's ``splits``.
Pure functions of episode results (dicts with :data:`EPISODE_KEYS`; ``format_errors`` counts turns whose action
could not be parsed, ``actions`` the turns taken), no I/O."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sdarflow.config import FileSchema, opt
from sdarflow.errors import ConfigError
from sdarflow.intervals import wilson_interval

# The evaluate stage publishes the report as this file of an artifact of this kind.
REPORT = "report.json"
REPORT_KIND = "eval-report"
BASE_ADAPTER = "base"  # the adapter a report of the base model itself (no adapter) names

EPISODE_KEYS: tuple[str, ...] = (
    "task_id",
    "task_type",
    "split",
    "success",
    "turns",
    "format_errors",
    "actions",
)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task from ``n`` samples of which ``c`` succeeded (Chen et al. 2021, arXiv:2107.03374):
    ``1 - C(n - c, k) / C(n, k)``, computed as the Codex paper's ``1 - prod_{i = n-c+1}^{n} (1 - k / i)`` (no huge
    binomials); exactly 1 when ``n - c < k`` (every draw of ``k`` must contain a success)."""
    if n < 1:
        raise ValueError(f"pass@k needs n >= 1 samples, got n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"successes c={c} must be in [0, n={n}]")
    if not 1 <= k <= n:
        raise ValueError(
            f"k={k} must be in [1, n={n}]: pass@k draws k of the n samples; lower k or sample more"
        )
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def ks_for(n: int) -> list[int]:
    """The k values reported for ``n`` samples per task: ``1, 2, 4, ... <= n``, plus ``n`` if not a power of two."""
    if n < 1:
        raise ValueError(f"ks_for needs n >= 1 samples per task, got n={n}")
    ks = [1 << i for i in range(n.bit_length())]  # every 2**i with i < bit_length(n) is <= n
    if ks[-1] != n:
        ks.append(n)
    return ks


def bootstrap_interval(
    per_task_values: Sequence[float], draws: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """95% percentile bootstrap interval of the mean over tasks, resampling tasks with replacement.

    Tasks, not episodes, are the unit: samples of one task are correlated, so the interval reflects how much the
    score would move on a different draw of tasks. Seeded, so a report is reproducible.
    """
    values = np.asarray(per_task_values, dtype=np.float64)
    if values.size == 0:
        raise ValueError("bootstrap_interval needs at least one per-task value, got none")
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, values.size, size=(draws, values.size))].mean(axis=1)
    lo, hi = np.quantile(means, [0.025, 0.975])
    return (float(lo), float(hi))


def pass_at_k_interval(
    per_task: Sequence[float],
    k: int,
    successes: int,
    trials: int,
    spread: Callable[[Sequence[float]], tuple[float, float]] = bootstrap_interval,
) -> tuple[float, float]:
    """95% interval of the mean pass@k over tasks; ``spread`` is the interval over tasks (the task bootstrap, or
    the study's cluster-robust t interval over seed-averaged tasks).

    k = 1: the union of the Wilson interval of all ``successes / trials`` episodes (right for small counts) and
    the task interval (which adds the spread between tasks). k > 1: the task interval; where every task scored
    the same (the bootstrap collapses to a point, e.g. all 0), the interval implied by pass@1's Wilson interval
    ``[lo_1, 1 - (1 - hi_1)^k]``, since ``pass@1 <= pass@k <= 1 - (1 - pass@1)^k`` (Jensen, pass@k concave in p).
    """
    w_lo, w_hi = wilson_interval(successes, trials)
    b_lo, b_hi = spread(per_task)
    b_lo, b_hi = max(0.0, b_lo), min(1.0, b_hi)  # a t interval is not confined to [0, 1] by itself
    if k == 1:
        return (min(w_lo, b_lo), max(w_hi, b_hi))
    if b_hi - b_lo > 0:
        return (b_lo, b_hi)
    return (w_lo, 1.0 - (1.0 - w_hi) ** k)


def _group_by_task(
    split: str, episodes: Iterable[Mapping[str, Any]]
) -> tuple[dict[str, list[bool]], dict[str, str], int]:
    """task_id -> success flags, task_id -> task_type (one per task), and the samples per task, which must be
    the same for every task (unequal counts would weight tasks unevenly in pass@k)."""
    outcomes: dict[str, list[bool]] = {}
    task_types: dict[str, str] = {}
    for ep in episodes:
        task_id, task_type = str(ep["task_id"]), str(ep["task_type"])
        if task_types.setdefault(task_id, task_type) != task_type:
            raise ValueError(
                f"split {split!r}: task {task_id!r} has task_type {task_types[task_id]!r} and {task_type!r}; "
                "a task has one type"
            )
        outcomes.setdefault(task_id, []).append(bool(ep["success"]))
    first_task, first = next(iter(outcomes.items()))
    for task_id, flags in outcomes.items():
        if len(flags) != len(first):
            raise ValueError(
                f"split {split!r}: task {task_id!r} has {len(flags)} episodes but task {first_task!r} has "
                f"{len(first)}; every task needs the same number of samples (rerun evaluation for that task)"
            )
    return outcomes, task_types, len(first)


def _mean_pass_at_k(
    per_task: Mapping[str, Mapping[int, float]], task_ids: Iterable[str], ks: Sequence[int]
) -> dict[str, float]:
    ids = list(task_ids)
    return {str(k): float(np.mean([per_task[t][k] for t in ids])) for k in ks}


def _summarize_split(split: str, episodes: Sequence[Mapping[str, Any]], ks: Sequence[int] | None) -> dict:
    outcomes, task_types, n = _group_by_task(split, episodes)
    split_ks = sorted(set(ks)) if ks is not None else ks_for(n)
    too_big = [k for k in split_ks if k > n]
    if too_big:
        raise ValueError(f"split {split!r}: ks {too_big} exceed the {n} samples per task; use ks <= {n}")
    # (task, k) -> pass@k of that task
    per_task = {t: {k: pass_at_k(n, sum(flags), k) for k in split_ks} for t, flags in outcomes.items()}
    successes = sum(sum(flags) for flags in outcomes.values())
    by_type: dict[str, list[str]] = {}
    for task_id, task_type in task_types.items():
        by_type.setdefault(task_type, []).append(task_id)
    actions = sum(int(ep["actions"]) for ep in episodes)
    return {
        "n_tasks": len(outcomes),
        "samples_per_task": n,
        "pass_at_k": _mean_pass_at_k(per_task, outcomes, split_ks),
        "ci95": {
            str(k): list(
                pass_at_k_interval([per_task[t][k] for t in outcomes], k, successes, n * len(outcomes))
            )
            for k in split_ks
        },
        "by_task_type": {
            task_type: {"n_tasks": len(ids), "pass_at_k": _mean_pass_at_k(per_task, ids, split_ks)}
            for task_type, ids in sorted(by_type.items())
        },
        # successes per task (of samples_per_task): what paired comparisons between runs on the same tasks need
        "task_successes": {t: sum(flags) for t, flags in outcomes.items()},
        "success_rate": float(np.mean([bool(ep["success"]) for ep in episodes])),
        # Zero actions would mean no turn was taken at all; report 0 errors rather than divide by zero.
        "format_error_rate": sum(int(ep["format_errors"]) for ep in episodes) / actions if actions else 0.0,
        "mean_turns": float(np.mean([int(ep["turns"]) for ep in episodes])),
    }


def split_results(episodes: Sequence[Mapping[str, Any]], ks: Sequence[int] | None = None) -> dict[str, dict]:
    """Per-split summary of episode results (the ``splits`` part of the report), in order of first appearance;
    ``ks`` defaults to :func:`ks_for` of each split's samples per task."""
    if not episodes:
        raise ValueError(
            "split_results needs episode results, got none; did the evaluate stage run any task?"
        )
    by_split: dict[str, list[Mapping[str, Any]]] = {}
    for i, ep in enumerate(episodes):
        missing = [key for key in EPISODE_KEYS if key not in ep]
        if missing:
            raise ValueError(f"episode {i} lacks keys {missing}; every episode needs {list(EPISODE_KEYS)}")
        by_split.setdefault(str(ep["split"]), []).append(ep)
    return {split: _summarize_split(split, eps, ks) for split, eps in by_split.items()}


def build_report(
    episodes: Sequence[Mapping[str, Any]],
    *,
    adapter: str,
    base_model: str,
    ks: Sequence[int] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """``{"adapter", "base_model", "splits": split_results(episodes, ks), **extra}`` (``extra``: lineage)."""
    if "splits" in extra:
        raise ValueError("build_report computes 'splits' itself; do not pass it as an extra field")
    return {"adapter": adapter, "base_model": base_model, "splits": split_results(episodes, ks), **extra}


# The report's schema, as every reader checks it (register, the promotion gate, a baseline); other keys are kept.
_EPS = 1e-6  # pass@1 is a mean of counts: JSON's rounding, never a different count


@dataclass
class SplitReport(FileSchema):
    pass_at_k: dict[str, float] = opt({}, "pass@k by k = 1, 2, ...", ge=0, le=1)
    ci95: dict[str, tuple[float, float]] = opt({}, "95-percent interval of each pass@k", ge=0, le=1)
    n_tasks: int | None = opt(None, "tasks evaluated", gt=0)
    samples_per_task: int | None = opt(None, "samples per task (n of pass@k)", gt=0)
    task_successes: dict[str, int] = opt({}, "successes of each task, out of samples_per_task", ge=0)

    def validate(self) -> None:
        ks = self.pass_at_k
        if "1" not in ks or not all(k.isascii() and k.isdigit() and int(k) > 0 for k in ks):
            raise ConfigError(f"pass_at_k keys {sorted(ks)} must be k = 1, 2, ... and include 1")
        values = [ks[k] for k in sorted(ks, key=int)]
        if any(b < a - 1e-9 for a, b in zip(values, values[1:])):
            raise ConfigError(f"pass@k {values} must not decrease as k grows")
        n = self.samples_per_task
        if n is not None and max(map(int, ks)) > n:
            raise ConfigError(f"pass@k with k above samples_per_task ({n})")
        for k, (lo, hi) in self.ci95.items():
            if k not in ks or lo > hi:
                raise ConfigError(f"ci95.{k} = [{lo}, {hi}] is not an interval for a reported pass@{k}")
        if not self.task_successes:
            return
        if self.n_tasks is not None and self.n_tasks != len(self.task_successes):
            raise ConfigError(
                f"n_tasks {self.n_tasks} but {len(self.task_successes)} tasks in task_successes"
            )
        if n is None or any(c > n for c in self.task_successes.values()):
            raise ConfigError(f"task_successes must be counts of at most samples_per_task ({n}) each")
        per_task = sum(self.task_successes.values()) / (n * len(self.task_successes))
        if abs(per_task - ks["1"]) > _EPS:
            raise ConfigError(f"pass@1 {ks['1']:.4g} disagrees with its per-task results ({per_task:.4g})")


# The evaluate settings a report records as its protocol (besides its env and each split's samples per task): the
# gate pairs two reports task by task only when they are equal: the same task window and seed, played alike.
PROTOCOL = (
    "temperature",
    "max_turns",
    "max_new_tokens",
    "history_turns",
    "prompt_format",
    "first_task",
    "tasks",
    "seed",
)


@dataclass
class EvalReport(FileSchema):
    splits: dict[str, SplitReport] = opt({}, "each evaluated split's figures, by split name")

    def validate(self) -> None:
        if "test" not in self.splits:
            raise ConfigError("splits: the test split, which the promotion gate compares, is missing")
