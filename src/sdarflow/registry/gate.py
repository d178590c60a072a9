"""The promotion gate: may a candidate adapter replace production? (docs/evaluation.md has the why and the table)

The candidate is compared with each reference it has (the production version, the base model) task by task on
the same tasks, on the one-sided 95% lower bound ``lower`` of each difference (:mod:`sdarflow.evaluate.compare`):

- test pass@1:  ``lower(candidate - reference) >  min_gain``          (a gain beyond the noise)
- test pass@k:  ``lower(candidate - reference) >= -passk_tolerance``  (k = the largest k both reports have)
- ood  pass@1:  ``lower(candidate - reference) >= -ood_tolerance``

and candidate test pass@1 ``> floor``. The two guards catch self-distillation sharpening onto fewer solutions.
With no reference at all the gate refuses, and so it does for two reports of other tasks or another protocol (env,
evaluate settings, task window, seed): they are never compared unpaired.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar

from sdarflow.config import Checked, opt
from sdarflow.errors import ConfigError
from sdarflow.evaluate.compare import Difference, difference
from sdarflow.evaluate.metrics import PROTOCOL, SplitReport
from sdarflow.teacher import controls

log = logging.getLogger(__name__)

# Slack for float comparisons: a bound of exactly -0.05 must clear "-0.05", whatever the rounding.
_EPS = 1e-9
CONFIDENCE = 0.95  # of the one-sided lower bounds

SPLITS = ("test", "ood")  # what the gate compares

FORCE_HINT = (
    "fix: improve the candidate, or evaluate on more tasks (eval_tasks) for a tighter bound, or override with "
    "--force --reason TEXT"
)


@dataclass(frozen=True)
class GatePolicy(Checked):
    """Thresholds of the production gate, as fractions of tasks (0.05 = five points), on one-sided 95% lower
    bounds of paired task differences (see the module docstring)."""

    what: ClassVar[str] = "gate"

    min_gain: float = opt(
        0.0,
        "gate: the lower 95-percent bound of test pass@1's gain over production and the base must be above this",
        ge=-1,
        le=1,
    )
    passk_tolerance: float = opt(
        0.05, "gate: how far the lower bound of test pass@k's change (largest k) may fall below 0", ge=0, le=1
    )
    ood_tolerance: float = opt(
        0.05, "gate: how far the lower bound of ood pass@1's change may fall below 0", ge=0, le=1
    )
    floor: float = opt(0.0, "gate: the candidate's test pass@1 must be above this", ge=0, le=1)
    min_tasks: int = opt(
        32,
        "gate: each split is compared on at least this many paired tasks (a collapse on 1 task in 10 is absent "
        "from 18 percent of 16-task samples, and then no bound can see it)",
        ge=2,
    )


GATE = GatePolicy()  # a registry's policy until `sdarflow registry gate` sets one
# What each threshold means, for every entry point's help (CLI flags, pipeline parameters)
GATE_HELP = {f.name: f.metadata["help"] for f in fields(GatePolicy)}
_HIGHER_IS_TIGHTER = ("min_gain", "floor", "min_tasks")  # the tolerances are tighter when lower


@dataclass
class GatePolicies(Checked):
    """A registry name's gate policies (``gate_policy.json``, set by ``sdarflow registry gate``): production's,
    and staging's when one is set (staging is ungated without it)."""

    strict: ClassVar[bool] = True

    production: GatePolicy = opt(GATE, "the gate of production")
    staging: GatePolicy | None = opt(None, "the gate of staging; none: staging is ungated")


def tightened(stored: GatePolicy, requested: Mapping[str, float | None]) -> tuple[GatePolicy, list[str]]:
    """``stored`` with each ``requested`` threshold (None: not requested) in its place, and a line for each one
    looser than the stored one (a caller may only tighten the registry's gate); ConfigError for a bad one."""
    given = {name: value for name, value in requested.items() if value is not None}
    policy = GatePolicy.from_dict({**asdict(stored), **given})
    looser = []
    for name in given:
        new, old = getattr(policy, name), getattr(stored, name)
        if not (new >= old if name in _HIGHER_IS_TIGHTER else new <= old):
            looser.append(f"{name} {new:g} is looser than the registry's {old:g}")
    return policy, looser


@dataclass
class GateVerdict:
    """Every failed criterion as one message, and every comparison with its numbers (for the audit log)."""

    failures: list[str] = field(default_factory=list)
    checks: list[dict[str, Any]] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures


def _fmt(x: float) -> str:
    """Two decimals, more only when two would hide the difference (0.6199 must not print as 0.62)."""
    short = f"{x:.2f}"
    return short if abs(float(short) - x) < _EPS else f"{x:.4f}".rstrip("0")


def _signed(x: float) -> str:
    return ("+" if x >= 0 else "-") + _fmt(abs(x))


def _split(report: Mapping[str, Any], split: str, who: str) -> tuple[Mapping[str, Any] | None, str | None]:
    """The split as the gate compares it (pass@k and per-task results that agree, as many tasks as its protocol
    evaluated), or what is wrong with it."""
    splits = report.get("splits")
    entry = splits.get(split) if isinstance(splits, Mapping) else None
    if not isinstance(entry, Mapping):
        return None, f"{split} split missing from the {who} eval report"
    try:
        checked = SplitReport.check(
            dict(entry), f"{split} of the {who} eval report", "fix: evaluate it again"
        )
    except ConfigError as err:
        return None, str(err)
    if not checked.task_successes:
        return None, (
            f"{split} of the {who} eval report has no per-task results (samples_per_task, task_successes), "
            f"which the gate compares task by task; fix: evaluate it again with `sdarflow evaluate`"
        )
    protocol = report.get("protocol")
    window = protocol.get("tasks") if isinstance(protocol, Mapping) else None
    if window is not None and window != len(checked.task_successes):
        return None, (
            f"{split} of the {who} eval report lists {len(checked.task_successes)} tasks, but its protocol "
            f"evaluated {window}; fix: evaluate it again with `sdarflow evaluate`"
        )
    return entry, None


def _not_comparable(
    cand: Mapping[str, Any], ref: Mapping[str, Any], split: str, ref_label: str, min_tasks: int
) -> str | None:
    """Why two splits are not the same tasks, or too few of them, or None: the gate compares only task by task,
    never unpaired (a task renamed or dropped must not turn a refused gain into an unpaired pass), and never on
    fewer than ``min_tasks``: a rare collapse absent from a small sample leaves every bound computed from it blind
    (``bench/results/gate_null.json``: 10% of tasks collapsing, 16 tasks promote 18%)."""
    a, b = set(cand["task_successes"]), set(ref["task_successes"])
    if a == b:
        if len(a) >= min_tasks:
            return None
        return (
            f"{split}: {len(a)} paired tasks are fewer than the gate's min_tasks {min_tasks} (a collapse on 1 "
            f"task in 10 is absent from {0.9 ** len(a):.0%} of {len(a)}-task samples); fix: evaluate both on at "
            f"least {min_tasks} tasks (eval_tasks), or lower the registry's min_tasks (sdarflow registry gate "
            f"--min-tasks N --reason TEXT)"
        )
    only = sorted(a - b)[:3] or sorted(b - a)[:3]
    return (
        f"{split}: the candidate and {ref_label} eval reports are on different tasks ({len(a - b)} only in the "
        f"candidate's, {len(b - a)} only in the other, e.g. {', '.join(only)}); fix: evaluate both on the same "
        f"tasks (the same env, first_task, tasks and seed)"
    )


def _criterion(d: Difference, split: str, ref: str, threshold: float, strict: bool, name: str) -> dict:
    """One comparison's record, with the failure message when its bound does not clear the threshold."""
    ok = d.lower is not None and (d.lower > threshold + _EPS if strict else d.lower >= threshold - _EPS)
    record = {"split": split, "against": ref, "criterion": name, "threshold": threshold, "passed": ok}
    record |= asdict(d)
    if not ok:
        what = f"{split} pass@{d.k} vs {ref}: {_fmt(d.candidate)} - {_fmt(d.reference)} = {_signed(d.diff)}"
        if d.lower is None:
            record["failure"] = f"{what}, and {d.tasks} task(s) cannot bound the difference"
        else:
            rule = f"not above {name} {_fmt(threshold)}" if strict else f"below -{name} {_fmt(-threshold)}"
            pairs = f"{d.tasks} {'paired ' if d.paired else ''}tasks"
            record["failure"] = f"{what}, lower bound {_signed(d.lower)} ({pairs}) {rule}"
    return record


def _protocol(report: Mapping[str, Any]) -> dict[str, Any]:
    """How a report was evaluated: env, the evaluate settings it records, each split's samples per task."""
    protocol = report.get("protocol")
    out = {"env": report.get("env"), **(protocol if isinstance(protocol, Mapping) else {})}
    splits = report.get("splits")
    for split in SPLITS:
        entry = splits.get(split) if isinstance(splits, Mapping) else None
        out[f"{split} samples per task"] = (
            entry.get("samples_per_task") if isinstance(entry, Mapping) else None
        )
    return out


def _mismatch(
    candidate: Mapping[str, Any], reference: Mapping[str, Any], ref: str, cand_label: str, one_protocol: bool
) -> str | None:
    """Why two reports may not be compared task by task (another env, temperature, turn limit, samples...), or
    None. Each report must record its env and every ``PROTOCOL`` setting: one that does not (by hand, or by an
    older sdarflow) cannot be shown to match, so it is never paired."""
    a, b = _protocol(candidate), _protocol(reference)
    for label, p in ((cand_label, a), (ref, b)):
        missing = [] if one_protocol else [k for k in ("env", *PROTOCOL) if p.get(k) is None]
        if missing:
            return (
                f"the {label} eval report does not record its {', '.join(missing)}, so its tasks cannot be shown "
                f"to match the other report's; fix: evaluate it again with `sdarflow evaluate`"
            )
    differ = [
        f"{key} {a[key]!r} vs {b[key]!r}"
        for key in a
        if None not in (a[key], b.get(key)) and a[key] != b[key]
    ]
    if not differ:
        return None
    return (
        f"the {cand_label} and {ref} eval reports were made differently ({'; '.join(differ)}), so their tasks "
        f"cannot be compared; fix: evaluate both with the same env and evaluate settings"
    )


def _compare(
    candidate,
    reference,
    ref: str,
    policy: GatePolicy,
    cand_label: str,
    verdict: GateVerdict,
    one_protocol: bool,
) -> None:
    if (mismatch := _mismatch(candidate, reference, ref, cand_label, one_protocol)) is not None:
        verdict.failures.append(mismatch)
        return
    splits = {}
    for split in SPLITS:
        pair = (_split(candidate, split, cand_label), _split(reference, split, ref))
        verdict.failures += [message for _, message in pair if message]
        splits[split] = tuple(entry for entry, _ in pair)
    checks = []
    cand_test, ref_test = splits["test"]
    if cand_test is not None and ref_test is not None:
        checks.append(("test", 1, policy.min_gain, True, "min_gain"))
        k = max(int(a) for a in cand_test["pass_at_k"].keys() & ref_test["pass_at_k"].keys())
        if k == 1:
            log.warning("gate: the eval reports share no k > 1, so the pass@k check compares pass@1")
        checks.append(("test", k, -policy.passk_tolerance, False, "passk_tolerance"))
    if None not in splits["ood"]:
        checks.append(("ood", 1, -policy.ood_tolerance, False, "ood_tolerance"))
    for split in dict.fromkeys(c[0] for c in checks):
        if (other := _not_comparable(*splits[split], split, ref, policy.min_tasks)) is not None:
            verdict.failures.append(other)
            checks = [c for c in checks if c[0] != split]
    for split, k, threshold, strict, name in checks:
        cand, refd = splits[split]
        record = _criterion(difference(cand, refd, k, CONFIDENCE), split, ref, threshold, strict, name)
        verdict.checks.append(record)
        if "failure" in record:
            verdict.failures.append(record["failure"])


def check_gate(
    candidate: Mapping[str, Any],
    references: Mapping[str, Mapping[str, Any] | None],
    policy: GatePolicy | None = None,
    *,
    candidate_label: str = "candidate",
    one_protocol: bool = False,
) -> GateVerdict:
    """The verdict on ``candidate`` against every report in ``references`` (label -> report; None = not
    available, e.g. no production version yet). ``one_protocol``: the caller evaluated all of them with one
    evaluate config (a study's cells), so reports without a recorded protocol may be paired."""
    policy = policy or GATE
    verdict = GateVerdict()
    present = {label: report for label, report in references.items() if report is not None}
    if not present:
        verdict.failures.append(
            f"nothing to compare the {candidate_label} with: no {' and no '.join(references)} eval report "
            f"(register versions with the base model's eval report, --base-eval-report)"
        )
    for label, report in present.items():
        _compare(candidate, report, label, policy, candidate_label, verdict, one_protocol)
    test, _ = _split(candidate, "test", candidate_label)
    if test is not None and not test["pass_at_k"]["1"] > policy.floor + _EPS:
        verdict.failures.append(
            f"test pass@1 {_fmt(test['pass_at_k']['1'])} of the {candidate_label} is not above the floor "
            f"{_fmt(policy.floor)}"
        )
    # one message per problem, in order: a candidate's missing split is named once, not per reference
    verdict.failures = list(dict.fromkeys(verdict.failures))
    return verdict


def teacher_failures(lineage: Mapping[str, Any]) -> list[str]:
    """Production refuses a version a privileged teacher taught (``lineage["teacher_contexts"]`` holds one of
    :data:`sdarflow.teacher.PRIVILEGED_CONTEXTS`): the teacher read the task's solution or its expert labels,
    which no production task offers, so the version is a control, not a release."""
    return [
        f"taught by the {c} teacher (rescore --teacher-context {c}), which reads what only training sees: a "
        f"control, not a release"
        for c in controls(lineage.get("teacher_contexts"))
    ]


def refusal_message(failures: list[str]) -> str:
    """One line: every failed criterion, then the fix."""
    return f"gate refused: {'; '.join(failures)}; {FORCE_HINT}"
