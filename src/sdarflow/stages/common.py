"""Small helpers shared by the stages: requiring fields, resolving adapters and skill libraries to local folders."""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import hashlib
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sdarflow import __version__, storage
from sdarflow.config import StageConfig, content_hash, opt
from sdarflow.errors import ConfigError, ModelError, StorageError

if TYPE_CHECKING:
    from sdarflow.skills.library import SkillLibrary

log = logging.getLogger(__name__)

# The running stage's scratch folder (see ``once``): where copies of its remote inputs go, removed when it returns.
_scratch: contextvars.ContextVar[str | None] = contextvars.ContextVar("sdarflow_stage_scratch", default=None)


def require(stage: str, **fields: object) -> None:
    """Fail with the flag to pass when a required field is empty."""
    for name, value in fields.items():
        if value in (None, "", []):
            flag = f"--{name.replace('_', '-')}"
            raise ConfigError(f"{stage}: {flag} is required; fix: pass {flag} (or set {name} in --config)")


def allow_unpublished_opt() -> bool:
    """The ``allow_unpublished`` field of every stage that reads an adapter or a skill library."""
    return opt(
        False,
        "accept adapter and skill-library folders without _manifest.json (made by hand); a stage's output that "
        "was interrupted has none, so by default such a folder is refused",
        io=True,
    )


def local_artifact(
    uri: str | None,
    kind: str,
    allow_unpublished: bool = False,
    dest: str | None = None,
    full_model: bool = False,
) -> str | None:
    """A published artifact (adapter, skills) as a verified local folder: a copy in ``dest`` if given; else a view
    of a local one, or a copy of a remote one in the running stage's scratch folder (removed when it returns;
    outside a stage, in the system's temporary folder, for the caller to remove).
    With ``full_model``, a full fine-tune in an adapter's place too (a policy's stages:
    :func:`sdarflow.models.policy.policy_folders`). A local folder without a manifest is refused (it may be a
    half-written output) unless ``allow_unpublished``: a folder made by hand."""
    if not uri:
        return None
    if storage.is_published(uri):
        if full_model and kind == "adapter" and storage.read_manifest(uri).get("kind") == "model":
            kind = "model"
        return str(storage.fetch_dir(uri, kind=kind, dest=dest, scratch=_scratch.get()))
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


def load_skills(uri: str, allow_unpublished: bool = False) -> SkillLibrary:
    """The skill library at ``uri``, read whole from a verified copy that is removed once read: a library reads
    files by the names in its mapping, and a copy holds only the files the manifest lists, so a file slipped in
    beside them is never read (libraries are small)."""
    from sdarflow.skills.library import SkillLibrary

    with tempfile.TemporaryDirectory(prefix="sdarflow-skills-") as tmp:
        # a published library is copied into tmp; a hand-made one (--allow-unpublished) is read in place
        return SkillLibrary.load(local_artifact(uri, "skills", allow_unpublished, dest=tmp))


def content_id(uri: str, read: bool = False) -> str | None:
    """What is at ``uri`` now, for telling a rerun from a new request: a published artifact's manifest hash, a local
    model folder's base fingerprint (a model rebuilt at the same path is another input), and for an input the stage
    ``read``s, any other local folder's files hashed in full (an unpublished adapter changed in place is another
    input; a registry or checkpoint folder, which a stage writes, is not hashed); else None."""
    if storage.is_published(uri):
        return hashlib.sha256(storage.read_bytes(storage.join(uri, storage.MANIFEST))).hexdigest()
    folder = Path(uri)
    if "://" in uri or not folder.is_dir():
        return None
    if (folder / "config.json").is_file():
        from sdarflow.models.identity import base_fingerprint

        return base_fingerprint(uri)
    if not read:
        return None
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    lines = "".join(f"{p.relative_to(folder).as_posix()}:{storage.file_sha256(p)}\n" for p in files)
    return hashlib.sha256(lines.encode()).hexdigest()


def request_hash(cfg: StageConfig) -> str:
    """Identity of one stage request: every setting but ``overwrite``, the sdarflow version, and each input's
    ``content_id`` (an input republished, or a model rebuilt, at the same URI makes a new request)."""
    request = {k: v for k, v in cfg.to_dict().items() if k != "overwrite"}
    inputs = {}
    for f in dataclasses.fields(cfg):
        if f.metadata.get("io") and f.name != "output":
            values = getattr(cfg, f.name)
            for uri in values if isinstance(values, list) else [values]:
                if isinstance(uri, str) and uri:
                    inputs[uri] = content_id(uri, read=bool(f.metadata.get("reads")))
    return content_hash({"stage": cfg.stage, "version": __version__, "inputs": inputs, **request}, 16)


def once(kind: str | None) -> Callable[[Callable[[Any], dict]], Callable[[Any], dict]]:
    """Make a stage's ``run`` idempotent: when its output holds what this very request published (a KFP retry, a
    rerun), the recorded result is returned; another request's output there is refused unless ``overwrite``.
    The run gets a scratch folder for copies of its remote inputs, removed when it returns or fails. After a run,
    the manifest records the request and its result (rank 0 only)."""

    def wrap(run: Callable[[Any], dict]) -> Callable[[Any], dict]:
        @functools.wraps(run)
        def wrapper(cfg: Any) -> dict:
            key = request_hash(cfg)
            if cfg.output:  # before the work, not only at its publish
                storage.refuse_inside_registry(cfg.output, cfg.stage)
            if cfg.output and storage.is_published(cfg.output):
                try:
                    manifest = storage.read_manifest(cfg.output)
                except StorageError:
                    if not cfg.overwrite:
                        raise
                    manifest = {}  # a broken artifact there is replaced
                if kind and manifest.get("kind", kind) != kind:  # never another kind's: a registered adapter
                    storage.read_manifest(cfg.output, kind)  # raises: the one message for the wrong kind
                if manifest.get("request_hash") == key and "result" in manifest:
                    log.info(
                        "%s: %s already holds this request's output; nothing to do", cfg.stage, cfg.output
                    )
                    return manifest["result"]
                if not cfg.overwrite:
                    raise StorageError(
                        f"'{cfg.output}' is already published by another {cfg.stage} request; fix: choose a new "
                        f"output URI or pass --overwrite"
                    )
            with tempfile.TemporaryDirectory(prefix=f"sdarflow-{cfg.stage}-inputs-") as scratch:
                token = _scratch.set(scratch)
                try:
                    result = run(cfg)
                finally:
                    _scratch.reset(token)
            if int(os.environ.get("RANK", "0")) == 0 and storage.is_published(cfg.output):
                manifest = storage.read_manifest(cfg.output, kind)
                storage.write_json(
                    storage.join(cfg.output, storage.MANIFEST),
                    {**manifest, "request_hash": key, "result": result},
                )
            return result

        return wrapper

    return wrap
