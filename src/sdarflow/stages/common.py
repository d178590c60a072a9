"""Small helpers shared by the stages: requiring fields, resolving adapters and skill libraries to local folders."""

from __future__ import annotations

import logging
from pathlib import Path

from sdarflow import storage
from sdarflow.config import opt
from sdarflow.errors import ConfigError, ModelError

log = logging.getLogger(__name__)


def require(stage: str, **fields: object) -> None:
    """Fail with the flag to pass when a required field is empty."""
    for name, value in fields.items():
        if value in (None, "", []):
            raise ConfigError(f"{stage}: --{name.replace('_', '-')} is required")


def allow_unpublished_opt() -> bool:
    """The ``allow_unpublished`` field of every stage that reads an adapter or a skill library."""
    return opt(
        False,
        "accept adapter and skill-library folders without _manifest.json (made by hand); a stage's output that "
        "was interrupted has none, so by default such a folder is refused",
        io=True,
    )


def local_artifact(
    uri: str | None, kind: str, allow_unpublished: bool = False, dest: str | None = None
) -> str | None:
    """A published artifact (adapter, skills) as a verified local folder (a copy in ``dest`` if given, else a view
    of a local one). A local folder without a manifest is refused (it may be a half-written output) unless
    ``allow_unpublished``: a folder made by hand."""
    if not uri:
        return None
    if storage.is_published(uri):
        return str(storage.fetch_dir(uri, kind=kind, dest=dest))
    path = Path(uri)
    if "://" not in uri and path.is_dir():
        if allow_unpublished:
            log.info("%s %s has no %s; used as it is (--allow-unpublished)", kind, uri, storage.MANIFEST)
            return str(path)
        raise ModelError(
            f"{kind} '{uri}' is a folder without {storage.MANIFEST}: an interrupted output or one made by hand; "
            f"fix: pass a published {kind} (a stage's output), or --allow-unpublished for a folder you made"
        )
    raise ModelError(
        f"{kind} '{uri}' not found (no folder and no published {kind} there); fix: check the URI"
    )


def policy_version(adapter_uri: str | None) -> str:
    return adapter_uri or "base"
