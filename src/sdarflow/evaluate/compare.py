"""Comparing two evaluations of the same tasks: the difference of their pass@k and a one-sided lower confidence
bound on it, so a gate can tell a real gain from the noise of a few dozen tasks (docs/evaluation.md).

The unit is the task (its samples are correlated). Evaluations of the same tasks are compared *paired*: with
``d_t = pass@k_a(t) - pass@k_b(t)`` over the ``m`` tasks,

    diff = mean_t d_t,    lower = min(diff - t_{conf, m-1} * sd(d) / sqrt(m),  sign-flip bound,  skew bound)

Student's bound assumes a near-normal mean, which fails when few tasks differ; the sign-flip bound
(:func:`sign_flip_lower`) does not, but it assumes differences symmetric about their mean; where most tasks gain a
little and a few collapse (a skewed difference), :func:`skew_corrected_lower` widens Student's bound by the sample
skewness. Task sets that differ are compared unpaired (Welch's standard error
``sqrt(sd_a^2 / m_a + sd_b^2 / m_b)``, with ``min(m_a, m_b) - 1`` degrees of freedom), for a run report's display
only: the gate never compares them (``registry.gate``). Fewer than two tasks on a side give no bound (None). Pure
functions of a report's split (``samples_per_task``, ``task_successes``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from sdarflow.evaluate.metrics import pass_at_k


def student_t_cdf(t: float, dof: int) -> float:
    """P(T <= t) for Student's t with an integer number of degrees of freedom, in closed form (Abramowitz &
    Stegun 26.7.3-4): with ``theta = atan(t / sqrt(dof))``, ``A = P(|T| < |t|)`` is
    ``sin(theta) * sum_{j < dof/2} prod_{i <= j} (2i - 1) / (2i) cos^2(theta)`` for even ``dof`` and
    ``(2 / pi) (theta + sin(theta) cos(theta) sum_{j <= (dof-3)/2} prod_{i <= j} 2i / (2i + 1) cos^2(theta))``
    for odd ``dof``."""
    if dof < 1:
        raise ValueError(f"Student's t needs dof >= 1, got {dof}")
    theta = math.atan(abs(t) / math.sqrt(dof))
    c2, s, odd = math.cos(theta) ** 2, math.sin(theta), dof % 2
    term, total = 1.0, 1.0
    for j in range(1, (dof - odd) // 2):  # factors (2j - 1) / (2j) for even dof, 2j / (2j + 1) for odd
        term *= c2 * (2 * j - 1 + odd) / (2 * j + odd)
        total += term
    if odd:
        a = (2 / math.pi) * (theta + (s * math.cos(theta) * total if dof > 1 else 0.0))
    else:
        a = s * total
    return 0.5 + math.copysign(a / 2, t)


def student_t_quantile(p: float, dof: int) -> float:
    """The ``p`` quantile of Student's t (``p`` in (0.5, 1)), by bisection on :func:`student_t_cdf`:
    ``t_{0.95}`` is 6.314 at 1 degree of freedom, 2.920 at 2, 1.696 at 31 and tends to 1.645."""
    if not 0.5 < p < 1:
        raise ValueError(f"quantile p={p} must be in (0.5, 1)")
    lo, hi = 0.0, 1.0
    while student_t_cdf(hi, dof) < p:
        lo, hi = hi, hi * 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if student_t_cdf(mid, dof) < p else (lo, mid)
        if hi - lo < 1e-12:
            break
    return (lo + hi) / 2


# Up to this many tasks every sign pattern is enumerated (2**16); beyond, a fixed sample of SIGN_FLIP_DRAWS.
SIGN_FLIP_EXACT_TASKS, SIGN_FLIP_DRAWS = 16, 20_000


def sign_flip_lower(d: np.ndarray, confidence: float = 0.95, seed: int = 0) -> float | None:
    """One-sided lower confidence bound on the mean of paired differences ``d`` (m,), by inverting the sign-flip
    (randomization) test: under ``H0: mean = mu`` with the ``d_t - mu`` symmetric about 0, every sign pattern
    ``e`` in {-1, +1}^m is equally likely, and ``p(mu) = P_e(sum_t e_t (d_t - mu) >= sum_t (d_t - mu))``.

    ``sum_t e_t (d_t - mu) >= sum_t (d_t - mu)`` holds exactly when ``mu >= mean of d over {t: e_t = -1}``, so
    ``p(mu)`` is the share of patterns whose flipped subset has a mean ``<= mu`` (the all-plus pattern always
    counts), and the bound ``sup {mu : p(mu) <= 1 - confidence}`` is an order statistic of the subset means
    (Hartigan 1969, JASA 64:1303, "Using subsample values as typical values"; Lehmann & Romano, Testing Statistical
    Hypotheses, 5.9). Exact for ``m <= SIGN_FLIP_EXACT_TASKS`` (all ``2**m`` patterns); else ``SIGN_FLIP_DRAWS``
    patterns drawn with ``seed`` plus the all-plus one, so a report is reproducible. None when even the most extreme
    pattern cannot reach the confidence (m = 4: 1/16 > 0.05): so few tasks cannot bound the difference."""
    d = np.asarray(d, dtype=np.float64)
    m = d.size
    if m <= SIGN_FLIP_EXACT_TASKS:
        chunks = [(np.arange(2**m)[:, None] >> np.arange(m)) & 1 == 1]  # (2**m, m) flipped; row 0 flips none
    else:
        rng = np.random.default_rng(seed)
        # in chunks, so a few thousand tasks need tens of MB, not GBs; the all-plus pattern counts once more
        chunks = [np.zeros((1, m), dtype=bool)] + [
            rng.random((min(1000, SIGN_FLIP_DRAWS - i), m)) < 0.5 for i in range(0, SIGN_FLIP_DRAWS, 1000)
        ]
    sums = np.concatenate([f @ d for f in chunks])  # (patterns,) sum of d over each flipped subset
    counts = np.concatenate([f.sum(axis=1) for f in chunks])
    subset_means = np.sort(sums[counts > 0] / counts[counts > 0])
    # p(mu) = (all-plus patterns + #{subset means <= mu}) / patterns <= alpha  <=>  #{... <= mu} <= allowed
    allowed = math.floor((1 - confidence) * len(sums) + 1e-9) - int((counts == 0).sum())
    return float(subset_means[allowed]) if allowed >= 0 else None


def skew_corrected_lower(d: np.ndarray, confidence: float = 0.95) -> float | None:
    """One-sided lower confidence bound on the mean of ``d`` (m,) with Student's quantile corrected for skewness
    (the one-term Cornish-Fisher correction of the studentized mean's Edgeworth expansion, Hall 1992, The Bootstrap
    and Edgeworth Expansion, 2.6; Johnson 1978, JASA 73:536):

        ``lower = mean - q * sd / sqrt(m)``,  ``q = t_{conf, m-1} - g (2 t_{conf, m-1}^2 + 1) / (6 sqrt(m))``

    with ``g = mean((d - mean)^3) / mean((d - mean)^2)^1.5`` the sample skewness. A long left tail (most tasks gain a
    little, a few lose a lot: g < 0) makes ``q`` larger and the bound lower; under that null (80% of tasks +0.25,
    20% -1, mean 0) Student's bound promotes 9.3% of 32-task comparisons, this one 3.0%
    (``bench/results/gate_null.json``). Identical differences (sd 0) give the mean; fewer than 2 give None."""
    d = np.asarray(d, dtype=np.float64)
    m = d.size
    if m < 2:
        return None
    centered = d - d.mean()
    second = float(np.mean(centered**2))
    g = float(np.mean(centered**3)) / second**1.5 if second > 0 else 0.0
    t = student_t_quantile(confidence, m - 1)
    q = t - g * (2 * t * t + 1) / (6 * math.sqrt(m))
    return float(d.mean()) - q * float(d.std(ddof=1)) / math.sqrt(m)


def mean_se(values: np.ndarray | list[float]) -> tuple[float, float, int]:
    """The mean of per-task values (m,), its standard error ``sd / sqrt(m)`` and degrees of freedom ``m - 1``.

    With per-task values averaged over seeds first, this is the cluster-robust standard error with tasks as the
    clusters, as Cameron & Miller (2015, J. Human Resources 50:317, "A Practitioner's Guide to Cluster-Robust
    Inference", VI.C) recommend for a few dozen clusters; a seeded simulation (tests/study/test_null_coverage.py)
    shows its interval covers a zero effect at its nominal rate where a percentile bootstrap of (seed, task) pairs
    does not. A single task gives its value with no spread (0 degrees of freedom)."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        raise ValueError("a mean over tasks needs at least one per-task value, got none")
    if v.size == 1:
        return float(v[0]), 0.0, 0
    return float(v.mean()), _spread(float(v.std(ddof=1)) / math.sqrt(v.size)), v.size - 1


def two_level_se(d: np.ndarray) -> tuple[float, float, int]:
    """The mean of paired differences ``d`` (S seeds, T tasks), its standard error and degrees of freedom: two
    methods trained with the same S seeds and evaluated on the same T tasks. Each trained adapter (a seed) moves
    every task a little the same way, so the tasks of one seed are not independent; the task term alone
    (:func:`mean_se` of each task's seed mean) misses that run-level variance (with a shift of sd 0.3 on the logit
    scale, 87% coverage instead of 95%). With ``se_task = sd_t(mean_s d) / sqrt(T)`` and ``se_seed = sd_s(mean_t d)
    / sqrt(S)``:

        ``se = sqrt(se_task^2 + se_seed^2)``,
        ``nu = floor((se_task^2 + se_seed^2)^2 / (se_task^4 / (T - 1) + se_seed^4 / (S - 1)))``

    (Welch-Satterthwaite degrees of freedom; each component counts the sampling noise once more, a conservative
    overlap). One seed gives :func:`mean_se` of the tasks; one task, its seeds'."""
    d = np.asarray(d, dtype=np.float64)
    if d.ndim != 2 or d.size == 0:
        raise ValueError(f"two_level_se needs (seeds, tasks) differences, got shape {d.shape}")
    seeds, tasks = d.shape
    if seeds == 1 or tasks == 1:
        return mean_se(d.ravel())
    se_task2 = float(d.mean(axis=0).var(ddof=1)) / tasks
    se_seed2 = float(d.mean(axis=1).var(ddof=1)) / seeds
    se2 = se_task2 + se_seed2
    if se2 == 0:
        return float(d.mean()), 0.0, 0
    nu = se2**2 / (se_task2**2 / (tasks - 1) + se_seed2**2 / (seeds - 1))
    return float(d.mean()), _spread(math.sqrt(se2)), max(1, math.floor(nu))


def _spread(se: float) -> float:
    """``se``, or 0 where it is rounding error (differences all equal to a value binary floats cannot hold, such as
    0.1, leave a standard error near 1e-17): the interval is then a point and no MDE is claimed."""
    return se if se > 1e-12 else 0.0


def t_interval(mean: float, se: float, dof: int, confidence: float = 0.95) -> tuple[float, float]:
    """``mean +- t_{(1+conf)/2, dof} * se``; a point where there is no spread (``se`` 0 or no degrees of freedom)."""
    if se == 0 or dof < 1:
        return (mean, mean)
    half = student_t_quantile((1 + confidence) / 2, dof) * se
    return (mean - half, mean + half)


def mean_interval(values: np.ndarray | list[float], confidence: float = 0.95) -> tuple[float, float]:
    """Two-sided Student t interval of the mean of per-task values (m,): ``mean +- t_{(1+conf)/2, m-1} sd / sqrt(m)``
    (:func:`mean_se`). A single task gives its value with no spread."""
    return t_interval(*mean_se(values), confidence)


def minimum_detectable_effect(
    se: float, dof: int, confidence: float = 0.95, power: float = 0.8
) -> float | None:
    """The smallest true difference a two-sided test at ``1 - confidence`` finds with probability about ``power``,
    given the estimate's standard error and degrees of freedom (the usual power formula with Student quantiles,
    e.g. Bloom 1995, "Minimum Detectable Effects", Evaluation Review 19:547):

        ``MDE = (t_{(1+conf)/2, dof} + t_{power, dof}) * se``

    At 31 degrees of freedom, 95% and 80% power, 2.040 + 0.853 = 2.89 standard errors; the formula is exact for
    large ``dof`` and a little generous at very few (the t test's power there is 77% at 2 degrees of freedom). What
    a null result could have seen: an effect below it was likely missed. None where the estimator sees no spread
    (``se`` 0, or no degrees of freedom)."""
    if se == 0 or dof < 1:
        return None
    return (student_t_quantile((1 + confidence) / 2, dof) + student_t_quantile(power, dof)) * se


@dataclass(frozen=True)
class Difference:
    """``candidate - reference`` on one split at one k, over ``tasks`` tasks (pairs, when ``paired``)."""

    k: int
    candidate: float
    reference: float
    diff: float
    lower: float | None  # one-sided lower bound of diff (the stricter below); None with < two tasks
    confidence: float
    tasks: int
    paired: bool
    t_lower: float | None = None  # Student's bound
    sign_flip_lower: float | None = None  # the sign-flip bound (paired only)
    skew_lower: float | None = None  # Student's bound corrected for skewness (paired only)


def task_pass_at_k(split: Mapping[str, Any], k: int) -> dict[str, float]:
    """Each task's unbiased pass@k from a report split's ``task_successes`` (of ``samples_per_task``)."""
    n = int(split["samples_per_task"])
    return {str(t): pass_at_k(n, int(c), k) for t, c in split["task_successes"].items()}


def difference(
    candidate: Mapping[str, Any], reference: Mapping[str, Any], k: int, confidence: float = 0.95
) -> Difference:
    """The pass@k difference of two report splits with its one-sided lower bound (see the module docstring)."""
    a, b = task_pass_at_k(candidate, k), task_pass_at_k(reference, k)
    if not a or not b:
        raise ValueError("difference needs at least one task on each side")
    paired = a.keys() == b.keys()
    va, vb = (np.array([x[t] for t in sorted(a)] if paired else list(x.values())) for x in (a, b))
    m, mean_a, mean_b = min(va.size, vb.size), float(va.mean()), float(vb.mean())
    if m < 2:
        se = None
    elif paired:
        se = float((va - vb).std(ddof=1)) / math.sqrt(m)
    else:
        se = math.sqrt(va.var(ddof=1) / va.size + vb.var(ddof=1) / vb.size)
    diff = mean_a - mean_b
    t_lower = None if se is None else diff - student_t_quantile(confidence, m - 1) * se
    flip = sign_flip_lower(va - vb, confidence) if paired and t_lower is not None else None
    skew = skew_corrected_lower(va - vb, confidence) if paired else None
    lower = (None if flip is None else min(t_lower, flip, skew)) if paired else t_lower
    return Difference(k, mean_a, mean_b, diff, lower, confidence, m, paired, t_lower, flip, skew)
