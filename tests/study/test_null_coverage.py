"""The study's intervals cover what they claim on data shaped like a study's: every cell evaluated on the same tasks,
per-task effects that persist across seeds, and the same sampling noise wherever the sampling seeds agree. 400
seeded simulated studies each; a 95% interval must cover the truth in 90-97% of them (a paired difference, also
under a run-level shift: 93-98%). Resampling (seed, task) pairs as if independent covered a zero effect in about
77% of them."""

from __future__ import annotations

import numpy as np
import pytest

from sdarflow.study_report import paired, pooled

STUDIES, TASKS, SEEDS, SAMPLES = 400, 32, 3, 4


def _split(successes: np.ndarray) -> dict:
    return {"samples_per_task": SAMPLES, "task_successes": {f"t{i}": int(c) for i, c in enumerate(successes)}}


def _evals(rng, logit: np.ndarray, uniforms: np.ndarray, run_shift: float) -> list[dict]:
    """One method's eval reports, one per seed: each trained adapter shifts every task together (sd ``run_shift``
    on the logit scale: a run that went well or badly) and moves each a little more (0.3) around the method's
    per-task level; ``uniforms`` (tasks, samples) are the shared sampling draws."""
    reports = []
    for _ in range(SEEDS):
        p = 1 / (1 + np.exp(-(logit + rng.normal(0, run_shift) + rng.normal(0, 0.3, TASKS))))
        reports.append({"test": _split((uniforms < p[:, None]).sum(axis=1))})
    return reports


@pytest.mark.parametrize("run_shift", [0.0, 0.3])
@pytest.mark.parametrize("shared_sampling", [True, False])
def test_a_paired_interval_covers_a_zero_effect_at_its_nominal_rate(shared_sampling, run_shift):
    """With a run-level shift (sd 0.3) the interval over tasks alone covered 0.87: the seed component counts it."""
    rng = np.random.default_rng(2026)
    covered = 0
    for _ in range(STUDIES):
        difficulty = rng.normal(-1.5, 1.5, TASKS)  # the tasks every cell is evaluated on
        draws = rng.random((TASKS, SAMPLES))
        # no effect on the task population: each method's per-task deviation comes from the same distribution
        a = _evals(rng, difficulty + rng.normal(0, 0.8, TASKS), draws, run_shift)
        other_draws = draws if shared_sampling else rng.random(draws.shape)
        b = _evals(rng, difficulty + rng.normal(0, 0.8, TASKS), other_draws, run_shift)
        lo, hi = paired(a, b, "test", 1)["ci95"]
        covered += lo <= 0 <= hi
    assert 0.93 <= covered / STUDIES <= 0.98, covered / STUDIES


def test_a_pooled_interval_covers_the_population_value_at_its_nominal_rate():
    rng = np.random.default_rng(7)
    population = 1 / (1 + np.exp(-rng.normal(-1.0, 1.5, 20_000)))  # each task's success probability
    truth = population.mean()
    covered = 0
    for _ in range(STUDIES):
        p = rng.choice(population, TASKS)
        evals = [
            {"test": _split(rng.binomial(SAMPLES, p))} for _ in range(SEEDS)
        ]  # the same tasks every seed
        lo, hi = pooled(evals, "test", 1)["ci95"]
        covered += lo <= truth <= hi
    assert 0.90 <= covered / STUDIES <= 0.97, covered / STUDIES
