"""The tool-call format-collapse guard: a round's format-error rate against the rates of the rounds before it.

RL on tool-using agents can collapse in one batch: the policy starts emitting one wrong token in the call wrapper,
every call fails to parse, success drops from most episodes to few and does not recover. The train stage measures
the share of its rows whose action did not parse, compares it with the moving baseline of its adapter's lineage
(each adapter's ``train_summary.json`` carries the rates of the rounds that made it) and warns, or fails the round
in one line, on a spike, before the update would train on the collapsed rollouts.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from sdarflow import storage
from sdarflow.errors import SdarflowError

log = logging.getLogger(__name__)

GUARDS = ("off", "warn", "fail")
SUMMARY_KEY = "format_error_rates"  # in train_summary.json: this lineage's per-round rates, oldest first
WINDOW = 3  # rounds in the moving baseline
FACTOR = 2.0  # a spike is at least this multiple of the baseline ...
MIN_JUMP = (
    0.1  # ... and at least this much above it (a few more errors on a clean baseline are not a collapse)
)


class FormatCollapse(SdarflowError):
    """The round's format-error rate spiked against its lineage's baseline."""


def format_spike(
    history: Sequence[float],
    rate: float,
    window: int = WINDOW,
    factor: float = FACTOR,
    min_jump: float = MIN_JUMP,
) -> float | None:
    """The baseline ``rate`` spiked from, or None when it did not.

    ``b = mean(history[-window:])``; a spike is ``rate >= factor * b`` and ``rate >= b + min_jump``. No history, no
    baseline: never a spike.
    """
    recent = list(history)[-window:]
    if not recent:
        return None
    baseline = sum(recent) / len(recent)
    return baseline if rate >= factor * baseline and rate >= baseline + min_jump else None


def lineage_rates(adapter: str) -> list[float]:
    """The per-round format-error rates recorded by ``adapter``'s training (oldest first); [] for a new adapter or
    one trained before the guard existed."""
    if not adapter or not storage.is_published(adapter):
        return []
    summary = storage.read_member_json(adapter, "train_summary.json")
    return [float(x) for x in summary.get(SUMMARY_KEY, [])]


def check_round(rows: list[dict], adapter: str, mode: str) -> tuple[list[float], dict[str, float]]:
    """(this lineage's rates with this round's appended, metrics); raises FormatCollapse on a spike in mode fail."""
    rate = sum(not r["format_ok"] for r in rows) / max(1, len(rows))
    history = lineage_rates(adapter)
    metrics = {"format/error_rate": rate}
    baseline = format_spike(history, rate) if mode != "off" else None
    if baseline is not None:
        metrics["format/spike_baseline"] = baseline
        message = (
            f"format collapse: {rate:.1%} of this round's turns did not parse, against {baseline:.1%} over the "
            f"last {min(WINDOW, len(history))} round(s)"
        )
        if mode == "fail":
            raise FormatCollapse(
                f"{message}; fix: retrain this round from an earlier adapter with a lower --lr, or pass "
                f"--format-guard warn to train on it anyway"
            )
        log.warning("train: %s (--format-guard warn: training on it)", message)
    return [*history, rate], metrics
