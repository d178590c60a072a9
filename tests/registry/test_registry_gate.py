"""The promotion gate: task-paired lower bounds against production and the base model, hand-computed (pure check
and through Registry.promote), the floor, forced overrides audited with their numbers, staging, and rollback."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from sdarflow.errors import ConfigError
from sdarflow.registry import GatePolicy, GateRefused, Registry, RegistryError, check_gate, gate

# n = 4 samples per task, 10 tasks. Production: 2 of 4 on every task (pass@1 0.50, pass@4 1.00).
PROD = [2] * 10
# +.25, -.25, +.25, +.25 and six ties: mean +0.05, lower bound -0.05 (the sign-flip bound, stricter than t's -0.04;
# worked out in tests/evaluate/test_compare.py)
NOISE = [3, 1, 3, 3, 2, 2, 2, 2, 2, 2]
# +.25 on nine tasks: mean +0.225, sd 0.0790569, se 0.025, t bound 0.225 - 1.833113 * 0.025 = 0.179; one task
# without the gain skews the differences left (g = -2.6667: second moment 0.005625, third -0.001125), so the
# skew bound, 0.225 - (1.833113 + 2.6667 * 7.720606 / 18.97367) * 0.025 = 0.152, is the gate's
GAIN = [3] * 9 + [2]
# These reports have 10 tasks (bounds worked out by hand), fewer than the gate's default min_tasks (which has its
# own tests), so they are judged under a policy that admits 10, in the registry set like any policy
TEN = GatePolicy(min_tasks=10)


def _check(candidate, references, candidate_label="candidate", **thresholds):
    policy = dataclasses.replace(TEN, **thresholds)
    return check_gate(candidate, references, policy, candidate_label=candidate_label)


def _registry(root) -> Registry:
    reg = Registry(root)
    reg.set_gate("agent", "production", {"min_tasks": 10}, reason="the fixtures have 10 tasks")
    return reg


def _refs(production=None, base=None) -> dict:
    return {"production v1": production, "base model": base}


def test_a_better_mean_inside_the_noise_is_refused(tasks):
    verdict = _check(tasks(NOISE, PROD), _refs(tasks(PROD, PROD)))
    assert verdict.failures == [
        "test pass@1 vs production v1: 0.55 - 0.50 = +0.05, lower bound -0.05 (10 paired tasks) not above "
        "min_gain 0.00"
    ]
    [pass1] = [c for c in verdict.checks if c["criterion"] == "min_gain"]
    assert pass1["t_lower"] == pytest.approx(0.05 - 1.833113 * 0.05, abs=1e-5) and pass1["passed"] is False
    assert pass1["lower"] == pass1["sign_flip_lower"] == pytest.approx(-0.05)


def test_a_gain_beyond_the_noise_passes_with_its_numbers(tasks):
    verdict = _check(tasks(GAIN, PROD), _refs(tasks(PROD, PROD)))
    assert verdict.passed and verdict.failures == []
    by_criterion = {c["criterion"]: c for c in verdict.checks}
    assert by_criterion["min_gain"]["t_lower"] == pytest.approx(0.225 - 1.833113 * 0.025, abs=1e-5)
    assert by_criterion["min_gain"]["lower"] == by_criterion["min_gain"]["skew_lower"]
    assert by_criterion["min_gain"]["lower"] == pytest.approx(0.152044, abs=1e-5)
    assert by_criterion["passk_tolerance"]["k"] == 4 and by_criterion["passk_tolerance"]["diff"] == 0
    assert by_criterion["ood_tolerance"]["split"] == "ood"


def test_a_pass_at_k_collapse_is_refused(tasks):
    # sharpened: every sample of 7 tasks succeeds, none of 3: pass@4 0.70 against 1.00, lower bound -0.6343 (the
    # skew bound, worked out in tests/evaluate/test_compare.py; the sign flip's is -0.60, t's -0.58)
    failures = _check(tasks([4] * 7 + [0] * 3, PROD), _refs(tasks(PROD, PROD))).failures
    assert (
        "test pass@4 vs production v1: 0.70 - 1.00 = -0.30, lower bound -0.6343 (10 paired tasks) below "
        "-passk_tolerance 0.05" in failures
    )


def test_an_ood_drop_is_refused(tasks):
    failures = _check(tasks(GAIN, [1] * 10), _refs(tasks(PROD, PROD))).failures
    assert failures == [
        "ood pass@1 vs production v1: 0.25 - 0.50 = -0.25, lower bound -0.25 (10 paired tasks) below "
        "-ood_tolerance 0.05"
    ]


def test_the_first_version_must_beat_the_base(tasks):
    # every task +.25 over the base: sd 0, lower bound = mean
    assert _check(tasks([2] * 10, [2] * 10), _refs(None, tasks([1] * 10, [2] * 10))).passed
    failures = _check(tasks([1] * 10, [2] * 10), _refs(None, tasks([2] * 10, [2] * 10))).failures
    assert failures == [
        "test pass@1 vs base model: 0.25 - 0.50 = -0.25, lower bound -0.25 (10 paired tasks) not above "
        "min_gain 0.00"
    ]


def test_nothing_to_compare_with_is_a_refusal(tasks):
    failures = _check(tasks(GAIN, PROD), {"production": None, "base model": None}).failures
    assert failures == [
        "nothing to compare the candidate with: no production and no base model eval report (register "
        "versions with the base model's eval report, --base-eval-report)"
    ]


def test_the_floor(tasks):
    zero = tasks([0] * 10, [0] * 10)
    failures = _check(zero, _refs(None, zero)).failures
    assert "test pass@1 0.00 of the candidate is not above the floor 0.00" in failures
    failures = _check(tasks(GAIN, PROD), _refs(tasks(PROD, PROD)), floor=0.8).failures
    assert failures == ["test pass@1 0.725 of the candidate is not above the floor 0.80"]


def test_both_references_are_compared(tasks):
    # beats production by +0.225 but not the base it started from (all 3 of 4: 0.75 > 0.725)
    failures = _check(tasks(GAIN, PROD), _refs(tasks(PROD, PROD), tasks([3] * 10, PROD))).failures
    assert len(failures) == 1 and failures[0].startswith("test pass@1 vs base model: 0.725 - 0.75 = -0.025")


def test_fewer_tasks_than_min_tasks_are_not_judged(tasks):
    """16 tasks that all gain the same: no bound from the sample can see a collapse the sample happens to miss
    (1 task in 10 collapsing is absent from 18.5% of 16-task samples), so the default policy does not judge 16."""
    gain = tasks([3] * 16, [2] * 16)
    verdict = check_gate(gain, _refs(None, tasks([2] * 16, [2] * 16)))
    assert verdict.failures == [
        f"{split}: 16 paired tasks are fewer than the gate's min_tasks 32 (a collapse on 1 task in 10 is absent "
        "from 19% of 16-task samples); fix: evaluate both on at least 32 tasks (eval_tasks), or lower the "
        "registry's min_tasks (sdarflow registry gate --min-tasks N --reason TEXT)"
        for split in ("test", "ood")
    ]
    assert verdict.checks == []  # nothing compared
    assert check_gate(tasks([3] * 32, [2] * 32), _refs(None, tasks([2] * 32, [2] * 32))).passed


def test_a_few_tasks_cannot_bound_the_difference(tasks):
    """Admitted by a policy's min_tasks, 4 tasks still give no bound: the sign-flip bound needs 5."""
    failures = _check(tasks([4] * 4, [4] * 4), _refs(tasks([0] * 4, [4] * 4)), min_tasks=2).failures
    assert (
        failures[0]
        == "test pass@1 vs production v1: 1.00 - 0.00 = +1.00, and 4 task(s) cannot bound the difference"
    )
    assert len(failures) == 3 and all("cannot bound" in f for f in failures)  # pass@4 and ood as well


def test_min_gain_and_boundaries(tasks):
    # lower bound 0.25 exactly at min_gain 0.25 is not above it; a bound exactly at -tolerance passes
    cand, base = tasks([2] * 10, [2] * 10), tasks([1] * 10, [2] * 10)
    assert _check(cand, _refs(None, base), min_gain=0.25).failures[0].endswith("not above min_gain 0.25")
    assert _check(cand, _refs(None, base), min_gain=0.2499).passed
    # ood: every task -.25 against tolerance 0.25
    assert _check(tasks([2] * 10, [1] * 10), _refs(None, base), ood_tolerance=0.25).passed


def test_the_largest_common_k_is_compared(tasks):
    cand = tasks(GAIN, PROD)
    prod = tasks(PROD, PROD)
    del prod["splits"]["test"]["pass_at_k"]["4"]  # evaluated with --ks 1 2: only k <= 2 is shared
    [check] = [c for c in _check(cand, _refs(prod)).checks if c["criterion"] == "passk_tolerance"]
    assert check["k"] == 2


def test_missing_and_inconsistent_reports(tasks):
    failures = _check(tasks(GAIN, None), _refs(tasks(PROD, PROD)), candidate_label="candidate v2").failures
    assert failures == ["ood split missing from the candidate v2 eval report"]
    tampered = tasks(GAIN, PROD)
    tampered["splits"]["test"]["pass_at_k"]["1"] = 0.9  # the headline, not what the tasks say
    failures = _check(tampered, _refs(tasks(PROD, PROD))).failures
    assert failures == [
        "test of the candidate eval report: pass@1 0.9 disagrees with its per-task results (0.725); fix: "
        "evaluate it again"
    ]
    no_tasks = tasks(GAIN, PROD)
    del no_tasks["splits"]["test"]["task_successes"]
    [failure] = _check(no_tasks, _refs(tasks(PROD, PROD))).failures
    assert failure.startswith("test of the candidate eval report has no per-task results")
    bad_count = tasks(GAIN, PROD)
    bad_count["splits"]["test"]["task_successes"]["task-000"] = 9  # more successes than samples
    assert "counts of at most samples_per_task (4)" in _check(bad_count, _refs(tasks(PROD, PROD))).failures[0]


@pytest.mark.parametrize(
    "kwargs", [{"passk_tolerance": -0.1}, {"ood_tolerance": float("nan")}, {"min_gain": 2.0}, {"floor": 1.5}]
)
def test_bad_policy(kwargs):
    with pytest.raises(ConfigError, match="fix:"):
        GatePolicy(**kwargs)


@pytest.fixture
def reg_with_production(local_registry, make_adapter, tasks, lineage):
    """A registry whose 'agent' v1 (2 of 4 on each of 10 test and ood tasks) is in production: it beat the base
    model (1 of 4 on each) it was registered with."""
    reg = _registry(local_registry)
    reg.register(
        "agent",
        make_adapter(),
        tasks(PROD, PROD),
        lineage,
        base_eval_report=tasks([1] * 10, PROD, adapter=""),
    )
    event = reg.promote("agent", 1, actor="alice")
    assert event["gate"] == "passed"
    return reg


def _register(reg, make_adapter, lineage, rep) -> int:
    return reg.register("agent", make_adapter(), rep, lineage)


@pytest.mark.parametrize(
    ("candidate", "expected"),
    [
        (
            (NOISE, PROD),
            "gate refused: test pass@1 vs production v1: 0.55 - 0.50 = +0.05, lower bound -0.05 ",
        ),
        ((GAIN, [1] * 10), "gate refused: ood pass@1 vs production v1: 0.25 - 0.50 = -0.25"),
    ],
)
def test_promote_refused_and_audited(reg_with_production, make_adapter, lineage, tasks, candidate, expected):
    reg = reg_with_production
    v = _register(reg, make_adapter, lineage, tasks(*candidate))
    with pytest.raises(GateRefused) as err:
        reg.promote("agent", v, actor="bob")
    assert err.value.exit_code == 3
    assert str(err.value).startswith(expected)
    assert "evaluate on more tasks" in str(err.value) and "--force --reason" in str(err.value)
    assert "\n" not in str(err.value)
    assert reg.aliases("agent") == {"production": 1}
    refused = reg.audit_log("agent")[-1]
    assert refused["event"] == "promote-refused" and refused["version"] == v and refused["by"] == "bob"
    assert refused["gate"] == "refused" and refused["gate_failures"] and refused["gate_checks"]


def test_first_version_without_a_base_report_is_refused(local_registry, make_adapter, lineage, tasks):
    reg = _registry(local_registry)
    reg.register("agent", make_adapter(), tasks(GAIN, PROD), lineage)
    with pytest.raises(GateRefused, match="nothing to compare the candidate v1 with"):
        reg.promote("agent", 1)
    assert reg.aliases("agent") == {}


def test_a_base_report_must_be_of_the_base_model(local_registry, make_adapter, lineage, tasks):
    with pytest.raises(ConfigError, match="evaluates adapter 'file:///a', not the base model"):
        _registry(local_registry).register(
            "agent", make_adapter(), tasks(GAIN, PROD), lineage, base_eval_report=tasks(PROD, PROD)
        )


def test_promote_better_candidate(reg_with_production, make_adapter, lineage, tasks):
    reg = reg_with_production
    v = _register(reg, make_adapter, lineage, tasks(GAIN, PROD))
    event = reg.promote("agent", v, actor="bob")
    assert event["gate"] == "passed" and event["from"] == 1
    assert {c["against"] for c in event["gate_checks"]} == {"production v1"}  # v2 has no base report
    assert reg.aliases("agent") == {"production": v}
    assert reg.resolve("agent", "production") == v
    assert reg.list_versions("agent")[-1]["aliases"] == ["production"]
    assert reg.show("agent", "production")["aliases"] == ["production"]
    assert reg.audit_log("agent")[-1]["gate_checks"] == event["gate_checks"]


def _on_other_tasks(report: dict) -> dict:
    """``report`` as if evaluated on other tasks (a later scheduled run's: task-1xx instead of task-0xx)."""
    for split in report["splits"].values():
        split["task_successes"] = {
            t.replace("task-0", "task-1"): c for t, c in split["task_successes"].items()
        }
    return report


def test_production_evaluated_again_on_the_candidates_tasks_is_compared_task_by_task(
    reg_with_production, make_adapter, lineage, tasks
):
    """A scheduled run judges on new tasks: its candidate (3 of 4 on nine of them) looks better than production's
    registered report (2 of 4, on other tasks), but production evaluated on the same tasks does as well (3 of 4
    on all ten), so the paired comparison refuses; a report of a version that is no longer production is not
    used, and production's registered report, on other tasks, is not compared."""
    reg = reg_with_production
    v = _register(reg, make_adapter, lineage, _on_other_tasks(tasks(GAIN, PROD)))
    same_tasks = _on_other_tasks(tasks([3] * 10, PROD))
    with pytest.raises(
        GateRefused,
        # nine ties and one -.25: GAIN's skew mirrored, -0.025 - 2.918234 * 0.025 = -0.098
        match=r"test pass@1 vs production v1 \(same tasks\): 0.725 - 0.75 = -0.025, lower bound -0.098 \(10 paired",
    ):
        reg.promote("agent", v, current_report=(1, same_tasks))
    (check,) = [c for c in reg.audit_log("agent")[-1]["gate_checks"] if c["criterion"] == "min_gain"]
    assert check["paired"] and check["tasks"] == 10
    # production moved on meanwhile: its registered report is on other tasks, never compared unpaired
    with pytest.raises(
        GateRefused, match="the candidate and production v1 eval reports are on different tasks"
    ):
        reg.promote("agent", v, current_report=(7, same_tasks))


def test_force_needs_reason_and_is_audited(reg_with_production, make_adapter, lineage, tasks):
    reg = reg_with_production
    v = _register(reg, make_adapter, lineage, tasks(NOISE, PROD))
    with pytest.raises(ConfigError, match="--force needs --reason"):
        reg.promote("agent", v, force=True)
    with pytest.raises(ConfigError, match="--force needs --reason"):
        reg.promote("agent", v, force=True, reason="   ")
    event = reg.promote("agent", v, force=True, reason="hotfix: v1 leaks tool tokens", actor="carol")
    assert event["gate"] == "overridden" and event["gate_failures"]
    assert reg.aliases("agent") == {"production": v}
    promotions = [e for e in reg.audit_log("agent") if e["event"] == "promote"]
    assert promotions[-1]["reason"] == "hotfix: v1 leaks tool tokens"
    assert promotions[-1]["forced"] is True and promotions[-1]["by"] == "carol"
    assert reg.alias_history("agent")[-1]["reason"] == "hotfix: v1 leaks tool tokens"


def test_staging_is_gated_once_the_registry_has_a_staging_policy(reg_with_production, make_adapter, lineage,
                                                                   report, tasks):  # fmt: skip
    reg = reg_with_production
    v = _register(reg, make_adapter, lineage, report(0.1, 0.1, 0.1))
    assert reg.promote("agent", v, stage="staging")["gate"] == "not-applicable"
    assert reg.aliases("agent") == {"production": 1, "staging": v}
    reg.set_gate("agent", "staging", {"floor": 0.2}, reason="staging serves a canary")
    worse = _register(reg, make_adapter, lineage, report(0.15, 0.15, 0.15))
    with pytest.raises(GateRefused, match="not above the floor 0.20"):
        reg.promote("agent", worse, stage="staging")
    assert reg.aliases("agent")["staging"] == v


def test_the_gate_policy_lives_in_the_registry_and_callers_may_only_tighten_it(reg_with_production, make_adapter,
                                                                              lineage, tasks):  # fmt: skip
    reg = reg_with_production
    v = _register(reg, make_adapter, lineage, tasks(GAIN, PROD))
    # a looser threshold than the registry's is refused before any comparison counts, and audited
    with pytest.raises(GateRefused, match="ood_tolerance 0.5 is looser than the registry's 0.05"):
        reg.promote("agent", v, thresholds={"ood_tolerance": 0.5})
    assert reg.audit_log("agent")[-1]["event"] == "promote-refused"
    with pytest.raises(ConfigError, match="gate: unknown config key\\(s\\) min_gian"):
        reg.promote("agent", v, thresholds={"min_gian": 0.5})
    # the registry's policy is set by a command, with a reason, audited before and after
    with pytest.raises(ConfigError, match="needs --reason"):
        reg.set_gate("agent", "production", {"min_gain": 0.3}, reason="")
    event = reg.set_gate("agent", "production", {"min_gain": 0.3}, reason="tighter for Q4", actor="dana")
    assert (event["event"], event["by"], event["before"]["min_gain"], event["after"]["min_gain"]) == (
        "set-gate", "dana", 0.0, 0.3,
    )  # fmt: skip
    assert reg.gate_policies("agent")[0].production.min_gain == 0.3
    # the candidate that passed the default policy is now held back; tightening further is allowed
    with pytest.raises(GateRefused, match="not above min_gain 0.30"):
        reg.promote("agent", v)
    with pytest.raises(GateRefused, match="min_gain 0.1 is looser than the registry's 0.3"):
        reg.promote("agent", v, thresholds={"min_gain": 0.1})
    assert (
        reg.promote("agent", v, thresholds={"min_gain": 0.1}, force=True, reason="ok'd")["gate"]
        == "overridden"
    )
    with pytest.raises(ConfigError, match="unknown stage 'prod'; allowed: production, staging"):
        reg.promote("agent", v, stage="prod")


def test_promote_same_version_is_a_no_op(reg_with_production):
    event = reg_with_production.promote("agent", 1)
    assert event["changed"] is False
    assert len(reg_with_production.alias_history("agent")) == 1


def test_rollback(reg_with_production, make_adapter, lineage, tasks):
    reg = reg_with_production
    v2 = _register(reg, make_adapter, lineage, tasks(GAIN, PROD))
    v3 = _register(reg, make_adapter, lineage, tasks([4] * 10, PROD))
    reg.promote("agent", v2)
    reg.promote("agent", v3)
    event = reg.rollback("agent", reason="regression in prod")
    assert (event["from"], event["version"]) == (v3, v2)
    assert reg.aliases("agent") == {"production": v2}
    # A second rollback goes further back instead of toggling to v3.
    assert reg.rollback("agent")["version"] == 1
    with pytest.raises(RegistryError, match="no previous version to roll back to"):
        reg.rollback("agent")
    events = [e["event"] for e in reg.audit_log("agent")]
    assert events.count("rollback") == 2 and events[-1] == "rollback"


def test_rollback_without_history(local_registry, make_adapter, lineage, report):
    reg = _registry(local_registry)
    reg.register("agent", make_adapter(), report(0.5, 0.6, 0.4), lineage)
    with pytest.raises(RegistryError, match="versions so far: none"):
        reg.rollback("agent", stage="staging")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 5.0, -0.1, True, "0.9", None])
def test_check_gate_refuses_values_that_are_not_probabilities(report, bad):
    """NaN compares False with every threshold, so a NaN pass@1 once passed; now any non-probability refuses."""
    candidate = report(0.6, 0.7, 0.4)
    candidate["splits"]["test"]["pass_at_k"]["1"] = bad
    failures = _check(candidate, {"production": report(0.5, 0.7, 0.4)}).failures
    assert failures[0].startswith("test of the candidate eval report: pass_at_k.1")
    assert _check(report(0.6, 0.7, 0.4), {"production": candidate}).failures  # a broken production too


def _with(rep: dict, path: tuple, value) -> dict:
    node = rep
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return rep


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (
            ("splits", "test", "pass_at_k", "1"),
            float("nan"),
            "splits.test: pass_at_k.1 = nan must be a finite number",
        ),
        (("splits", "test", "pass_at_k", "1"), 5.0, r"pass_at_k.1 = 5.0 must be in \[0, 1\]"),
        (("splits", "test", "pass_at_k", "4"), 0.1, "must not decrease as k grows"),
        (("splits", "test", "pass_at_k", "x"), 0.9, "must be k = 1, 2, ... and include 1"),
        (("splits", "test", "ci95"), {"1": [0.9, 0.1]}, r"ci95.1 = \[0.9, 0.1\] is not an interval"),
        (("splits", "test", "samples_per_task"), 2, "k above samples_per_task"),
        (("splits", "test", "n_tasks"), 0, "n_tasks = 0 must be > 0"),
        (
            ("splits",),
            {"ood": {"pass_at_k": {"1": 0.5}}},
            "the test split, which the promotion gate compares",
        ),
        (("splits",), [], r"splits = \[\] is not a mapping"),
    ],
)
def test_register_refuses_reports_the_gate_cannot_trust(local_registry, make_adapter, lineage, report, path,
                                                         value, message):  # fmt: skip
    reg = _registry(local_registry)
    with pytest.raises(ConfigError, match=message) as err:
        reg.register("agent", make_adapter(), _with(report(0.5, 0.7, 0.4), path, value), lineage)
    assert "\n" not in str(err.value) and "fix: " in str(err.value)
    assert reg.list_versions("agent") == []  # nothing registered, so nothing can become production


def test_first_production_needs_a_report_the_gate_can_trust(local_registry, make_adapter, lineage, report,
                                                            monkeypatch):  # fmt: skip
    """A version registered before reports were validated (simulated: intake without the check) cannot become the
    first production, which every later candidate would be compared with."""
    from sdarflow.registry import intake

    reg = _registry(local_registry)
    monkeypatch.setattr(intake, "load_report", dict)
    v = reg.register(
        "agent",
        make_adapter(),
        _with(report(0.5, 0.7, 0.4), ("splits", "test", "pass_at_k", "1"), 5.0),
        lineage,
    )
    monkeypatch.undo()
    with pytest.raises(
        ConfigError, match=rf"eval report of agent v{v}: splits.test: pass_at_k.1 = 5.0 must be in \[0, 1\]"
    ):
        reg.promote("agent", v)
    assert reg.aliases("agent") == {}


def test_a_forced_promotion_still_needs_a_report_the_gate_can_read(reg_with_production, make_adapter, lineage,
                                                                   report):  # fmt: skip
    """Forcing skips the comparison, not the report check: a production without an ood split would refuse every
    later candidate."""
    reg = reg_with_production
    v = _register(reg, make_adapter, lineage, report(0.9, 0.9, None))
    with pytest.raises(
        ConfigError, match=f"eval report of agent v{v} has no ood split.*--splits test --splits ood"
    ):
        reg.promote("agent", v, force=True, reason="hotfix")
    assert reg.aliases("agent") == {"production": 1}


def test_three_of_32_tasks_gaining_one_success_do_not_pass(tasks):
    # Student's t bound alone was +0.0012 and passed; under no gain the three non-zero differences are each as
    # likely + as -, all + with p = 1/8, so the sign-flip bound is 0: not above min_gain 0
    verdict = _check(tasks([1] * 3 + [0] * 29, [0] * 32), _refs(tasks([0] * 32, [0] * 32)))
    [pass1] = [c for c in verdict.checks if c["criterion"] == "min_gain"]
    assert pass1["t_lower"] == pytest.approx(0.0012, abs=1e-4) and pass1["sign_flip_lower"] == 0.0
    assert verdict.failures == [
        "test pass@1 vs production v1: 0.0234 - 0.00 = +0.0234, lower bound +0.00 (32 paired tasks) not above "
        "min_gain 0.00"
    ]


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("env", "tool-use", "env 'tool-use' vs 'textworld-cooking'"),
        ("temperature", 1.0, "temperature 1.0 vs 0.4"),
        ("max_turns", 8, "max_turns 8 vs 0"),
        ("first_task", 10, "first_task 10 vs 0"),
        ("seed", 7, "seed 7 vs 1234"),
    ],
)
def test_reports_made_differently_are_not_compared(tasks, field, value, named):
    protocol = {
        "temperature": 0.4,
        "max_turns": 0,
        "max_new_tokens": 0,
        "history_turns": 4,
        "prompt_format": "chat",
        "first_task": 0,
        "tasks": len(PROD),
        "seed": 1234,
    }
    reference = {**tasks(PROD, PROD), "env": "textworld-cooking", "protocol": protocol}
    candidate = {**tasks(GAIN, PROD), "env": "textworld-cooking", "protocol": dict(protocol)}
    assert _check(candidate, _refs(reference)).passed
    if field == "env":
        candidate["env"] = value
    else:
        candidate["protocol"][field] = value
    verdict = _check(candidate, _refs(reference))
    assert verdict.checks == [] and len(verdict.failures) == 1
    assert (
        f"the candidate and production v1 eval reports were made differently ({named})" in verdict.failures[0]
    )


@pytest.mark.parametrize("strip", ["protocol", "env", "prompt_format", "all"])
def test_a_report_that_does_not_record_how_it_was_made_is_never_paired(tasks, strip):
    """A report without protocol or env (or `{}` as its protocol) skipped the protocol check: a gain measured
    at another temperature or on another env could pass."""
    candidate = tasks(GAIN, PROD)
    if strip == "prompt_format":
        candidate["protocol"] = {k: v for k, v in candidate["protocol"].items() if k != strip}
    elif strip == "all":
        candidate["protocol"] = {}
    else:
        del candidate[strip]
    verdict = _check(candidate, _refs(tasks(PROD, PROD)))
    assert verdict.checks == [] and len(verdict.failures) == 1
    named = {"protocol": "temperature, max_turns", "all": "temperature, max_turns", "env": "its env,"}
    assert verdict.failures[0].startswith("the candidate eval report does not record its ")
    assert named.get(strip, strip) in verdict.failures[0] and "fix: evaluate it again" in verdict.failures[0]


def test_other_samples_per_task_are_not_compared(tasks):
    verdict = _check(tasks([6] * 10, [3] * 10, n=8), _refs(tasks(PROD, PROD)))
    assert verdict.failures == [
        "the candidate and production v1 eval reports were made differently (test samples per task 8 vs 4; ood "
        "samples per task 8 vs 4), so their tasks cannot be compared; fix: evaluate both with the same env and "
        "evaluate settings"
    ]


@pytest.mark.parametrize("tamper", ["delete", "empty", "edit"])
def test_a_gate_policy_the_audit_log_did_not_set_is_refused(
    reg_with_production, make_adapter, lineage, tasks, tamper
):
    """A deleted, emptied or hand-edited gate_policy.json read as the default policy (or as edited), although the
    audit log holds the set-gate event that made it; `registry gate` sets it again."""
    from sdarflow.errors import StorageError

    reg = reg_with_production
    v = _register(reg, make_adapter, lineage, tasks(GAIN, PROD))
    reg.set_gate("agent", "staging", {"min_gain": 0.2}, reason="staging gated")
    reg.set_gate("agent", "production", {"min_gain": 0.3}, reason="tighter for Q4")
    policy = Path(reg._layout("agent").gate_policy)
    if tamper == "delete":
        policy.unlink()
    elif tamper == "empty":
        policy.write_text("{}")
    else:
        data = json.loads(policy.read_text())
        data["production"]["min_gain"] = 0.0
        policy.write_text(json.dumps(data))
    with pytest.raises(StorageError, match="gate policy .* is not the one its audit log records"):
        reg.promote("agent", v)
    assert reg.audit_log("agent")[-1]["event"] == "set-gate"  # nothing was judged by the tampered policy
    reg.set_gate("agent", "production", {"min_gain": 0.3}, reason="restored")
    policies = reg.gate_policies("agent")[0]  # the other stage's policy comes back from the audit log too
    assert (policies.production.min_gain, policies.staging.min_gain) == (0.3, 0.2)
    with pytest.raises(GateRefused, match="not above min_gain 0.30"):
        reg.promote("agent", v)


# a gain on 3 of 32 tasks (+.25 each) and 29 ties: the sign-flip bound cannot clear 0, so the paired gate refuses
FEW_GAINS, FLAT = [3] * 3 + [2] * 29, [2] * 32


def _renamed(report: dict, old: str, new: str) -> dict:
    for split in report["splits"].values():
        split["task_successes"] = {new if t == old else t: c for t, c in split["task_successes"].items()}
    return report


def test_reports_on_other_tasks_are_refused_not_compared_unpaired(tasks):
    assert not _check(tasks(FEW_GAINS, FLAT), _refs(tasks(FLAT, FLAT))).passed
    # one unchanged (tied) task renamed: before, an unpaired Welch bound with no sign-flip bound promoted it
    renamed = _renamed(tasks(FEW_GAINS, FLAT), "task-031", "task-999")
    verdict = _check(renamed, _refs(tasks(FLAT, FLAT)))
    assert not verdict.passed and verdict.checks == []
    assert verdict.failures[0].startswith(
        "test: the candidate and production v1 eval reports are on different tasks (1 only in the candidate's, "
        "1 only in the other, e.g. task-999)"
    )
    # two tasks solved every time against two other tasks never solved: zero variance, was a +1.0 bound
    two = _renamed(_renamed(tasks([4, 4], [4, 4]), "task-000", "x-0"), "task-001", "x-1")
    assert "are on different tasks" in _check(two, _refs(tasks([0, 0], [0, 0]))).failures[0]


def test_a_split_listing_more_tasks_than_its_protocol_evaluated_is_refused(tasks):
    # every task written twice (t and t-dup) on both sides, twice the tasks for the same evidence
    def doubled(counts):
        report = tasks(counts + counts, counts + counts)
        report["protocol"] = {**report["protocol"], "tasks": len(counts)}
        return report

    verdict = _check(doubled(FEW_GAINS), _refs(doubled(FLAT)))
    assert not verdict.passed and verdict.checks == []
    assert (
        "test of the candidate eval report lists 64 tasks, but its protocol evaluated 32"
        in verdict.failures[0]
    )


def test_n_tasks_that_disagrees_with_the_listed_tasks_is_refused(tasks):
    candidate = tasks(GAIN, PROD)
    candidate["splits"]["test"]["n_tasks"] = 1000
    verdict = _check(candidate, _refs(tasks(PROD, PROD)))
    assert any("n_tasks 1000 but 10 tasks in task_successes" in f for f in verdict.failures)


def test_a_report_file_with_a_key_twice_is_refused(tasks, tmp_path):
    from sdarflow.errors import StorageError
    from sdarflow.registry.intake import load_report

    text = json.dumps(tasks(PROD, PROD))
    # the same split twice: json.loads would keep the second silently
    path = tmp_path / "report.json"
    path.write_text(text.replace('"splits": {', '"splits": {"test": {}, ', 1))
    with pytest.raises(StorageError, match="has the key 'test' twice in one object"):
        load_report(str(path))


@pytest.mark.parametrize("context", ["solution", "synthetic"])
def test_a_version_a_privileged_teacher_taught_is_a_control_not_a_release(
    reg_with_production, make_adapter, lineage, tasks, context
):
    # better than production beyond the noise, yet its teacher read the task's solution (or expert labels)
    reg = reg_with_production
    v = _register(reg, make_adapter, {**lineage, "teacher_contexts": ["skills", context]}, tasks(GAIN, PROD))
    with pytest.raises(GateRefused) as err:
        reg.promote("agent", v, actor="bob")
    assert str(err.value).startswith(
        f"gate refused: taught by the {context} teacher (rescore --teacher-context"
    )
    assert reg.aliases("agent") == {"production": 1}
    assert reg.show("agent", v)["lineage"]["teacher_contexts"] == ["skills", context]
    card = (Path(reg.fetch_adapter("agent", v)) / "README.md").read_text()
    assert f"- teacher context: skills, {context} ({context}: a control, refused for production)" in card
    # staging is the control's place; production only forced, with a reason, audited as overridden
    reg.promote("agent", v, stage="staging", actor="bob")
    event = reg.promote("agent", v, force=True, reason="positive control, demo only", actor="bob")
    assert event["gate"] == "overridden" and any(context in f for f in event["gate_failures"])
    # the skills teacher (SDAR's) is no control, and a version from before lineage named teachers is not refused
    assert gate.teacher_failures({"teacher_contexts": ["skills"]}) == gate.teacher_failures({}) == []
