"""Tests for sdarflow.evaluate.metrics: pass@k against math.comb, ks, CIs, and a hand-checked summary."""

from __future__ import annotations

import math

import pytest

from sdarflow.evaluate.metrics import (
    bootstrap_interval,
    build_report,
    ks_for,
    pass_at_k,
    pass_at_k_interval,
    split_results,
    wilson_interval,
)
from sdarflow.intervals import Z95


def comb_pass_at_k(n: int, c: int, k: int) -> float:
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def episodes_for(
    split: str, task_id: str, task_type: str, outcomes: list[tuple[bool, int, int]]
) -> list[dict]:
    """One episode per (success, turns, format_errors); every turn is an action."""
    return [
        {"task_id": task_id, "task_type": task_type, "split": split, "success": ok, "turns": turns,
         "format_errors": errors, "actions": turns}
        for ok, turns, errors in outcomes
    ]  # fmt: skip


def hand_built(t1_successes: int = 4) -> list[dict]:
    """Two splits, two task types, 4 samples per task (numbers chosen for hand-checking below)."""
    t1 = [(i < t1_successes, 3, 0) for i in range(4)]
    return (
        episodes_for("test", "t1", "cook", t1)
        + episodes_for("test", "t2", "cook", [(True, 3, 0)] + [(False, 10, 1)] * 3)
        + episodes_for("test", "t3", "cut", [(False, 10, 2)] * 4)
        + episodes_for("ood", "o1", "cook", [(True, 4, 0)] * 2 + [(False, 8, 0)] * 2)
        + episodes_for("ood", "o2", "cut", [(False, 8, 4)] * 4)
    )


@pytest.mark.parametrize(
    ("n", "c", "k"),
    [(4, 1, 1), (4, 1, 2), (4, 2, 2), (10, 3, 1), (10, 3, 5), (10, 3, 7), (20, 5, 4), (16, 1, 16), (1, 0, 1)],
)
def test_pass_at_k_matches_binomial_formula(n: int, c: int, k: int) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(comb_pass_at_k(n, c, k), abs=1e-12)


def test_pass_at_k_edge_cases() -> None:
    assert pass_at_k(8, 0, 1) == 0.0
    assert pass_at_k(8, 0, 8) == 0.0
    assert pass_at_k(8, 8, 1) == 1.0
    # n - c = 2 < k = 3: every 3-subset holds a success.
    assert pass_at_k(8, 6, 3) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)  # pass@1 is the success fraction


@pytest.mark.parametrize(("n", "c", "k"), [(4, 1, 5), (4, 1, 0), (0, 0, 1), (4, 5, 1), (4, -1, 1)])
def test_pass_at_k_rejects_bad_arguments(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError, match=str(n)):
        pass_at_k(n, c, k)


def test_pass_at_k_k_greater_than_n_message() -> None:
    with pytest.raises(ValueError, match=r"k=5 must be in \[1, n=4\]"):
        pass_at_k(4, 1, 5)


@pytest.mark.parametrize(
    ("n", "ks"),
    [(1, [1]), (2, [1, 2]), (3, [1, 2, 3]), (4, [1, 2, 4]), (6, [1, 2, 4, 6]), (8, [1, 2, 4, 8]),
     (10, [1, 2, 4, 8, 10])],
)  # fmt: skip
def test_ks_for(n: int, ks: list[int]) -> None:
    assert ks_for(n) == ks


def test_ks_for_rejects_zero() -> None:
    with pytest.raises(ValueError, match="n=0"):
        ks_for(0)


def test_wilson_interval_published_values() -> None:
    # Wilson 95% intervals as tabulated (Newcombe 1998): 5/10 -> 0.2366-0.7634, 1/4 -> 0.0456-0.6994;
    # 0 successes: upper bound z^2 / (n + z^2), 0/16 -> 0.1936 (never the (0, 0) of the normal approximation).
    assert wilson_interval(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson_interval(1, 4) == pytest.approx((0.0456, 0.6994), abs=1e-4)
    assert wilson_interval(0, 16) == pytest.approx((0.0, Z95**2 / (16 + Z95**2)))
    assert wilson_interval(16, 16) == pytest.approx((1 - Z95**2 / (16 + Z95**2), 1.0))
    assert pytest.approx(1.96, abs=1e-3) == Z95
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


def test_bootstrap_interval_properties() -> None:
    values = [0.0, 0.25, 1.0, 0.5, 0.75, 0.0, 1.0, 0.5]
    lo, hi = bootstrap_interval(values)
    assert lo < sum(values) / len(values) < hi
    assert bootstrap_interval(values) == (lo, hi)  # seeded: a report is reproducible
    assert bootstrap_interval([0.7, 0.7, 0.7]) == pytest.approx((0.7, 0.7))
    wide = bootstrap_interval(values)
    narrow = bootstrap_interval(values * 16)  # the same spread over 16x the tasks
    assert narrow[1] - narrow[0] < (wide[1] - wide[0]) / 2
    with pytest.raises(ValueError):
        bootstrap_interval([])


def test_pass_at_k_interval_on_zero_successes_is_not_a_point() -> None:
    # 4 tasks x 4 samples, nothing solved: pass@1 in Wilson's (0, 0.1936); pass@4 <= 1 - (1 - pass@1)^4
    hi1 = Z95**2 / (16 + Z95**2)
    assert pass_at_k_interval([0.0] * 4, 1, 0, 16) == pytest.approx((0.0, hi1))
    assert pass_at_k_interval([0.0] * 4, 4, 0, 16) == pytest.approx((0.0, 1 - (1 - hi1) ** 4))
    # every task solved every time: pass@4 is 1 and its lower bound is pass@1's
    lo1 = 1 - hi1
    assert pass_at_k_interval([1.0] * 4, 4, 16, 16) == pytest.approx((lo1, 1.0))


def test_pass_at_1_interval_covers_the_spread_between_tasks() -> None:
    # 2 tasks x 8 samples, one always solved, one never: 8/16 episodes, but the tasks disagree completely, so the
    # task bootstrap (0 or 1 with probability 1/4 each) is wider than Wilson's (0.28, 0.72)
    lo, hi = pass_at_k_interval([1.0, 0.0], 1, 8, 16)
    assert (lo, hi) == pytest.approx((0.0, 1.0))
    assert wilson_interval(8, 16) == pytest.approx((0.28, 0.72), abs=0.005)


def test_summarize_hand_checked() -> None:
    splits = split_results(hand_built())
    assert list(splits) == ["test", "ood"]

    test = splits["test"]
    # per task (k = 1, 2, 4): t1 c=4 -> 1, 1, 1; t2 c=1 -> 1/4, 1 - C(3,2)/C(4,2) = 1/2, 1; t3 c=0 -> 0, 0, 0
    assert test["n_tasks"] == 3
    assert test["samples_per_task"] == 4
    assert test["pass_at_k"] == pytest.approx({"1": 1.25 / 3, "2": 1.5 / 3, "4": 2 / 3})
    assert test["by_task_type"]["cook"] == {
        "n_tasks": 2,
        "pass_at_k": pytest.approx({"1": 0.625, "2": 0.75, "4": 1.0}),
    }
    assert test["by_task_type"]["cut"] == {"n_tasks": 1, "pass_at_k": {"1": 0.0, "2": 0.0, "4": 0.0}}
    assert test["success_rate"] == pytest.approx(5 / 12)
    assert test["task_successes"] == {"t1": 4, "t2": 1, "t3": 0}
    assert test["mean_turns"] == pytest.approx((4 * 3 + 3 + 3 * 10 + 4 * 10) / 12)
    assert test["format_error_rate"] == pytest.approx((3 * 1 + 4 * 2) / 85)
    # 3 tasks: a bootstrap draw repeats one task with probability 1/27 > 2.5%, so the percentile bounds are the
    # extreme task values: k = 4 over [1, 1, 0] and k = 1 over [1, 1/4, 0] both give [0, 1]
    assert test["ci95"]["4"] == pytest.approx([0.0, 1.0])
    assert test["ci95"]["1"] == pytest.approx([0.0, 1.0])

    ood = splits["ood"]
    # o1 c=2 -> 1/2, 1 - C(2,2)/C(4,2) = 5/6, 1; o2 c=0 -> 0, 0, 0
    assert ood["n_tasks"] == 2
    assert ood["samples_per_task"] == 4
    assert ood["pass_at_k"] == pytest.approx({"1": 0.25, "2": 5 / 12, "4": 0.5})
    assert ood["by_task_type"]["cook"]["pass_at_k"] == pytest.approx({"1": 0.5, "2": 5 / 6, "4": 1.0})
    assert ood["success_rate"] == pytest.approx(0.25)
    assert ood["mean_turns"] == pytest.approx(56 / 8)
    assert ood["format_error_rate"] == pytest.approx(16 / 56)
    # k = 1: the bootstrap over [1/2, 0] spans [0, 1/2]; Wilson's 2 of 8 episodes spans (0.0715, 0.5907)
    assert ood["ci95"]["1"] == pytest.approx([0.0, 0.5907], abs=1e-4)


def test_summarize_explicit_ks() -> None:
    splits = split_results(hand_built(), ks=[4, 1, 1])
    assert list(splits["test"]["pass_at_k"]) == ["1", "4"]
    with pytest.raises(ValueError, match=r"ks \[8\] exceed the 4 samples"):
        split_results(hand_built(), ks=[1, 8])


def test_summarize_unequal_samples_names_the_task() -> None:
    episodes = hand_built()
    short = [ep for ep in episodes if ep["task_id"] != "t3"] + [
        ep for ep in episodes if ep["task_id"] == "t3"
    ][:3]
    with pytest.raises(ValueError, match="task 't3' has 3 episodes"):
        split_results(short)


def test_summarize_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="got none"):
        split_results([])
    episode = dict(hand_built()[0])
    del episode["actions"]
    with pytest.raises(ValueError, match=r"episode 0 lacks keys \['actions'\]"):
        split_results([episode])
    mixed = hand_built()
    mixed[1] = {**mixed[1], "task_type": "cut"}
    with pytest.raises(ValueError, match="task 't1' has task_type 'cook' and 'cut'"):
        split_results(mixed)


def test_build_report_shape() -> None:
    report = build_report(hand_built(), adapter="cand-v3", base_model="tiny-qwen", config_hash="abc123")
    assert set(report) == {"adapter", "base_model", "splits", "config_hash"}
    assert report["adapter"] == "cand-v3"
    assert report["base_model"] == "tiny-qwen"
    assert report["config_hash"] == "abc123"
    split_keys = {"n_tasks", "samples_per_task", "pass_at_k", "ci95", "by_task_type", "task_successes",
                  "success_rate", "format_error_rate", "mean_turns"}  # fmt: skip
    for split in report["splits"].values():
        assert set(split) == split_keys
        assert set(split["ci95"]) == set(split["pass_at_k"])
        for by_type in split["by_task_type"].values():
            assert set(by_type) == {"n_tasks", "pass_at_k"}
    with pytest.raises(ValueError, match="splits"):
        build_report(hand_built(), adapter="a", base_model="b", splits={})
