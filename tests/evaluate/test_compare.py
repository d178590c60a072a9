"""Student's t in closed form against published table values, and the paired / unpaired difference of two
evaluations with its one-sided lower bound, computed by hand."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from sdarflow.evaluate.compare import (
    difference,
    mean_interval,
    mean_se,
    minimum_detectable_effect,
    sign_flip_lower,
    skew_corrected_lower,
    student_t_cdf,
    student_t_quantile,
    t_interval,
    two_level_se,
)


def _split(successes: dict[str, int], n: int = 4) -> dict:
    return {"samples_per_task": n, "task_successes": successes}


@pytest.mark.parametrize(
    ("p", "dof", "table"),
    # t tables (e.g. NIST/SEMATECH e-Handbook 1.3.6.7.2), to the printed 3 decimals
    [(0.95, 1, 6.314), (0.95, 2, 2.920), (0.95, 3, 2.353), (0.95, 9, 1.833), (0.95, 31, 1.696),
     (0.975, 10, 2.228), (0.99, 5, 3.365), (0.95, 100, 1.660)],
)  # fmt: skip
def test_t_quantiles_match_the_tables(p, dof, table):
    assert student_t_quantile(p, dof) == pytest.approx(table, abs=6e-4)


def test_t_cdf_closed_forms():
    assert student_t_cdf(1.0, 1) == pytest.approx(0.75)  # Cauchy: 1/2 + atan(1)/pi
    assert student_t_cdf(-1.0, 1) == pytest.approx(0.25)
    assert student_t_cdf(0.0, 7) == 0.5
    t = 1.5  # dof 2: F = 1/2 + t / (2 sqrt(t^2 + 2))
    assert student_t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(t * t + 2)))
    # dof 3: F = 1/2 + (theta + sin(theta) cos(theta)) / pi, theta = atan(t / sqrt(3))
    theta = math.atan(t / math.sqrt(3))
    assert student_t_cdf(t, 3) == pytest.approx(0.5 + (theta + math.sin(theta) * math.cos(theta)) / math.pi)


def test_bad_quantile_arguments():
    with pytest.raises(ValueError, match="dof >= 1"):
        student_t_cdf(1.0, 0)
    with pytest.raises(ValueError, match=r"in \(0.5, 1\)"):
        student_t_quantile(0.4, 3)


def test_paired_difference_by_hand():
    # per-task pass@1 differences +.25, -.25, +.25, +.25 and six zeros: mean 0.05, sd sqrt(0.225 / 9) = 0.1581,
    # se 0.05, t_0.95(9) = 1.83311 -> t bound 0.05 - 0.091656 = -0.041656.
    # Sign flip, 2**10 = 1024 patterns: a flipped subset's mean is negative only when it holds the -.25 task and no
    # +.25 one: -.25 / (1 + z) with z of the six zeros, C(6, z) ways: 1 at -.25, 6 at -.125, 15 at -.0833, 20 at
    # -.0625 (42 in all), 15 at -.05. p(mu) = (1 + #{means <= mu}) / 1024 is 43/1024 = 0.042 just below -0.05 and
    # 58/1024 = 0.057 at it, so the 95% bound is -0.05: stricter than t's, and the bound the gate uses.
    cand = _split({f"t{i}": c for i, c in enumerate([3, 1, 3, 3, 2, 2, 2, 2, 2, 2])})
    prod = _split({f"t{i}": 2 for i in range(10)})
    d = difference(cand, prod, 1)
    assert (d.candidate, d.reference, d.tasks, d.paired) == (pytest.approx(0.55), 0.5, 10, True)
    assert d.diff == pytest.approx(0.05)
    assert d.t_lower == pytest.approx(-0.041656, abs=1e-5)
    assert d.sign_flip_lower == pytest.approx(-0.05) and d.lower == pytest.approx(-0.05)


def test_paired_pass_at_k_difference_by_hand():
    # pass@4 of a task with n = 4 samples is 1 when any succeeded: [1] * 7 + [0] * 3 against all 1
    # differences: seven 0, three -1 -> mean -0.3, sd sqrt((7 * 0.09 + 3 * 0.49) / 9) = 0.48305, se 0.152753
    cand = _split({f"t{i}": c for i, c in enumerate([4] * 7 + [0] * 3)})
    prod = _split({f"t{i}": 2 for i in range(10)})
    d = difference(cand, prod, 4)
    assert (d.candidate, d.reference, d.diff) == (pytest.approx(0.7), 1.0, pytest.approx(-0.3))
    assert d.t_lower == pytest.approx(-0.3 - 1.833113 * 0.152753, abs=1e-5)
    # sign flip: subsets with a of the three -1 tasks and z of the seven zeros have mean -a / (a + z); the 51st
    # smallest of the 1023 (the 5% point of 1024 patterns, the all-plus one counted) is -0.6 (a = 3, z = 2)
    assert d.sign_flip_lower == pytest.approx(-0.6)
    # skew: centered values 0.3 (x7) and -0.7 (x3); second moment (7 * .09 + 3 * .49) / 10 = 0.21, third
    # (7 * .027 - 3 * .343) / 10 = -0.084, g = -0.084 / 0.21 ** 1.5 = -0.872872; q = 1.833113 + 0.872872 * (2 *
    # 1.833113 ** 2 + 1) / (6 * sqrt(10)) = 2.188295; lower = -0.3 - 2.188295 * 0.152753 = -0.634268: the long
    # left tail (three collapses) makes it the strictest, so the gate's
    assert d.skew_lower == pytest.approx(-0.634268, abs=1e-5) and d.lower == d.skew_lower


def test_identical_gains_on_every_task_are_certain():
    d = difference(_split({f"t{i}": 2 for i in range(8)}), _split({f"t{i}": 1 for i in range(8)}), 1)
    assert d.diff == pytest.approx(0.25) and d.lower == pytest.approx(0.25)


def test_a_few_tasks_cannot_bound_a_paired_difference():
    # four tasks: all 16 sign patterns give p >= 1/16 > 0.05, so no 95% bound, however large the gains
    d = difference(_split({f"t{i}": 4 for i in range(4)}), _split({f"t{i}": 0 for i in range(4)}), 1)
    assert d.diff == 1.0 and d.t_lower == pytest.approx(1.0) and d.lower is None


def _p_value(d: list[float], mu: float) -> float:
    """The sign-flip p-value by its definition, every pattern enumerated."""
    x = np.array(d) - mu
    hits = [np.dot(e, x) >= x.sum() - 1e-12 for e in itertools.product([-1, 1], repeat=len(x))]
    return float(np.mean(hits))


@pytest.mark.parametrize(
    "d",
    [
        [0.25, 0.25, 0.25] + [0.0] * 7,
        [0.25] * 9 + [0.0],
        [0.5, -0.25, 0.75, 0.0, 0.25, 0.5, -0.5, 1.0, 0.25, 0.0, 0.25],
    ],
)
def test_the_sign_flip_bound_is_where_the_p_value_crosses_5_percent(d):
    bound = sign_flip_lower(np.array(d))
    assert _p_value(d, bound - 1e-9) <= 0.05 < _p_value(d, bound + 1e-9)


def test_three_of_32_tasks_gaining_once_is_not_a_gain():
    # p(0) = P(the three non-zero differences all come out +) = 1/8: the bound is 0, where Student's t gave +0.0012
    d = difference(
        _split({f"t{i}": int(i < 3) for i in range(32)}), _split({f"t{i}": 0 for i in range(32)}), 1
    )
    assert d.t_lower == pytest.approx(0.0012, abs=1e-4)
    assert d.sign_flip_lower == 0.0 and d.lower == 0.0


def test_many_tasks_use_a_seeded_sample_of_patterns_close_to_the_normal_bound():
    x = np.random.default_rng(3).normal(0.3, 1.0, 200)
    bound = sign_flip_lower(x)
    assert bound == sign_flip_lower(x)  # seeded
    assert bound == pytest.approx(x.mean() - 1.6525 * x.std(ddof=1) / math.sqrt(200), abs=0.02)


def test_mean_interval_by_hand():
    # mean 0.5, sd sqrt(((.5)^2 * 2) / 3) = 0.408248, se 0.204124, t_0.975(3) = 3.182446 -> half 0.649624
    lo, hi = mean_interval([0.0, 0.5, 0.5, 1.0])
    assert (lo, hi) == (pytest.approx(0.5 - 0.649624, abs=1e-5), pytest.approx(0.5 + 0.649624, abs=1e-5))
    assert mean_interval([0.3]) == (0.3, 0.3)
    with pytest.raises(ValueError, match="at least one"):
        mean_interval([])


def test_unpaired_when_the_tasks_differ():
    # candidate [.75, .75, .25, .25]: var 0.25 / 3; reference all .5: var 0; se sqrt(0.083333 / 4) = 0.144338;
    # dof min(4, 4) - 1 = 3, t_0.95(3) = 2.353363 -> lower -0.339677
    cand = _split({"a": 3, "b": 3, "c": 1, "d": 1})
    ref = _split({"w": 2, "x": 2, "y": 2, "z": 2})
    d = difference(cand, ref, 1)
    assert d.paired is False and d.diff == pytest.approx(0.0)
    assert d.lower == pytest.approx(-2.353363 * 0.144338, abs=1e-5)


def test_one_task_cannot_bound_a_difference():
    d = difference(_split({"a": 4}), _split({"a": 0}), 1)
    assert d.diff == 1.0 and d.lower is None


def test_skew_corrected_lower_by_hand():
    # symmetric differences (g = 0): Student's bound, 0.1 - t_0.95(3) * sd / 2 with sd = sqrt(0.02 / 3 * 2 / 2)
    d = np.array([0.0, 0.1, 0.1, 0.2])
    assert skew_corrected_lower(d) == pytest.approx(0.1 - 2.353363 * float(np.std(d, ddof=1)) / 2, abs=1e-6)
    # a right tail (g > 0) loosens it, a left tail tightens it: the gate takes the minimum with Student's
    right, left = np.array([0.0, 0.0, 0.0, 1.0]), np.array([0.0, 1.0, 1.0, 1.0])
    # right is a Bernoulli(1/4) sample: central moments p(1-p) = 3/16 and p(1-p)(1-2p) = 3/32, so g = (3/32) /
    # (3/16) ** 1.5 = 1.1547; left is its mirror, g = -1.1547
    g = (3 / 32) / (3 / 16) ** 1.5
    q = 2.353363 - g * (2 * 2.353363**2 + 1) / 12
    assert skew_corrected_lower(right) == pytest.approx(0.25 - q * float(np.std(right, ddof=1)) / 2, abs=1e-5)
    q = 2.353363 + g * (2 * 2.353363**2 + 1) / 12
    assert skew_corrected_lower(left) == pytest.approx(0.75 - q * float(np.std(left, ddof=1)) / 2, abs=1e-5)
    assert skew_corrected_lower(np.array([0.25] * 5)) == 0.25  # no spread: the mean
    assert skew_corrected_lower(np.array([0.5])) is None


def test_two_level_interval_by_hand():
    # 2 seeds x 2 tasks: task means over seeds 0.2, 0.4 (variance 0.02, se_task^2 = 0.02 / 2 = 0.01); seed means
    # 0.2, 0.4 (se_seed^2 = 0.01); nu = 0.02^2 / (0.01^2 / 1 + 0.01^2 / 1) = 2, t_0.975(2) = 4.302653
    lo, hi = t_interval(*two_level_se(np.array([[0.1, 0.3], [0.3, 0.5]])))
    half = 4.302653 * math.sqrt(0.02)
    assert (lo, hi) == (pytest.approx(0.3 - half, abs=1e-6), pytest.approx(0.3 + half, abs=1e-6))
    # one seed: the interval over tasks; identical differences: a point, also where floats round 0.1 (se ~1e-17)
    assert t_interval(*two_level_se(np.array([[0.1, 0.3, 0.2]]))) == mean_interval([0.1, 0.3, 0.2])
    assert t_interval(*two_level_se(np.full((3, 4), 0.25))) == (0.25, 0.25)
    assert two_level_se(np.full((3, 4), 0.1))[1] == 0.0 and mean_se([0.1] * 3)[1] == 0.0
    with pytest.raises(ValueError, match="needs \\(seeds, tasks\\)"):
        two_level_se(np.zeros(3))


def test_minimum_detectable_effect_by_hand():
    # 31 tasks: t_0.975(30) = 2.042272, t_0.8(30) = 0.853767 (t tables); se 0.02 -> 0.057921
    assert minimum_detectable_effect(0.02, 30) == pytest.approx((2.042272 + 0.853767) * 0.02, abs=1e-6)
    # the two-level example above: se sqrt(0.02), nu 2; t_0.975(2) = 4.302653, t_0.8(2) = 1.060660
    _, se, dof = two_level_se(np.array([[0.1, 0.3], [0.3, 0.5]]))
    assert (se, dof) == (pytest.approx(math.sqrt(0.02)), 2)
    assert minimum_detectable_effect(se, dof) == pytest.approx(
        (4.302653 + 1.060660) * math.sqrt(0.02), abs=1e-6
    )
    # 90% power at 99%: t_0.995(30) = 2.749996, t_0.9(30) = 1.310415
    assert minimum_detectable_effect(0.02, 30, 0.99, 0.9) == pytest.approx(
        (2.749996 + 1.310415) * 0.02, abs=1e-6
    )
    # no spread (one task, or the same difference everywhere): nothing to say
    assert minimum_detectable_effect(0.0, 30) is None
    assert minimum_detectable_effect(0.1, 0) is None
    assert two_level_se(np.full((3, 4), 0.25)) == (0.25, 0.0, 0)
