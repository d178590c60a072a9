"""Does the teacher tell good turns from bad ones? SDAR's premise, measured where it can be: the gate and the gap
``q - s`` (each a turn's mean over its response tokens) on turns whose action was the env expert's against the
other turns, and on turns of successful episodes against those of failed ones. Each contrast is a difference of
turn means with a 95% interval from a bootstrap over tasks (the unit shared by a task's samples, so its turns are
not independent); with fewer than ``MIN_TASKS`` tasks on a side there is no interval worth printing, and the
contrast says "n/a (N tasks)" instead of a zero-width one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MIN_TASKS = 5  # tasks each side needs before its difference gets an interval
DRAWS = 2000
# (contrast name, what its two sides are)
CONTRASTS: dict[str, tuple[str, str]] = {
    "expert": ("turns that took the expert's action", "other turns"),
    "success": ("turns of successful episodes", "turns of failed episodes"),
}
QUANTITIES = ("gate", "gap")


@dataclass(frozen=True)
class TurnScore:
    """One turn: its task, its episode's success, whether it took the expert's action (None: no label), and its
    response tokens' mean gate ``sigmoid(beta (q - s))`` and mean gap ``q - s``."""

    task_id: str
    success: bool
    expert_match: bool | None
    gate: float
    gap: float


def turn_scores(
    task_ids: Sequence[str],
    success: Sequence[bool],
    expert_match: Sequence[bool | None],
    student: Sequence[Sequence[float]],
    teacher: Sequence[Sequence[float]],
    beta: float,
) -> list[TurnScore]:
    """Each turn's :class:`TurnScore` (turns without response tokens are left out)."""
    out = []
    for task, won, match, s, q in zip(task_ids, success, expert_match, student, teacher, strict=True):
        if not s:
            continue
        gaps = [b - a for a, b in zip(s, q, strict=True)]
        gate = sum(1.0 / (1.0 + math.exp(-beta * g)) for g in gaps) / len(gaps)
        out.append(TurnScore(task, bool(won), match, gate, sum(gaps) / len(gaps)))
    return out


@dataclass(frozen=True)
class Contrast:
    """``mean(side a) - mean(side b)`` of one quantity over turns, with its task-bootstrap 95% interval (both None
    below ``MIN_TASKS`` tasks on a side)."""

    a: float | None
    b: float | None
    diff: float | None
    ci95: tuple[float, float] | None
    tasks_a: int
    tasks_b: int

    def text(self, digits: int = 3) -> str:
        if self.diff is None or self.ci95 is None:
            return f"n/a ({min(self.tasks_a, self.tasks_b)} tasks)"
        lo, hi = self.ci95
        return f"{self.diff:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]"


def contrast(
    turns: Sequence[TurnScore], side: Sequence[bool | None], quantity: str, seed: int = 0
) -> Contrast:
    """The difference between the turns with ``side`` True and those with False (None: left out) of ``quantity``
    ("gate" or "gap"). The interval resamples tasks with replacement (each drawn task brings all its turns) and
    takes the 2.5% and 97.5% quantiles of the difference of turn means; seeded, so reports are reproducible."""
    tasks = sorted({t.task_id for t, s in zip(turns, side, strict=True) if s is not None})
    index = {t: i for i, t in enumerate(tasks)}
    # per task: sum and count of the quantity on side a (True) and side b (False)
    sums, counts = np.zeros((2, len(tasks))), np.zeros((2, len(tasks)))
    for t, s in zip(turns, side, strict=True):
        if s is not None:
            k = 0 if s else 1
            sums[k, index[t.task_id]] += getattr(t, quantity)
            counts[k, index[t.task_id]] += 1
    n_a, n_b = int((counts[0] > 0).sum()), int((counts[1] > 0).sum())
    means = [float(sums[k].sum() / counts[k].sum()) if counts[k].sum() else None for k in (0, 1)]
    if means[0] is None or means[1] is None:
        return Contrast(means[0], means[1], None, None, n_a, n_b)
    if min(n_a, n_b) < MIN_TASKS:  # too few tasks for an interval: no difference either, so none is read
        return Contrast(means[0], means[1], None, None, n_a, n_b)
    diff = means[0] - means[1]
    rng = np.random.default_rng(seed)
    drawn = rng.integers(0, len(tasks), size=(DRAWS, len(tasks)))
    weight = np.zeros((DRAWS, len(tasks)))
    np.add.at(weight, (np.arange(DRAWS)[:, None], drawn), 1.0)  # how often each task was drawn
    num, den = weight @ sums.T, weight @ counts.T  # (DRAWS, 2)
    ok = (den > 0).all(axis=1)  # a draw without a side's tasks has no difference
    diffs = num[ok, 0] / den[ok, 0] - num[ok, 1] / den[ok, 1]
    lo, hi = np.quantile(diffs, [0.025, 0.975])
    return Contrast(means[0], means[1], diff, (float(lo), float(hi)), n_a, n_b)


def discrimination(turns: Sequence[TurnScore]) -> dict[str, dict[str, Contrast]]:
    """Every contrast of :data:`CONTRASTS` for every quantity of :data:`QUANTITIES`."""
    sides = {"expert": [t.expert_match for t in turns], "success": [t.success for t in turns]}
    return {name: {q: contrast(turns, sides[name], q) for q in QUANTITIES} for name in CONTRASTS}


def discrimination_metrics(table: dict[str, dict[str, Contrast]]) -> dict[str, float]:
    """``rescore/discrimination/<contrast>/<quantity>`` (the difference) with ``.../lo`` and ``.../hi`` where it
    has an interval: what the KFP UI and the tracking server chart."""
    out: dict[str, float] = {}
    for name, by_quantity in table.items():
        for q, c in by_quantity.items():
            key = f"rescore/discrimination/{name}/{q}"
            if c.diff is not None and c.ci95 is not None:
                out[key] = c.diff
                out[f"{key}/lo"], out[f"{key}/hi"] = c.ci95
    return out


def discrimination_rows(table: dict[str, dict[str, Contrast]]) -> list[list[str]]:
    """The report's rows: contrast, its sides' turn means and the difference with its interval, per quantity."""
    rows = []
    for name, (a, b) in CONTRASTS.items():
        for q in QUANTITIES:
            c = table[name][q]
            means = " / ".join("-" if m is None else f"{m:.3f}" for m in (c.a, c.b))
            rows.append([f"{a} - {b}", q, means, c.text(), f"{c.tasks_a} / {c.tasks_b}"])
    return rows


DISCRIMINATION_HEADER = ["contrast", "quantity", "means (a / b)", "difference [95% CI]", "tasks (a / b)"]
