"""A name's stage aliases (``aliases.json``): which version each stage points at, with its history, read and
written with compare-and-swap (:mod:`sdarflow.registry.cas`) so concurrent promotions never lose an update."""

from __future__ import annotations

import datetime as dt
import json
import logging
from typing import Any

from sdarflow.errors import StorageError
from sdarflow.registry import cas
from sdarflow.registry.errors import RegistryConflict
from sdarflow.registry.layout import Layout

log = logging.getLogger(__name__)


def read_aliases(layout: Layout) -> tuple[dict[str, Any], str | None]:
    """The alias state and its etag (None when no alias was ever set); pass the etag to :func:`move`."""
    data, etag = cas.read_versioned(layout.aliases)
    if data is None:
        return {"name": layout.name, "stages": {}}, None
    try:
        state = json.loads(data)
    except (ValueError, RecursionError) as err:  # not JSON, not UTF-8, or nested without end
        raise StorageError(f"'{layout.aliases}' is not valid JSON ({err}); fix: restore it") from err
    return checked_alias_state(state, layout.aliases), etag


def move(layout: Layout, state: dict[str, Any], etag: str | None, stage: str, event: dict[str, Any]) -> None:
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
    """Replay history: a promotion pushes its version, a rollback pops one; the top is the current version.

    Popping (not "the previous history entry") makes two rollbacks go back two versions instead of toggling.
    """
    stack: list[int] = []
    for item in history:
        if item.get("action") == "rollback":
            if stack:
                stack.pop()
        else:
            stack.append(int(item["version"]))
    return stack


def _positive(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def checked_alias_state(state: object, where: str) -> dict[str, Any]:
    """The alias state when its shape is what the registry writes: ``{"stages": {stage: {"version": N | null,
    "history": [{"version": N, ...}, ...]}}}``; a version is used to build a path, so it must be a number >= 1.
    StorageError (one line) for anything else."""
    fix = "fix: restore it from a backup (the registry's audit log records every change)"
    if not isinstance(state, dict) or not isinstance(state.setdefault("stages", {}), dict):
        raise StorageError(f"'{where}' is not an alias state (an object with a 'stages' object); {fix}")
    for stage, entry in state["stages"].items():
        if not isinstance(entry, dict) or not isinstance(entry.setdefault("history", []), list):
            raise StorageError(f"'{where}': stage {stage!r} is not an object with a 'history' list; {fix}")
        events = entry["history"]
        if not all(isinstance(e, dict) for e in events):
            raise StorageError(f"'{where}': stage {stage!r} has a history entry that is not an object; {fix}")
        # a promotion event carries its version; the current version and a rollback's may be empty
        named = [(entry.get("version"), True)]
        named += [(e.get("version"), e.get("action") == "rollback") for e in events]
        for version, optional in named:
            if not (_positive(version) or (optional and version is None)):
                raise StorageError(
                    f"'{where}': stage {stage!r} names version {version!r}, not a number >= 1; {fix}"
                )
    return state
