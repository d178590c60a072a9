"""Small helpers shared by the stages: requiring fields, resolving adapters and skill libraries to local folders."""

from __future__ import annotations

import logging
from pathlib import Path

from sdarflow import storage
from sdarflow.errors import ConfigError, ModelError

log = logging.getLogger(__name__)


def require(stage: str, **fields: object) -> None:
    """Fail with the flag to pass when a required field is empty."""
    for name, value in fields.items():
        if value in (None, "", []):
            raise ConfigError(f"{stage}: --{name.replace('_', '-')} is required")


def local_artifact(uri: str | None, kind: str) -> str | None:
    """A published artifact (adapter, skills) as a verified local folder; plain local folders pass through."""
    if not uri:
        return None
    if storage.is_published(uri):
        return str(storage.fetch_dir(uri, kind=kind))
    path = Path(uri)
    if "://" not in uri and path.is_dir():
        return str(path)
    raise ModelError(
        f"{kind} '{uri}' not found (no folder and no published {kind} there); fix: check the URI"
    )


def policy_version(adapter_uri: str | None) -> str:
    return adapter_uri or "base"
