"""The format-collapse detector on synthetic series, and the guard reading a lineage's rates."""

from __future__ import annotations

import pytest

from sdarflow.train.format_guard import check_round, format_spike


def test_spike_needs_both_a_multiple_and_a_jump_over_the_moving_baseline():
    assert format_spike([0.02, 0.04, 0.03], 0.5) == pytest.approx(0.03)
    assert format_spike([0.02, 0.04, 0.03], 0.08) is None  # 2.7x the baseline but only +0.05
    assert format_spike([0.3, 0.3, 0.3], 0.45) is None  # +0.15 but 1.5x, and the parse rate 0.7 -> 0.55
    # above a baseline of 0.5 errors cannot double: the well-formed share halving is the spike
    assert format_spike([0.44, 0.56, 0.56], 1.0) == pytest.approx(0.52)  # parse rate 0.48 -> 0
    assert format_spike([0.44, 0.56, 0.56], 0.8) == pytest.approx(0.52)  # 0.48 -> 0.2 <= 0.24
    assert format_spike([0.44, 0.56, 0.56], 0.7) is None  # 0.48 -> 0.3, not halved
    assert format_spike([], 0.9) is None  # no baseline yet
    # the baseline is the last 3 rounds: an old bad round does not hide a new spike
    assert format_spike([0.9, 0.01, 0.01, 0.01], 0.2) == pytest.approx(0.01)


def test_the_detector_finds_the_round_a_synthetic_collapse_starts():
    # success ~85% -> ~12% in one round shows as format errors 5% -> 62% (then staying high)
    series = [0.05, 0.04, 0.06, 0.05, 0.62, 0.70, 0.71]
    flagged = [i for i in range(len(series)) if format_spike(series[:i], series[i]) is not None]
    # the collapse stays flagged: its rounds never join the baseline (0.05, mean of the 3 clean rounds before)
    assert flagged == [4, 5, 6]
    assert format_spike(series[:6], series[6]) == pytest.approx(0.05)
    # recovered: a clean round after the collapse is measured against the clean rounds, not against 0.62
    assert format_spike(series, 0.06) is None and format_spike(series, 0.3) == pytest.approx(0.05)
    # a slow drift (+0.05 a round) is not a collapse
    drift = [0.05 + 0.05 * i for i in range(8)]
    assert not any(format_spike(drift[:i], drift[i]) is not None for i in range(len(drift)))


def _rows(errors: int, n: int = 10) -> list[dict]:
    return [{"format_ok": i >= errors} for i in range(n)]


def test_check_round_without_a_lineage_records_the_rate_and_never_fails():
    rates, metrics = check_round(_rows(9), adapter="", mode="fail")
    assert rates == [0.9] and metrics == {"format/error_rate": 0.9}
