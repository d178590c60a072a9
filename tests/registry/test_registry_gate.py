"""The promotion gate (pure check and through Registry.promote), forced overrides, staging, and rollback."""

from __future__ import annotations

import pytest

from sdarflow.errors import ConfigError
from sdarflow.registry import GatePolicy, GateRefused, Registry, RegistryError, check_gate


def test_check_gate_passk_fell(report):
    # pass@1 rose by 5 points, but pass@4 fell by 4: the sharpening failure mode.
    failures = check_gate(report(0.55, 0.58, 0.40), report(0.50, 0.62, 0.40))
    assert failures == ["test pass@4 0.58 < production 0.62 - tolerance 0.02"]


def test_check_gate_ood_fell(report):
    failures = check_gate(report(0.60, 0.70, 0.30), report(0.50, 0.70, 0.40))
    assert failures == ["ood pass@1 0.30 < production 0.40 - tolerance 0.02"]


def test_check_gate_boundaries(report):
    # Exactly at the tolerance passes despite float rounding (0.62 - 0.02 != 0.60 in binary).
    assert check_gate(report(0.50, 0.60, 0.38), report(0.50, 0.62, 0.40)) == []
    failures = check_gate(report(0.55, 0.70, 0.40), report(0.50, 0.70, 0.40), GatePolicy(min_gain=0.1))
    assert failures == ["test pass@1 0.55 < production 0.50 + min_gain 0.10"]
    failures = check_gate(report(0.6199, 0.70, 0.40), report(0.62, 0.70, 0.40))
    assert failures == ["test pass@1 0.6199 < production 0.62 + min_gain 0.00"]


def test_check_gate_uses_largest_common_k(report):
    candidate = report(0.6, 0.7, 0.4, k=4)
    production = report(0.5, 0.9, 0.4, k=8)
    production["splits"]["test"]["pass_at_k"]["4"] = 0.71
    assert check_gate(candidate, production) == []


def test_check_gate_missing_split(report):
    failures = check_gate(report(0.6, 0.7, None), report(0.5, 0.7, 0.4), candidate_label="candidate v2")
    assert failures == ["ood split missing from the candidate v2 eval report"]


@pytest.mark.parametrize(
    "kwargs", [{"passk_tolerance": -0.1}, {"ood_tolerance": float("nan")}, {"min_gain": 2.0}]
)
def test_bad_policy(kwargs):
    with pytest.raises(ConfigError, match="fix:"):
        GatePolicy(**kwargs)


@pytest.fixture
def reg_with_production(local_registry, make_adapter, report, lineage):
    """A registry whose 'agent' v1 (test pass@1 0.50, pass@4 0.62, ood 0.40) is in production."""
    reg = Registry(local_registry)
    reg.register("agent", make_adapter(), report(0.50, 0.62, 0.40), lineage)
    reg.promote("agent", 1, actor="alice")  # first version: nothing to beat
    return reg


def _register(reg, make_adapter, lineage, rep) -> int:
    return reg.register("agent", make_adapter(), rep, lineage)


@pytest.mark.parametrize(
    ("candidate", "expected"),
    [
        ((0.55, 0.58, 0.40), "gate refused: test pass@4 0.58 < production v1 0.62 - tolerance 0.02; fix:"),
        ((0.60, 0.70, 0.30), "gate refused: ood pass@1 0.30 < production v1 0.40 - tolerance 0.02; fix:"),
    ],
)
def test_promote_refused(reg_with_production, make_adapter, lineage, report, candidate, expected):
    reg = reg_with_production
    v = _register(reg, make_adapter, lineage, report(*candidate))
    with pytest.raises(GateRefused) as err:
        reg.promote("agent", v)
    assert err.value.exit_code == 3
    assert str(err.value).startswith(expected)
    assert "--force --reason" in str(err.value) and "\n" not in str(err.value)
    assert reg.aliases("agent") == {"production": 1}


def test_promote_refused_when_split_missing(reg_with_production, make_adapter, lineage, report):
    reg = reg_with_production
    v = _register(reg, make_adapter, lineage, report(0.9, 0.9, None))
    with pytest.raises(GateRefused, match=f"ood split missing from the candidate v{v} eval report"):
        reg.promote("agent", v)


def test_promote_better_candidate(reg_with_production, make_adapter, lineage, report):
    reg = reg_with_production
    v = _register(reg, make_adapter, lineage, report(0.58, 0.66, 0.41))
    event = reg.promote("agent", v, actor="bob")
    assert event["gate"] == "passed" and event["from"] == 1
    assert reg.aliases("agent") == {"production": v}
    assert reg.resolve("agent", "production") == v
    assert reg.list_versions("agent")[-1]["aliases"] == ["production"]
    assert reg.show("agent", "production")["aliases"] == ["production"]


def test_force_needs_reason_and_is_audited(reg_with_production, make_adapter, lineage, report):
    reg = reg_with_production
    v = _register(reg, make_adapter, lineage, report(0.55, 0.58, 0.40))
    with pytest.raises(ConfigError, match="--force needs --reason"):
        reg.promote("agent", v, force=True)
    with pytest.raises(ConfigError, match="--force needs --reason"):
        reg.promote("agent", v, force=True, reason="   ")
    event = reg.promote("agent", v, force=True, reason="hotfix: v1 leaks tool tokens", actor="carol")
    assert event["gate"] == "overridden"
    assert reg.aliases("agent") == {"production": v}
    promotions = [e for e in reg.audit_log("agent") if e["event"] == "promote"]
    assert promotions[-1]["reason"] == "hotfix: v1 leaks tool tokens"
    assert promotions[-1]["forced"] is True and promotions[-1]["by"] == "carol"
    assert reg.alias_history("agent")[-1]["reason"] == "hotfix: v1 leaks tool tokens"


def test_staging_is_ungated(reg_with_production, make_adapter, lineage, report):
    reg = reg_with_production
    v = _register(reg, make_adapter, lineage, report(0.1, 0.1, 0.1))
    assert reg.promote("agent", v, stage="staging")["gate"] == "not-applicable"
    assert reg.aliases("agent") == {"production": 1, "staging": v}
    with pytest.raises(ConfigError, match="unknown stage 'prod'; allowed: production, staging"):
        reg.promote("agent", v, stage="prod")


def test_promote_same_version_is_a_no_op(reg_with_production):
    event = reg_with_production.promote("agent", 1)
    assert event["changed"] is False
    assert len(reg_with_production.alias_history("agent")) == 1


def test_rollback(reg_with_production, make_adapter, lineage, report):
    reg = reg_with_production
    v2 = _register(reg, make_adapter, lineage, report(0.55, 0.66, 0.41))
    v3 = _register(reg, make_adapter, lineage, report(0.60, 0.70, 0.42))
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
    reg = Registry(local_registry)
    reg.register("agent", make_adapter(), report(0.5, 0.6, 0.4), lineage)
    with pytest.raises(RegistryError, match="versions so far: none"):
        reg.rollback("agent", stage="staging")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 5.0, -0.1, True, "0.9", None])
def test_check_gate_refuses_values_that_are_not_probabilities(report, bad):
    """NaN compares False with every threshold, so a NaN pass@1 once passed; now any non-probability refuses."""
    candidate = report(0.6, 0.7, 0.4)
    candidate["splits"]["test"]["pass_at_k"]["1"] = bad
    failures = check_gate(candidate, report(0.5, 0.7, 0.4))
    assert (
        failures
        and f"test pass@1 = {bad!r} in the candidate eval report is not a number in [0, 1]" in failures
    )
    assert check_gate(report(0.6, 0.7, 0.4), candidate)  # a broken production report refuses too


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
            "splits.test.pass_at_k.1: Input should be a finite",
        ),
        (("splits", "test", "pass_at_k", "1"), 5.0, "less than or equal to 1"),
        (("splits", "test", "pass_at_k", "4"), 0.1, "must not decrease as k grows"),
        (("splits", "test", "pass_at_k", "x"), 0.9, "must be k = 1, 2, ... and include 1"),
        (("splits", "test", "ci95"), {"1": [0.9, 0.1]}, r"ci95\[1\] = \[0.9, 0.1\] is not an interval"),
        (("splits", "test", "samples_per_task"), 2, "k above samples_per_task"),
        (("splits", "test", "n_tasks"), 0, "greater than 0"),
        (
            ("splits",),
            {"ood": {"pass_at_k": {"1": 0.5}}},
            "the test split, which the promotion gate compares",
        ),
        (("splits",), [], "splits: Input should be a valid dictionary"),
    ],
)
def test_register_refuses_reports_the_gate_cannot_trust(local_registry, make_adapter, lineage, report, path,
                                                         value, message):  # fmt: skip
    reg = Registry(local_registry)
    with pytest.raises(ConfigError, match=message) as err:
        reg.register("agent", make_adapter(), _with(report(0.5, 0.7, 0.4), path, value), lineage)
    assert "\n" not in str(err.value) and "fix: " in str(err.value)
    assert reg.list_versions("agent") == []  # nothing registered, so nothing can become production


def test_first_production_needs_a_report_the_gate_can_trust(local_registry, make_adapter, lineage, report,
                                                            monkeypatch):  # fmt: skip
    """A version registered before reports were validated (simulated: intake without the check) cannot become the
    first production, which every later candidate would be compared with."""
    from sdarflow.registry import intake

    reg = Registry(local_registry)
    monkeypatch.setattr(intake, "load_report", dict)
    v = reg.register("agent", make_adapter(), report(5.0, 5.0, 0.4), lineage)
    monkeypatch.undo()
    with pytest.raises(
        ConfigError, match=f"eval report of agent v{v}: splits.test.pass_at_k.1: Input should be"
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
