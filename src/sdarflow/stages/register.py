"""Stage ``register``: the trained adapter as a new immutable registry version with its eval report and lineage
(run id, base model, config hashes, data URIs, skill library version); optionally aliased as ``staging``."""

from __future__ import annotations

import json
import logging
import tempfile
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sdarflow import storage
from sdarflow.config import StageConfig, opt
from sdarflow.defaults import DEFAULT_POLICY_NAME
from sdarflow.registry.intake import CURSOR_FIX, Cursor
from sdarflow.stages.common import require

if TYPE_CHECKING:
    from sdarflow.registry import Registry

log = logging.getLogger(__name__)


@dataclass
class RegisterConfig(StageConfig):
    stage = "register"
    registry: str = opt("", "registry root URI (local folder or s3://)", io=True)
    name: str = opt(DEFAULT_POLICY_NAME, "policy name in the registry ([a-z0-9._-])")
    adapter: str = opt("", "adapter to register (published URI)", reads=True)
    eval_report: str = opt("", "evaluate output URI for this adapter", reads=True)
    base_eval_report: str = opt(
        "",
        "evaluate output of the base model on the same tasks: the gate compares a first version with it",
        reads=True,
    )
    model: str = opt("", "base model the adapter belongs to", reads=True)
    base_model_uri: str = opt(
        "",
        "the base model as the run names it, for lineage (an s3:// URI; --model is its local copy)",
        io=True,
    )
    data: list[str] = opt([], "data URIs that produced the adapter (trajectories, skills, rescored)", io=True)
    run_id: str = opt("local", "pipeline run id", io=True)
    round: int = opt(0, "RL round", io=True, ge=0)
    promote_to: str = opt(
        "", "alias the new version ('staging'; production goes through the gate)", choices=("", "staging")
    )
    cursor: dict[str, Any] = opt(
        {},
        'where the run\'s tasks stopped after this round, {"env": ..., "next_task": N, "seed": S, '
        '"next_eval_task": E}: a pipeline run with data_cursor continue starts after it',
        io=True,
    )
    request: str = opt(
        "",
        "what the run trains, as one hash (pipeline_config.request_key): a later run of the same is skipped",
        io=True,
    )

    def validate(self) -> None:
        if self.cursor:
            Cursor.check(self.cursor, "register: cursor", CURSOR_FIX)


Config = RegisterConfig  # the stage's exports are Config and run (sdarflow.stages)


# How far back a retry looks for its own version: other registrations of the same name in the minutes between a
# pod's death and its retry are few, and reading every version's lineage would make each register slower as the
# registry grows.
RETRY_LOOKBACK = 32


def _registered_before(registry: Registry, name: str, lineage: dict, adapter_manifest: dict) -> int | None:
    """The version an earlier attempt of this very registration published (its pod died after publishing, and KFP
    retried the task): the same lineage (run, round, adapter URI, eval report, data) and the same adapter content
    (by the manifests' sha256 digests: an adapter retrained in place is a new registration). None if none."""
    from sdarflow.models.identity import adapter_id

    recorded = json.loads(json.dumps(lineage, default=str))  # as the registry stores it
    content = adapter_id({f["path"]: f["sha256"] for f in adapter_manifest["files"]})
    for version in reversed(registry.versions(name)[-RETRY_LOOKBACK:]):
        if registry.lineage(name, version) == recorded:
            files = {f["path"]: f["sha256"] for f in registry.show(name, version)["files"]}
            if adapter_id(files) == content:
                return version
    return None


def run(cfg: RegisterConfig) -> dict:
    from sdarflow.registry import GateRefused, Registry
    from sdarflow.registry.intake import load_report

    require("register", registry=cfg.registry, adapter=cfg.adapter, eval_report=cfg.eval_report)
    adapter_manifest = storage.read_manifest(cfg.adapter, "adapter")
    report = load_report(cfg.eval_report)
    manifests = [storage.read_manifest(u) for u in cfg.data if storage.is_published(u)]
    skills = [m for m in manifests if m.get("kind") == "skills"]
    lineage = {
        "run_id": cfg.run_id,
        "round": cfg.round,
        "base_model": cfg.base_model_uri or cfg.model,
        "adapter_uri": cfg.adapter,
        "train_config_hash": adapter_manifest.get("config_hash"),
        "method": adapter_manifest.get("method"),
        "teacher_contexts": adapter_manifest.get("teacher_contexts") or [],
        "eval_report_uri": cfg.eval_report,
        "base_eval_report_uri": cfg.base_eval_report or None,
        "data": list(cfg.data),
        "skill_library_version": skills[0].get("version") if skills else None,
        "cursor": cfg.cursor or None,
        "request": cfg.request or None,
    }
    registry = Registry(cfg.registry)
    version = _registered_before(registry, cfg.name, lineage, adapter_manifest)
    if version is not None:
        log.info(
            "register: %s v%d already holds this registration (a retry); nothing to do", cfg.name, version
        )
    else:
        with tempfile.TemporaryDirectory() as tmp:
            adapter_dir = storage.fetch_dir(cfg.adapter, kind="adapter", dest=tmp)  # a verified copy
            version = registry.register(
                cfg.name,
                adapter_dir,
                report,
                lineage,
                base_model=cfg.model or None,
                base_eval_report=cfg.base_eval_report or None,
            )
    staged = None
    if cfg.promote_to:
        try:
            registry.promote(cfg.name, version, stage=cfg.promote_to)
            staged = "staged"
        except GateRefused as err:
            # The registry's staging policy refused it: the version stays registered and the run goes on (a retry
            # would be refused again), as a refused production promotion does.
            log.warning("register: %s v%d not aliased %s: %s", cfg.name, version, cfg.promote_to, err)
            staged = f"refused: {err}"
    log.info("register: %s version %s in %s", cfg.name, version, cfg.registry)
    uri = storage.join(cfg.registry, cfg.name, "versions", str(version))
    result = {"uri": uri, "registry": cfg.registry, "name": cfg.name, "version": version}
    return result | ({cfg.promote_to: staged} if staged else {})
