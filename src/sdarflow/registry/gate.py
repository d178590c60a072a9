"""The promotion gate: may a candidate adapter replace production?

Self-distillation can raise pass@1 while pass@k and out-of-distribution success collapse (the policy sharpens
onto fewer solutions), so pass@1 alone is not enough. A candidate passes when, against the production adapter's
eval report:

- test pass@1  >= production + ``min_gain``
- test pass@k  >= production - ``passk_tolerance``   (k = the largest k both reports have)
- ood  pass@1  >= production - ``ood_tolerance``

Eval reports are the JSON written by ``sdarflow evaluate``: ``{"splits": {"test": {"pass_at_k": {"1": ...}}}}``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sdarflow.errors import ConfigError

log = logging.getLogger(__name__)

# Slack for float comparisons: 0.60 must pass "0.62 - 0.02", which is 0.6000000000000001 in floating point.
_EPS = 1e-9

SPLITS = ("test", "ood")  # what the gate compares

FORCE_HINT = "fix: improve or re-evaluate the candidate, or override with --force --reason TEXT"


@dataclass(frozen=True)
class GatePolicy:
    """Thresholds of the production gate, as fractions of tasks (0.02 = two percentage points).

    min_gain: candidate test pass@1 must beat production by at least this (0 = not worse).
    passk_tolerance: how far test pass@k (largest k) may fall below production.
    ood_tolerance: how far ood pass@1 may fall below production.
    """

    min_gain: float = 0.0
    passk_tolerance: float = 0.02
    ood_tolerance: float = 0.02

    def __post_init__(self) -> None:
        if not math.isfinite(self.min_gain) or abs(self.min_gain) > 1:
            raise ConfigError(f"min_gain ({self.min_gain}) must be a finite number in [-1, 1]; fix: e.g. 0.0")
        for field in ("passk_tolerance", "ood_tolerance"):
            value = getattr(self, field)
            if not math.isfinite(value) or not 0 <= value <= 1:
                raise ConfigError(f"{field} ({value}) must be in [0, 1]; fix: e.g. 0.02 (two points)")


def _fmt(x: float) -> str:
    """Two decimals, more only when two would hide the difference (0.6199 must not print as 0.62)."""
    short = f"{x:.2f}"
    return short if abs(float(short) - x) < _EPS else f"{x:.4f}".rstrip("0")


def _split(report: Mapping[str, Any], split: str, who: str) -> tuple[dict[str, float] | None, str | None]:
    """The split's pass_at_k as {k: value}, or a failure message saying what is missing."""
    splits = report.get("splits")
    entry = splits.get(split) if isinstance(splits, Mapping) else None
    if not isinstance(entry, Mapping):
        return None, f"{split} split missing from the {who} eval report"
    pass_at_k = entry.get("pass_at_k")
    if not isinstance(pass_at_k, Mapping) or "1" not in pass_at_k:
        return None, f"{split} pass@1 missing from the {who} eval report"
    values = {}
    for k, v in pass_at_k.items():
        # A value that is not a number in [0, 1] (NaN compares False with everything) is a refusal, never a pass.
        ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v <= 1
        if not ok or not (str(k).isascii() and str(k).isdigit()):
            return None, f"{split} pass@{k} = {v!r} in the {who} eval report is not a number in [0, 1]"
        values[str(k)] = float(v)
    return values, None


GATE = GatePolicy()  # the defaults every entry point (CLI, pipelines, config) shows


def check_gate(
    candidate: Mapping[str, Any],
    production: Mapping[str, Any],
    policy: GatePolicy | None = None,
    *,
    candidate_label: str = "candidate",
    production_label: str = "production",
) -> list[str]:
    """Every failed criterion as one message with both numbers; an empty list means the candidate passes."""
    policy = policy or GatePolicy()
    failures: list[str] = []

    cand_test, missing_c = _split(candidate, "test", candidate_label)
    prod_test, missing_p = _split(production, "test", production_label)
    failures += [m for m in (missing_c, missing_p) if m]
    if cand_test is not None and prod_test is not None:
        c1, p1 = cand_test["1"], prod_test["1"]
        if c1 < p1 + policy.min_gain - _EPS:
            failures.append(
                f"test pass@1 {_fmt(c1)} < {production_label} {_fmt(p1)} + min_gain {_fmt(policy.min_gain)}"
            )
        k = max(int(key) for key in cand_test.keys() & prod_test.keys())
        if k == 1:
            log.warning("gate: the eval reports share no k > 1, so the pass@k check compares pass@1")
        ck, pk = cand_test[str(k)], prod_test[str(k)]
        if ck < pk - policy.passk_tolerance - _EPS:
            failures.append(
                f"test pass@{k} {_fmt(ck)} < {production_label} {_fmt(pk)} - tolerance {_fmt(policy.passk_tolerance)}"
            )

    cand_ood, missing_c = _split(candidate, "ood", candidate_label)
    prod_ood, missing_p = _split(production, "ood", production_label)
    failures += [m for m in (missing_c, missing_p) if m]
    if cand_ood is not None and prod_ood is not None:
        c1, p1 = cand_ood["1"], prod_ood["1"]
        if c1 < p1 - policy.ood_tolerance - _EPS:
            failures.append(
                f"ood pass@1 {_fmt(c1)} < {production_label} {_fmt(p1)} - tolerance {_fmt(policy.ood_tolerance)}"
            )
    return failures


def refusal_message(failures: list[str]) -> str:
    """One line: every failed criterion, then the fix."""
    return f"gate refused: {'; '.join(failures)}; {FORCE_HINT}"


def pass_at_1(report: Mapping[str, Any], split: str) -> float | None:
    """A report's pass@1 on ``split``, or None when absent (for listings)."""
    values, _ = _split(report, split, "")
    return None if values is None else values["1"]
