"""The tool-call format-collapse guard: a round's format-error rate against the rates of the rounds before it, and
the remedy, SFT on the malformed turns with their repaired calls as targets.

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


def suites_of(rows: list[dict]) -> dict[str, object]:
    """The env suite of each env the rows come from, built once per env (a suite may build an index)."""
    from sdarflow.envs import get_suite

    return {env: get_suite(env) for env in sorted({r["env"] for r in rows})}


def repair_pairs(rows: list[dict], tokenizer, eos_id: int) -> tuple[list, dict[str, float]]:
    """(SFT pairs prompt -> repaired call + eos for the malformed turns the env can repair, metrics).

    A repair is taught in the turn's prompt format (``reference``: inside the reply's tags, its reasoning kept when
    it closed) and counts only when the rollout's parser accepts it; an env without ``repair_action`` repairs
    nothing."""
    from sdarflow.rollout.loop import action_parser
    from sdarflow.rollout.prompt import format_of, format_response, loads
    from sdarflow.train.sft import SFTPair

    malformed = [r for r in rows if not r["format_ok"] and r["response_token_ids"]]
    suites = suites_of(malformed)
    pairs = []
    for r in malformed:
        suite = suites[r["env"]]
        repaired = suite.repair_action(r["response_text"]) if hasattr(suite, "repair_action") else None
        fmt = format_of(loads(r["prompt_messages"]))
        thought = r["response_text"].partition("<think>")[2].partition("</think>")
        reply = None if repaired is None else format_response(repaired, fmt, thought[0] if thought[1] else "")
        if reply is None or not action_parser(suite, fmt)(reply, True)[1]:
            continue
        target = tokenizer(reply, add_special_tokens=False)["input_ids"] + [eos_id]
        pairs.append(SFTPair(list(r["prompt_token_ids"]), target))
    metrics = {"format/malformed_turns": float(len(malformed)), "format/repaired_turns": float(len(pairs))}
    return pairs, metrics
