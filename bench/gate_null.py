"""The promotion gate's false promotion rate, simulated: how often ``evaluate.compare.difference`` (the gate's
paired lower bound, the stricter of Student's, the sign-flip and the skew-corrected bound) clears ``min_gain 0``
when the candidate is no better, and how often it does when it is.

Per-task differences of pass@1 (4 samples a task, as the pipeline evaluates) under

- the exchangeable null: candidate and reference share each task's success rate (drawn uniformly), so every
  difference is symmetric about 0 (what the sign-flip bound assumes);
- the skewed null: most tasks gain +0.25 and 20% collapse by -1 (mean 0): the case a symmetric bound misses;
- a milder skewed null: 10% of tasks collapse by -1, the others gain +1/9 (mean 0);
- a real gain: each task's candidate solves one more of its 4 samples with probability 0.4 (power).

Each bound's rate is reported alone too, so the table shows what each one buys; the gate's column is the default
policy's decision: the strictest bound, on at least ``min_tasks`` tasks (fewer are not judged: no promotion).
Pure numpy on the gate's own functions; about 8 minutes on 2 cores. ``python -m bench.gate_null [--sims N]``.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from bench.common import write_result
from sdarflow.evaluate.compare import sign_flip_lower, skew_corrected_lower, student_t_quantile
from sdarflow.registry.gate import GATE

TASKS = (16, 32, 64)
SAMPLES = 4  # per task, as the pipeline's evaluate
BOUNDS = ("t", "sign_flip", "skew", "gate")


def exchangeable(rng: np.random.Generator, n: int) -> np.ndarray:
    p = rng.uniform(0, 1, n)
    return (rng.binomial(SAMPLES, p) - rng.binomial(SAMPLES, p)) / SAMPLES


def skewed(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.where(rng.random(n) < 0.2, -1.0, 0.25)


def skewed_mild(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.where(rng.random(n) < 0.1, -1.0, 1 / 9)


def gain(rng: np.random.Generator, n: int) -> np.ndarray:
    p = rng.uniform(0, 1, n)
    reference = rng.binomial(SAMPLES, p)
    candidate = np.minimum(SAMPLES, rng.binomial(SAMPLES, p) + (rng.random(n) < 0.4))
    return (candidate - reference) / SAMPLES


SCENARIOS = {
    "exchangeable null": exchangeable,
    "skewed null": skewed,
    "mild skewed null": skewed_mild,
    "gain": gain,
}


def bounds(d: np.ndarray, seed: int) -> dict[str, float | None]:
    """Each lower bound of the mean of ``d`` as ``difference`` computes it, and the gate's (their minimum, None
    below the default policy's ``min_tasks``)."""
    n = d.size
    t = float(d.mean()) - student_t_quantile(0.95, n - 1) * float(d.std(ddof=1)) / math.sqrt(n)
    flip = sign_flip_lower(d, 0.95, seed=seed)
    skew = skew_corrected_lower(d, 0.95)
    judged = flip is not None and n >= GATE.min_tasks
    return {"t": t, "sign_flip": flip, "skew": skew, "gate": min(t, flip, skew) if judged else None}


def promotion_rates(scenario, n: int, sims: int, rng: np.random.Generator) -> dict[str, float]:
    """The share of ``sims`` simulated comparisons of ``n`` tasks whose bound is above 0 (a promotion)."""
    passed = dict.fromkeys(BOUNDS, 0)
    for i in range(sims):
        for name, lower in bounds(scenario(rng, n), seed=i).items():
            passed[name] += lower is not None and lower > 1e-9
    return {name: count / sims for name, count in passed.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gate_null")
    p.add_argument("--sims", type=int, default=4000, help="simulated comparisons per scenario and task count")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    rates = {
        name: {str(n): promotion_rates(make, n, args.sims, rng) for n in TASKS}
        for name, make in SCENARIOS.items()
    }
    # a rate's 95% Monte Carlo half-width at 5%: what the simulation can tell from the 5% target
    result = {
        "sims": args.sims,
        "seed": args.seed,
        "tasks": list(TASKS),
        "samples_per_task": SAMPLES,
        "min_tasks": GATE.min_tasks,
        "rates": rates,
        "mc_halfwidth_at_5pct": 1.96 * math.sqrt(0.05 * 0.95 / args.sims),
        "seconds": time.perf_counter() - t0,
    }
    rows = [(f"{name}, {n} tasks", *(f"{b} {r[b]:.3f}" for b in BOUNDS)) for name, by_n in rates.items()
            for n, r in by_n.items()]  # fmt: skip
    write_result("gate_null", result, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
