"""Schedules are pure functions of the step counters: LR warmup, RL/SFT interleaving, epoch orders."""

from __future__ import annotations

import itertools
import json

import pytest

from sdarflow.train.schedule import (
    TrainState,
    WarmupConstant,
    epoch_order,
    mini_batch,
    step_kinds,
    total_steps,
)


def test_warmup_then_constant():
    s = WarmupConstant(lr=1.0, warmup_steps=4)
    assert [s.lr_at(i) for i in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert WarmupConstant(lr=0.1).lr_at(0) == 0.1


@pytest.mark.parametrize(
    ("ratio", "expected"),
    [
        (0.0, "rrrrrrrr"),
        (1.0, "rsrsrsrs"),
        (0.25, "rrrrsrrr"),
        (2.0, "rssrssrs"),
        (0.5, "rrsrrsrr"),
    ],
)
def test_sft_steps_are_interleaved_at_the_ratio(ratio, expected):
    kinds = "".join(k[0] for k in itertools.islice(step_kinds(ratio), len(expected)))
    assert kinds == expected


def test_ratio_pattern_never_drifts():
    # 0.1 in binary floating point is not exact; over 10,000 RL steps exactly 1,000 SFT steps must follow.
    kinds = list(itertools.islice(step_kinds(0.1), 11_000))
    assert kinds.count("sft") == 1_000


def test_sft_mode_is_all_sft_and_totals():
    assert set(itertools.islice(step_kinds(0.0, "sft"), 10)) == {"sft"}
    assert total_steps("rl", epochs=2, mini_batches=4, sft_ratio=0.25, max_steps=0) == 8 + 2
    assert total_steps("sft", epochs=2, mini_batches=4, sft_ratio=0.25, max_steps=0) == 8
    assert total_steps("rl", epochs=1, mini_batches=4, sft_ratio=0.0, max_steps=11) == 11


def test_each_epoch_visits_every_row_once_in_its_own_order():
    n, n_mini = 10, 3
    for epoch in range(3):
        rows = [i for pos in range(n_mini) for i in mini_batch(n, n_mini, 7, epoch * n_mini + pos, "rl")[2]]
        assert sorted(rows) == list(range(n))
    assert epoch_order(10, 7, 0, "rl") == epoch_order(10, 7, 0, "rl")
    assert epoch_order(10, 7, 0, "rl") != epoch_order(10, 7, 1, "rl")
    assert epoch_order(10, 7, 0, "rl") != epoch_order(10, 7, 0, "sft")
    assert mini_batch(10, 3, 7, 4, "rl")[:2] == (1, 1)


def test_state_round_trips_and_reports_the_cursor():
    s = TrainState(step=7, rl_steps=5, sft_steps=2, nonfinite_in_row=1, history=[{"step": 1}])
    assert TrainState.from_dict(s.to_dict()) == s
    probed = TrainState(step=7, probe_rates=[0.0, 0.5], rollback_at=(7, 3))  # through JSON: a list
    assert TrainState.from_dict(json.loads(json.dumps(probed.to_dict()))) == probed
    assert s.cursor(rl_mini=2, sft_mini=4) == {
        "step": 7,
        "epoch": 2,
        "position": 1,
        "sft_epoch": 0,
        "sft_position": 2,
    }
