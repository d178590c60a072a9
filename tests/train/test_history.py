"""The run summary: losses averaged over the steps that have them, but totals for time and tokens, their ratio
for the rate, and the last learning rate (a mean of a warmup's rates or of per-step speeds means nothing)."""

from __future__ import annotations

import math

import pytest

from sdarflow.train.report import run_summary


def test_the_summary_averages_losses_and_totals_time_and_tokens():
    history = [
        {"step": 1, "kind": "rl", "loss/total": 1.0, "lr": 1e-4, "seconds": 2.0, "tokens": 100, "tokens_per_s": 50.0},
        {"step": 2, "kind": "sft", "loss/total": 3.0, "lr": 2e-4, "seconds": 1.0, "tokens": 50, "tokens_per_s": 50.0},
        {"step": 3, "kind": "rl", "loss/total": math.nan, "lr": 3e-4, "seconds": 1.0, "tokens": 50,
         "tokens_per_s": 50.0, "skipped": True, "sdar/gate_mean": 0.25},
    ]  # fmt: skip
    s = run_summary(history)
    assert s["loss/total"] == pytest.approx(2.0)  # the NaN step is left out
    assert s["sdar/gate_mean"] == pytest.approx(0.25)
    assert s["train/seconds"] == 4.0 and s["train/tokens"] == 200.0
    assert s["train/tokens_per_s"] == pytest.approx(50.0)  # 200 / 4, not the mean of the step rates
    assert s["train/lr"] == 3e-4  # the final rate, not the warmup's mean
    assert (s["train/steps"], s["train/skipped_steps"], s["train/sft_steps"]) == (3.0, 1.0, 1.0)
    assert not {"train/step", "train/epoch", "train/position"} & s.keys()


def test_an_empty_history_has_zero_totals_and_no_rate():
    s = run_summary([])
    assert s == {
        "train/seconds": 0.0,
        "train/tokens": 0.0,
        "train/steps": 0.0,
        "train/skipped_steps": 0.0,
        "train/sft_steps": 0.0,
    }


def test_the_probes_remedy_steps_and_rollbacks_are_counted_not_averaged():
    history = [
        {"step": 1, "seconds": 1.0, "tokens": 10, "format/remedy_steps": 4, "format/remedy_loss": 2.0},
        {"step": 2, "seconds": 1.0, "tokens": 10, "format/remedy_steps": 2, "format/remedy_loss": 1.0,
         "format/rolled_back_to_step": 0},
        {"step": 3, "seconds": 1.0, "tokens": 10, "format/rolled_back_to_step": 2},
    ]  # fmt: skip
    s = run_summary(history)
    assert (s["format/remedy_steps"], s["format/rollbacks"]) == (6.0, 2.0)
    assert s["format/remedy_loss"] == pytest.approx(1.5)  # a loss is still a mean
    assert "format/rolled_back_to_step" not in s  # a mean of step numbers means nothing
