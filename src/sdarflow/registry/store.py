"""The adapter registry: immutable numbered versions, stage aliases with history, a promotion gate, an audit log.

Writers are concurrent pipeline runs and people, so every shared write is conditional: a version number is
claimed by creating its claim marker exclusively, aliases (``aliases.json``: each stage's version, with its
history) move by compare-and-swap, and each audit event is an object of its own, so appends never race.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import os
import socket
import tempfile
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sdarflow import storage
from sdarflow.config import FileSchema, opt
from sdarflow.defaults import RELEASE_STAGES, VERSION_KIND
from sdarflow.errors import ConfigError, StorageError
from sdarflow.models.identity import adapter_folder_id, adapter_id, lora_rank
from sdarflow.registry import cas, gate, intake
from sdarflow.registry.errors import GateRefused, RegistryConflict, RegistryError
from sdarflow.registry.layout import (
    BASE_EVAL_REPORT,
    EVAL_REPORT,
    LINEAGE,
    MAX_VERSION,
    MODEL_CARD,
    Layout,
    parse_version,
    validate_stage,
)
from sdarflow.storage.files import parse_json

log = logging.getLogger(__name__)


def default_actor() -> str:
    """Who is acting, for history and audit: ``SDARFLOW_ACTOR`` (set it in pipelines) or user@host."""
    user = os.environ.get("USER") or os.environ.get("LOGNAME") or "unknown"
    return os.environ.get("SDARFLOW_ACTOR") or f"{user}@{socket.gethostname()}"


def read_aliases(layout: Layout) -> tuple[dict[str, Any], str | None]:
    """The alias state and its etag (None when no alias was ever set); pass the etag to :func:`move_alias`."""
    data, etag = cas.read_versioned(layout.aliases)
    if data is None:
        return {"name": layout.name, "stages": {}}, None
    try:
        state = json.loads(data)
    except (ValueError, RecursionError) as err:  # not JSON, not UTF-8, or nested without end
        raise StorageError(f"'{layout.aliases}' is not valid JSON ({err}); fix: restore it") from err
    # the shape the registry writes: a version is used to build a path, so it must be a number >= 1
    fix = "fix: restore it from a backup (the registry's audit log records every change)"
    _AliasState.check(state, f"'{layout.aliases}' is not an alias state", fix, StorageError)
    for entry in state.setdefault("stages", {}).values():
        entry.setdefault("history", [])
    return state, etag


def move_alias(
    layout: Layout, state: dict[str, Any], etag: str | None, stage: str, event: dict[str, Any]
) -> None:
    """Point ``stage`` at ``event["version"]``, appending ``event`` (with its time) to the stage's history, and
    write the state back only if it is still the one read with ``etag`` (:class:`RegistryConflict` otherwise)."""
    entry = state["stages"].setdefault(stage, {"version": None, "history": []})
    entry["history"].append({**event, "at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")})
    entry["version"] = event["version"]
    try:
        cas.cas_write(layout.aliases, json.dumps(state, indent=2, sort_keys=True).encode(), etag)
    except RegistryConflict as err:
        raise RegistryConflict(
            f"{event['action']} of {layout.name} v{event['version']} to {stage} failed: someone else changed the "
            f"aliases of '{layout.name}' at the same time; fix: check `sdarflow registry list --registry "
            f"{layout.root} --policy-name {layout.name}` and retry"
        ) from err
    before = f"v{event['from']}" if event["from"] else "(none)"
    log.info("%s %s: %s -> v%d", layout.name, stage, before, event["version"])


def alias_stack(history: list[dict[str, Any]]) -> list[int]:
    """Replay history: a promotion pushes its version, a rollback pops one (two rollbacks go back two versions)."""
    stack: list[int] = []
    for item in history:
        if item.get("action") == "rollback":
            if stack:
                stack.pop()
        else:
            stack.append(int(item["version"]))
    return stack


@dataclasses.dataclass
class _Event(FileSchema):
    version: int | None = opt(None, "the version a promotion pointed the stage at", ge=1)
    action: str = opt("", "promote or rollback")

    def validate(self) -> None:
        if self.version is None and self.action != "rollback":
            raise ConfigError("a promotion in the history names no version")


@dataclasses.dataclass
class _Stage(FileSchema):
    version: int | None = opt(None, "the version the stage points at now", ge=1)
    history: list[_Event] = opt([], "every promotion and rollback of the stage")


@dataclasses.dataclass
class _AliasState(FileSchema):
    stages: dict[str, _Stage] = opt({}, "each stage's alias")


# Bounds the claim loop: more than this many writers racing for one name means something is wrong.
_MAX_CLAIM_ATTEMPTS = 1000


def _claim(layout: Layout, version: int | None, actor: str) -> int:
    """Reserve a version number (``version``, or the next free one) by exclusively creating its claim marker,
    retrying with v+1 when another writer got there first: numbers are never reused, even after a failed publish."""
    marker = {
        "by": actor,
        "at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "claim": uuid.uuid4().hex,
    }
    data = json.dumps(marker).encode()
    if version is not None:
        number = parse_version(version)
        if number is None:
            raise ConfigError(
                f"bad version {version!r}: versions are integers from 1 to {MAX_VERSION}; fix: e.g. --version 3"
            )
        if not cas.create_exclusive(layout.claim(number), data):
            raise RegistryError(
                f"version {number} of '{layout.name}' already exists and versions are immutable; "
                f"fix: register without an explicit version to get the next free number"
            )
        return number
    # the highest version claimed or published, plus one
    claimed = [parse_version(Path(n).stem) for n in storage.children(layout.claims)]
    published = [parse_version(n) for n in storage.children(layout.versions)]
    number = max([v for v in claimed + published if v is not None], default=0) + 1
    for _ in range(_MAX_CLAIM_ATTEMPTS):
        if cas.create_exclusive(layout.claim(number), data):
            return number
        number += 1  # someone else claimed it between our listing and our create: try the next
    raise RegistryConflict(
        f"could not claim a version of '{layout.name}' after {_MAX_CLAIM_ATTEMPTS} attempts; fix: retry"
    )


class Registry:
    """An adapter registry at a local folder or ``s3://bucket/prefix``."""

    def __init__(self, uri: str | Path) -> None:
        self.uri = storage.resolve(str(uri)).uri

    def __repr__(self) -> str:
        return f"Registry({self.uri!r})"

    def _layout(self, name: str) -> Layout:
        return Layout(self.uri, name)

    def register(
        self,
        name: str,
        adapter_dir: str | Path,
        eval_report: Mapping[str, Any] | str | Path,
        lineage: Mapping[str, Any],
        *,
        base_model: str | Path | None = None,
        base_eval_report: Mapping[str, Any] | str | Path | None = None,
        version: int | None = None,
        actor: str | None = None,
    ) -> int:
        """Publish ``adapter_dir`` with its eval report and lineage as a new immutable version; return its number.
        ``base_eval_report`` (the base model on the same tasks) is a reference of the gate."""
        layout = self._layout(name)
        adapter_dir = Path(adapter_dir)
        adapter_config = intake.check_adapter_dir(adapter_dir)
        base = intake.checked_base(adapter_dir, adapter_config, base_model, strict=True)
        report = intake.load_report(eval_report)
        base_report = None if base_eval_report is None else intake.load_base_report(base_eval_report)
        intake.check_bound(
            report, adapter_folder_id(adapter_dir), intake.bound_base_id(adapter_dir, base), base_report
        )
        intake.check_lineage(lineage)
        actor = actor or default_actor()

        with tempfile.TemporaryDirectory(prefix="sdarflow-register-") as tmp:
            staged = Path(tmp) / "version"
            intake.stage_version(adapter_dir, report, lineage, staged, base_report)
            number = _claim(layout, version, actor)
            card = staged / MODEL_CARD
            # staging hard-links the adapter's own README.md (PEFT's template): replace the link, never edit it
            card.unlink(missing_ok=True)
            card.write_text(
                intake.model_card(name, number, report, lineage, adapter_config, base_report, actor)
            )
            storage.publish_dir(
                staged,
                layout.version(number),
                kind=VERSION_KIND,
                name=name,
                version=number,
                lora_rank=lora_rank(adapter_config),
                base_model=adapter_config.get("base_model_name_or_path"),
                checked_against_base=base or None,
                registered_by=actor,
                source=str(adapter_dir.absolute()),
            )
        self._audit(layout, "register", version=number, by=actor)
        log.info("registered %s v%d in %s", name, number, self.uri)
        return number

    def list_names(self) -> list[str]:
        """Adapter names with at least one claimed version."""
        names = []
        for child in storage.children(self.uri):
            try:
                layout = self._layout(child)
            except ConfigError:
                continue  # a foreign file or folder next to the registry's names
            if storage.children(layout.claims):
                names.append(child)
        return names

    def _manifest(self, layout: Layout, version: int) -> dict[str, Any]:
        uri = layout.version(version)
        if not storage.is_published(uri):
            raise StorageError(
                f"version {version} of '{layout.name}' does not exist in {self.uri}; "
                f"fix: see the versions with `sdarflow registry list --registry {self.uri} --policy-name {layout.name}`"
            )
        return storage.read_manifest(uri, VERSION_KIND)

    def _read_verified_json(self, layout: Layout, version: int, filename: str) -> Any:
        """A JSON file of a version, refused if its bytes do not match the sha256 recorded at register."""
        self._manifest(layout, version)  # a missing version: the error that says how to list them
        return storage.read_member_json(layout.version(version), filename, VERSION_KIND)

    def lineage(self, name: str, version_or_alias: int | str) -> dict[str, Any]:
        layout, version = self._layout(name), self.resolve(name, version_or_alias)
        lineage = self._read_verified_json(layout, version, LINEAGE)
        if not isinstance(lineage, dict):
            raise StorageError(
                f"'{layout.version(version)}/{LINEAGE}' is not a JSON object; fix: register again"
            )
        return lineage

    def _eval_report(self, layout: Layout, version: int, base: bool = False) -> dict[str, Any] | None:
        """A version's eval report (``base``: the base model's it was registered with, None when it has none),
        validated again as at register (a replaced one never reaches the gate)."""
        if base and storage.member_entry(self._manifest(layout, version), BASE_EVAL_REPORT) is None:
            return None
        report = self._read_verified_json(layout, version, BASE_EVAL_REPORT if base else EVAL_REPORT)
        return intake.validate_report(report, f"{'(base) ' if base else ''}of {layout.name} v{version}")

    def eval_report(self, name: str, version_or_alias: int | str) -> dict[str, Any]:
        return self._eval_report(self._layout(name), self.resolve(name, version_or_alias))

    def versions(self, name: str) -> list[int]:
        """The name's published version numbers, oldest first ([] for a name with none)."""
        layout = self._layout(name)
        numbers = (parse_version(n) for n in storage.children(layout.versions))
        # Claimed but unpublished versions (in progress, or failed) have no manifest and do not exist yet.
        return sorted(v for v in numbers if v is not None and storage.is_published(layout.version(v)))

    def resolve(self, name: str, version_or_alias: int | str) -> int:
        """A version number from ``3``, ``"3"``, ``"v3"``, a stage (``production``) or ``latest``."""
        layout = self._layout(name)
        number = parse_version(version_or_alias)
        if number is not None:
            self._manifest(layout, number)  # refuses a version that does not exist
            return number
        if version_or_alias == "latest":
            published = self.versions(name)
            if not published:
                raise StorageError(f"'{name}' has no versions in {self.uri}; fix: register one first")
            return published[-1]
        if version_or_alias in RELEASE_STAGES:
            current = self.aliases(name).get(str(version_or_alias))
            if current is None:
                raise RegistryError(
                    f"'{name}' has no '{version_or_alias}' alias yet; fix: promote a version to it first"
                )
            return current
        raise ConfigError(
            f"bad version or alias {version_or_alias!r} for '{name}'; allowed: a version number, "
            f"'latest', {', '.join(RELEASE_STAGES)}; fix: e.g. --version 3"
        )

    def aliases(self, name: str) -> dict[str, int]:
        """Stage -> current version."""
        state, _ = read_aliases(self._layout(name))
        return {stage: entry["version"] for stage, entry in state["stages"].items() if entry.get("version")}

    def alias_history(self, name: str, stage: str = "production") -> list[dict[str, Any]]:
        state, _ = read_aliases(self._layout(name))
        return list(state["stages"].get(validate_stage(stage), {}).get("history", []))

    def list_versions(self, name: str) -> list[dict[str, Any]]:
        """One row per published version: version, created_at, by, pass@1 on test/ood, aliases pointing at it."""
        layout = self._layout(name)
        current = self.aliases(name)
        rows = []
        for version in self.versions(name):
            manifest = self._manifest(layout, version)
            report = self._eval_report(layout, version)
            rows.append(
                {
                    "version": version,
                    "created_at": manifest.get("created_at"),
                    "by": manifest.get("registered_by"),
                    # a validated report's splits each have a pass@1 in [0, 1]
                    "pass@1": {
                        s: float(report["splits"][s]["pass_at_k"]["1"]) if s in report["splits"] else None
                        for s in ("test", "ood")
                    },
                    "aliases": sorted(stage for stage, v in current.items() if v == version),
                }
            )
        return rows

    def show(self, name: str, version_or_alias: int | str) -> dict[str, Any]:
        """Everything about one version: lineage, eval summary, files with sha256, aliases pointing at it."""
        layout = self._layout(name)
        version = self.resolve(name, version_or_alias)
        manifest = self._manifest(layout, version)
        report = self._eval_report(layout, version)
        summary = {
            split: {key: s.get(key) for key in ("n_tasks", "samples_per_task", "pass_at_k")}
            for split, s in report["splits"].items()
            if isinstance(s, Mapping)
        }
        return {
            "name": name,
            "version": version,
            "uri": layout.version(version),
            "created_at": manifest.get("created_at"),
            "by": manifest.get("registered_by"),
            "base_model": report.get("base_model") or manifest.get("base_model"),
            "lora_rank": manifest.get("lora_rank"),
            "aliases": sorted(stage for stage, v in self.aliases(name).items() if v == version),
            "lineage": self.lineage(name, version),
            "eval": summary,
            "files": [{k: f.get(k) for k in ("path", "bytes", "sha256")} for f in manifest["files"]],
        }

    def fetch_adapter(self, name: str, version_or_alias: int | str, dest: str | Path | None = None) -> Path:
        """A local folder with the version's files, sha256-verified (a local registry's own, without ``dest``)."""
        version = self.resolve(name, version_or_alias)
        return storage.fetch_dir(self._layout(name).version(version), kind=VERSION_KIND, dest=dest)

    def audit_log(self, name: str) -> list[dict[str, Any]]:
        """Every event for ``name``, oldest first."""
        layout = self._layout(name)
        return [storage.read_json(storage.join(layout.audit, n)) for n in storage.children(layout.audit)]

    def gate_policies(self, name: str) -> tuple[gate.GatePolicies, str | None]:
        """The name's gate policies (``GATE`` for production until ``set_gate`` stores one) and their etag, after
        checking them against the audit log: each stage's policy is its last ``set-gate`` event's ``after``, so a
        deleted, emptied or hand-edited policy file is refused, never read as the default."""
        policies, etag = self._stored_gate_policies(name)
        for stage, after in self._audited_gates(name).items():
            stored = getattr(policies, stage, None)
            if stored is None or dataclasses.asdict(stored) != after:
                state = "missing" if etag is None else dataclasses.asdict(stored) if stored else "none"
                raise StorageError(
                    f"{name}'s {stage} gate policy ({state}) is not the one its audit log records ({after}); fix: "
                    f"set it again with `sdarflow registry gate --stage {stage} ... --reason TEXT`"
                )
        return policies, etag

    def _audited_gates(self, name: str) -> dict[str, Any]:
        """Stage -> the policy its last ``set-gate`` event set."""
        return {e.get("stage"): e.get("after") for e in self.audit_log(name) if e.get("event") == "set-gate"}

    def _stored_gate_policies(self, name: str) -> tuple[gate.GatePolicies, str | None]:
        """The policy file as stored (the defaults when absent) and its etag."""
        layout = self._layout(name)
        data, etag = cas.read_versioned(layout.gate_policy)
        if data is None:
            return gate.GatePolicies(), None
        fix = "fix: set it again with `sdarflow registry gate` (the audit log records every change)"
        where = f"'{layout.gate_policy}'"
        return gate.GatePolicies.check(parse_json(data, where), where, fix, StorageError), etag

    def set_gate(
        self,
        name: str,
        stage: str,
        thresholds: Mapping[str, float | None],
        reason: str,
        actor: str | None = None,
    ) -> dict[str, Any]:
        """Set ``stage``'s gate thresholds (those not None) for every later promotion of ``name``; audited with
        the policy before and after. Returns the audit event."""
        layout = self._layout(name)
        validate_stage(stage)
        if not reason.strip():
            raise ConfigError(
                "registry gate: setting a policy needs --reason TEXT (it is audited); fix: add it"
            )
        # from what the audit log records, whatever the file holds: setting a policy also repairs a broken file
        _, etag = cas.read_versioned(layout.gate_policy)
        audited = self._audited_gates(name)
        policies = gate.GatePolicies(**{k: gate.GatePolicy.from_dict(v) for k, v in audited.items()})
        before = getattr(policies, stage)
        given = {k: v for k, v in thresholds.items() if v is not None}
        after = dataclasses.replace(before or gate.GATE, **given)
        updated = dataclasses.replace(policies, **{stage: after})
        blob = json.dumps(dataclasses.asdict(updated), indent=2, sort_keys=True).encode()
        cas.cas_write(layout.gate_policy, blob, etag)
        before = None if before is None else dataclasses.asdict(before)
        return self._audit(
            layout, "set-gate", stage=stage, by=actor or default_actor(), reason=reason, before=before,
            after=dataclasses.asdict(after),
        )  # fmt: skip

    def promote(
        self,
        name: str,
        version: int | str,
        stage: str = "production",
        thresholds: Mapping[str, float | None] | None = None,
        force: bool = False,
        reason: str = "",
        actor: str | None = None,
        current_report: tuple[int, Mapping[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """Point ``stage`` at ``version`` if the stage's gate (``set_gate``; ``thresholds`` may only tighten it)
        passes, or with ``force`` and a ``reason``; a refusal is audited too. Returns the audit event.
        ``current_report``: (version, report) of the stage's version evaluated again on the candidate's tasks, what
        the gate compares with while that version is still the stage's current one."""
        layout = self._layout(name)
        validate_stage(stage)
        if force and not reason.strip():
            raise ConfigError("--force needs --reason TEXT: overrides are audited; fix: add --reason '...'")
        number = self.resolve(name, version)
        actor = actor or default_actor()

        state, etag = read_aliases(layout)
        current = state["stages"].get(stage, {}).get("version")
        if current == number:
            log.info("%s %s already points at v%d: nothing to do", name, stage, number)
            return {"event": "promote", "name": name, "stage": stage, "version": number, "changed": False}

        verdict = self._gate(layout, number, current, stage, thresholds or {}, force, current_report)
        event = {"version": number, "action": "promote", "from": current, "gate": verdict.pop("gate")}
        if verdict.get("gate_failures") and not force:
            self._audit(layout, "promote-refused", stage=stage, by=actor, **event, **verdict)
            raise GateRefused(gate.refusal_message(verdict["gate_failures"]))
        if event["gate"] == "overridden":
            log.warning("gate overridden for %s v%d (%s): %s", name, number, reason, verdict["gate_failures"])
        move_alias(layout, state, etag, stage, {**event, "by": actor, "reason": reason})
        return self._audit(
            layout, "promote", stage=stage, by=actor, reason=reason, forced=force, **event, **verdict
        )

    def _gate(
        self,
        layout: Layout,
        number: int,
        current: int | None,
        stage: str,
        thresholds: Mapping,
        force: bool,
        current_report: tuple[int, Mapping[str, Any]] | None,
    ) -> dict[str, Any]:
        """The gate's decision for the audit log: ``gate`` ('passed', 'overridden', 'refused' or
        'not-applicable'), the policy applied, every comparison's numbers and the failures."""
        stored = getattr(self.gate_policies(layout.name)[0], stage)
        if stored is None:
            return {"gate": "not-applicable"}  # no staging policy: staging is ungated
        policy, looser = gate.tightened(stored, thresholds)
        candidate = self._eval_report(layout, number)
        if force:
            # Unchecked when overridden, yet every later candidate is compared with it: its report must be one the
            # gate can read (registered by an older sdarflow, or with one split only).
            intake.validate_report(candidate, f"of {layout.name} v{number}", require=gate.SPLITS)
        label, production = stage, None
        if current is not None:
            label, production = f"{stage} v{current}", self._eval_report(layout, current)
            if current_report is not None and current_report[0] == current:
                where = f"of {layout.name} v{current} evaluated again"
                again = intake.validate_report(current_report[1], where)
                files = {e["path"]: e["sha256"] for e in self._manifest(layout, current)["files"]}
                intake.check_bound(
                    again,
                    adapter_id(files),
                    candidate.get("base_id") or None,
                    what=f"the report {where}",
                )
                label, production = f"{label} (same tasks)", again
            elif current_report is not None:
                log.warning(
                    "%s %s moved from v%d to v%d during the run: the gate compares with v%d's registered report",
                    layout.name, stage, current_report[0], current, current,
                )  # fmt: skip
        references = {label: production, "base model": self._eval_report(layout, number, base=True)}
        verdict = gate.check_gate(candidate, references, policy, candidate_label=f"candidate v{number}")
        failures = [*looser, *verdict.failures]
        if stage == "production":
            failures += gate.teacher_failures(self.lineage(layout.name, number))
        outcome = "overridden" if failures and force else "refused" if failures else "passed"
        return {
            "gate": outcome,
            "gate_policy": dataclasses.asdict(policy),
            "gate_checks": verdict.checks,
            "gate_failures": failures,
        }

    def rollback(
        self, name: str, stage: str = "production", reason: str = "", actor: str | None = None
    ) -> dict[str, Any]:
        """Point ``stage`` back at the version it had before its current one. Returns the audit event."""
        layout = self._layout(name)
        validate_stage(stage)
        actor = actor or default_actor()
        state, etag = read_aliases(layout)
        stack = alias_stack(state["stages"].get(stage, {}).get("history", []))
        if len(stack) < 2:
            raise RegistryError(
                f"'{name}' {stage} has no previous version to roll back to (versions so far: {stack or 'none'}); "
                f"fix: promote a version explicitly with `sdarflow registry promote`"
            )
        event = {"version": stack[-2], "action": "rollback", "from": stack[-1]}
        move_alias(layout, state, etag, stage, {**event, "by": actor, "reason": reason})
        return self._audit(layout, "rollback", stage=stage, by=actor, reason=reason, **event)

    def _audit(self, layout: Layout, event: str, **fields: Any) -> dict[str, Any]:
        now = dt.datetime.now(dt.UTC)
        record = {"event": event, "name": layout.name, "at": now.isoformat(timespec="microseconds"), **fields}
        # Time first so names sort chronologically; the uuid makes concurrent appends distinct objects.
        key = f"{now.strftime('%Y%m%dT%H%M%S%fZ')}-{uuid.uuid4().hex[:12]}.json"
        storage.write_json(storage.join(layout.audit, key), record)
        return record
