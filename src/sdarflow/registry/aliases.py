"""A name's stage aliases (``aliases.json``): which version each stage points at, with its history, read and
written with compare-and-swap (:mod:`sdarflow.registry.cas`) so concurrent promotions never lose an update."""

from __future__ import annotations

import datetime as dt
import json
import logging
from dataclasses import dataclass
from typing import Any

from sdarflow.config import FileSchema, opt
from sdarflow.errors import ConfigError, StorageError
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
    try:  # the shape the registry writes: a version is used to build a path, so it must be a number >= 1
        _AliasState.from_dict(state)
    except ConfigError as err:
        raise StorageError(
            f"'{layout.aliases}' is not an alias state: {str(err).split('; fix:')[0]}; fix: restore it from a "
            f"backup (the registry's audit log records every change)"
        ) from None
    for entry in state.setdefault("stages", {}).values():
        entry.setdefault("history", [])
    return state, etag


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


@dataclass
class _Event(FileSchema):
    version: int | None = opt(None, "the version a promotion pointed the stage at", ge=1)
    action: str = opt("", "promote or rollback")

    def validate(self) -> None:
        # a promotion event carries its version; a rollback's may be empty
        if self.version is None and self.action != "rollback":
            raise ConfigError("a promotion in the history names no version")


@dataclass
class _Stage(FileSchema):
    version: int | None = opt(None, "the version the stage points at now", ge=1)
    history: list[_Event] = opt([], "every promotion and rollback of the stage")


@dataclass
class _AliasState(FileSchema):
    stages: dict[str, _Stage] = opt({}, "each stage's alias")
