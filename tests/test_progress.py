"""Progress in a non-interactive log: a bar is a few plain lines (no carriage returns), not one per step."""

from __future__ import annotations

import os

from sdarflow import progress


def test_a_bar_in_a_log_writes_its_first_and_last_state_only(capsys):
    assert not progress.interactive()  # pytest captures stderr: the pod-log case
    b = progress.bar(total=5000, desc="rollout", unit="ep")
    for i in range(5000):
        b.update(1)
        b.set_postfix(turn=i, refresh=False)
    b.close()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2, lines
    assert "\r" not in "".join(lines)
    assert lines[0].startswith("rollout:   0%") and "5000/5000" in lines[-1]


def test_an_iterable_bar_in_a_log(capsys):
    assert sum(progress.bar(range(300), desc="sft", unit="step")) == sum(range(300))
    assert len(capsys.readouterr().err.splitlines()) == 2


def test_ticker_lets_one_line_through_per_interval():
    ticker = progress.Ticker(interval_s=3600)
    assert [ticker(), ticker(), ticker(last=True), ticker()] == [True, False, True, False]
    every = progress.Ticker(interval_s=0)
    assert all(every() for _ in range(3))


def test_library_bars_are_off_in_a_log(monkeypatch):
    from transformers.utils import logging as hf_logging

    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "")  # recorded, so the teardown restores it
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS")
    hf_logging.enable_progress_bar()
    try:
        progress.quiet_library_bars()
        assert not hf_logging.is_progress_bar_enabled()
        assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    finally:
        hf_logging.enable_progress_bar()
