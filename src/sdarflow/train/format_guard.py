"""The tool-call format-collapse guard: a round's format-error rate against the rates of the rounds before it (the
remedy, ``--format-guard repair``, is ``sdarflow.extensions.format_repair``).

RL on tool-using agents can collapse in one batch: one wrong token in the call wrapper, every call fails to parse,
and success does not recover. The train stage compares the share of its rows whose action did not parse with the
moving baseline of its adapter's lineage (each adapter's ``train_summary.json`` carries its rounds' rates) and
warns, or fails the round, on a spike, before the update trains on the collapsed rollouts.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from sdarflow import storage
from sdarflow.errors import SdarflowError

log = logging.getLogger(__name__)

GUARDS = ("off", "warn", "fail", "repair")
GUARD_HELP = (
    "format-collapse guard: the round's format-error rate against its lineage's (a spike: warn, or fail the round); "
    "repair also trains the malformed turns back to their repaired calls; off = not checked"
)
SUMMARY_KEY = "format_error_rates"  # in train_summary.json: this lineage's per-round rates, oldest first
WINDOW = 3  # rounds in the moving baseline
FACTOR = 2.0  # a spike multiplies the error rate by this, or divides the parse rate by it ...
MIN_JUMP = 0.1  # ... and is this much above the baseline (more errors on a clean one are not a collapse)


class FormatCollapse(SdarflowError):
    """The round's format-error rate spiked against its lineage's baseline."""


def format_spike(history: Sequence[float], rate: float) -> float | None:
    """The baseline ``rate`` spiked from, or None when it did not.

    ``b`` is the mean of the last WINDOW rates of ``history`` that were not spikes themselves; a spike is
    ``rate >= b + MIN_JUMP`` and either ``rate >= FACTOR * b`` (the errors multiplied) or ``1 - rate <= (1 - b) /
    FACTOR`` (the well-formed share divided: above ``b = 0.5`` errors cannot double, yet all calls failing is a
    collapse). Spikes never join the baseline, so a collapse stays flagged for as long as it lasts instead of
    becoming the new normal. No history, no baseline: never a spike.
    """
    normal: list[float] = []
    for past in history:
        if _spiked(normal[-WINDOW:], past) is None:
            normal.append(past)
    return _spiked(normal[-WINDOW:], rate)


def _spiked(recent: list[float], rate: float) -> float | None:
    if not recent:
        return None
    baseline = sum(recent) / len(recent)
    multiplied = rate >= FACTOR * baseline or 1 - rate <= (1 - baseline) / FACTOR
    return baseline if multiplied and rate >= baseline + MIN_JUMP else None


def lineage_rates(adapter: str, key: str = SUMMARY_KEY) -> list[float]:
    """The format-error rates ``adapter``'s training recorded under ``key`` (per round, or the per-step probe's),
    oldest first; [] for a new adapter or one trained before the guard (or the probe) existed."""
    if not adapter or not storage.is_published(adapter):
        return []
    summary = storage.read_member_json(adapter, "train_summary.json")
    return [float(x) for x in summary.get(key, [])]


def check_round(rows: list[dict], adapter: str, mode: str) -> tuple[list[float], dict[str, float]]:
    """(this lineage's rates with this round's appended, metrics); raises FormatCollapse on a spike in mode fail."""
    rate = sum(not r["format_ok"] for r in rows) / max(1, len(rows))
    history = lineage_rates(adapter)
    metrics = {"format/error_rate": rate}
    baseline = format_spike(history, rate) if mode != "off" else None
    if baseline is not None:
        metrics["format/spike_baseline"] = baseline
        message = (
            f"format collapse: {rate:.1%} of this round's turns did not parse, against {baseline:.1%} in the "
            f"rounds before"
        )
        if mode == "fail":
            raise FormatCollapse(
                f"{message}; fix: retrain this round from an earlier adapter with a lower --lr, or pass "
                f"--format-guard warn to train on it anyway"
            )
        log.warning("train: %s (--format-guard %s: training on it)", message, mode)
    return [*history, rate], metrics
