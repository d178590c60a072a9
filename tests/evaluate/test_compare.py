"""Student's t in closed form against published table values, and the paired / unpaired difference of two
evaluations with its one-sided lower bound, computed by hand."""

from __future__ import annotations

import math

import pytest

from sdarflow.evaluate.compare import difference, student_t_cdf, student_t_quantile


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
    # se 0.05, t_0.95(9) = 1.83311 -> lower 0.05 - 0.091656 = -0.041656
    cand = _split({f"t{i}": c for i, c in enumerate([3, 1, 3, 3, 2, 2, 2, 2, 2, 2])})
    prod = _split({f"t{i}": 2 for i in range(10)})
    d = difference(cand, prod, 1)
    assert (d.candidate, d.reference, d.tasks, d.paired) == (pytest.approx(0.55), 0.5, 10, True)
    assert d.diff == pytest.approx(0.05)
    assert d.lower == pytest.approx(-0.041656, abs=1e-5)


def test_paired_pass_at_k_difference_by_hand():
    # pass@4 of a task with n = 4 samples is 1 when any succeeded: [1] * 7 + [0] * 3 against all 1
    # differences: seven 0, three -1 -> mean -0.3, sd sqrt((7 * 0.09 + 3 * 0.49) / 9) = 0.48305, se 0.152753
    cand = _split({f"t{i}": c for i, c in enumerate([4] * 7 + [0] * 3)})
    prod = _split({f"t{i}": 2 for i in range(10)})
    d = difference(cand, prod, 4)
    assert (d.candidate, d.reference, d.diff) == (pytest.approx(0.7), 1.0, pytest.approx(-0.3))
    assert d.lower == pytest.approx(-0.3 - 1.833113 * 0.152753, abs=1e-5)


def test_identical_gains_on_every_task_are_certain():
    d = difference(_split({"a": 2, "b": 2}), _split({"a": 1, "b": 1}), 1)
    assert d.diff == pytest.approx(0.25) and d.lower == pytest.approx(0.25)


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
