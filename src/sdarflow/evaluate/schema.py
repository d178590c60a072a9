"""The eval report's schema, as every reader of it checks it (``register``, the promotion gate, a baseline):
``{"splits": {"test": {"pass_at_k": {"1": ...}, "ci95": {...}, "samples_per_task": n, "task_successes":
{task: c}}}}``. Other keys are kept, unchecked."""

from __future__ import annotations

from dataclasses import dataclass

from sdarflow.config import FileSchema, opt
from sdarflow.errors import ConfigError

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
        if n is None or any(c > n for c in self.task_successes.values()):
            raise ConfigError(f"task_successes must be counts of at most samples_per_task ({n}) each")
        per_task = sum(self.task_successes.values()) / (n * len(self.task_successes))
        if abs(per_task - ks["1"]) > _EPS:
            raise ConfigError(f"pass@1 {ks['1']:.4g} disagrees with its per-task results ({per_task:.4g})")


@dataclass
class EvalReport(FileSchema):
    splits: dict[str, SplitReport] = opt({}, "each evaluated split's figures, by split name")

    def validate(self) -> None:
        if "test" not in self.splits:
            raise ConfigError("splits: the test split, which the promotion gate compares, is missing")
