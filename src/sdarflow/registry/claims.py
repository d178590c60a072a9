"""Version numbers: a writer claims the next number by exclusively creating ``claims/<v>.json``
(:func:`sdarflow.registry.cas.create_exclusive`), retrying with v+1 when another writer got there first. Numbers are
never reused, even when a publish fails half way."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from pathlib import Path

from sdarflow import storage
from sdarflow.errors import ConfigError
from sdarflow.registry import cas
from sdarflow.registry.errors import RegistryConflict, RegistryError
from sdarflow.registry.layout import MAX_VERSION, Layout, parse_version

# Bounds the claim loop: more than this many writers racing for one name means something is wrong.
_MAX_CLAIM_ATTEMPTS = 1000


def claim(layout: Layout, version: int | None, actor: str) -> int:
    """Reserve a version number (``version``, or the next free one) by exclusively creating its claim marker."""
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
    number = highest(layout) + 1
    for _ in range(_MAX_CLAIM_ATTEMPTS):
        if cas.create_exclusive(layout.claim(number), data):
            return number
        number += 1  # someone else claimed it between our listing and our create: try the next
    raise RegistryConflict(
        f"could not claim a version of '{layout.name}' after {_MAX_CLAIM_ATTEMPTS} attempts; fix: retry"
    )


def highest(layout: Layout) -> int:
    """The highest version number claimed or published (0 when none)."""
    claimed = [parse_version(Path(n).stem) for n in storage.children(layout.claims)]
    published = [parse_version(n) for n in storage.children(layout.versions)]
    return max([v for v in claimed + published if v is not None], default=0)
