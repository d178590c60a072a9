"""The pipeline's one config: the settings a user sets in the KFP UI, validated once by the first task and stored
as YAML next to the run's data; each stage task then reads its own stage config from it.

Components pass only ``config_uri``, the round and upstream URIs, never twenty parameters. Output URIs follow the
data layout ``<storage>/runs/<run_id>/round=<r>/<stage>``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

import yaml

from sdarflow import storage
from sdarflow.config import StageConfig, opt
from sdarflow.errors import ConfigError
from sdarflow.stages import STAGES

log = logging.getLogger(__name__)


@dataclass
class PipelineConfig(StageConfig):
    """Settings exposed as pipeline parameters. Defaults are the paper's where it has one."""

    stage = "pipeline"
    storage: str = opt("", "storage root URI: local folder or s3://bucket/prefix", io=True)
    base_model: str = opt(
        "", "base model HF folder (on a cluster: a path on the image or a mounted volume)", io=True
    )
    run_id: str = opt("", "run id; empty = generated (UTC time + random suffix)", io=True)
    registry: str = opt("", "adapter registry URI; empty = <storage>/registry", io=True)
    seed_skills: str = opt("", "skill library to start from (e.g. the base model's seed_skills)", io=True)
    policy_name: str = opt("sdar-policy", "policy name in the registry")
    env: str = opt("textworld-cooking", "environment suite")
    tasks: int = opt(8, "train tasks per round")
    group_size: int = opt(4, "GRPO group size G")
    max_turns: int = opt(0, "turn limit per episode; 0 = the env's default")
    method: str = opt("sdar", "training objective")
    lam: float = opt(0.01, "distillation weight lambda (paper 0.01)")
    beta: float = opt(5.0, "gate sharpness beta (paper 5)")
    retrieval: str = opt("keyword", "skill retrieval strategy")
    eval_tasks: int = opt(4, "evaluation tasks per split")
    eval_samples: int = opt(4, "evaluation samples per task (n of pass@k)")
    promote_to: str = opt("", "alias each registered version ('staging' or empty)")
    seed: int = opt(0, "base seed")
    stage_settings: dict[str, dict[str, Any]] = field(
        default_factory=dict, metadata={"help": "per-stage overrides: {stage: {key: value}}", "io": False}
    )

    def validate(self) -> None:
        unknown = sorted(set(self.stage_settings) - set(STAGES))
        if unknown:
            raise ConfigError(f"stage_settings: unknown stage(s) {unknown}; valid: {', '.join(STAGES)}")


# Which pipeline settings feed which stage fields.
_SHARED: dict[str, dict[str, str]] = {
    "generate": {
        "env": "env",
        "tasks": "tasks",
        "group_size": "group_size",
        "max_turns": "max_turns",
        "seed": "seed",
    },
    "extract-skills": {},
    "rescore": {"retrieval": "retrieval"},
    "train": {"method": "method", "lam": "lam", "beta": "beta", "seed": "seed"},
    "evaluate": {"env": "env", "eval_tasks": "tasks", "eval_samples": "samples", "max_turns": "max_turns"},
    "register": {"policy_name": "name", "promote_to": "promote_to"},
}


def stage_config(pc: PipelineConfig, stage: str, round_: int, **io: Any) -> StageConfig:
    """The stage's config: shared pipeline settings, then per-stage overrides, then this task's I/O URIs."""
    cls = config_class(stage)
    names = {f.name for f in dataclasses.fields(cls)}
    values = {dst: getattr(pc, src) for src, dst in _SHARED[stage].items()}
    values.update(pc.stage_settings.get(stage, {}))
    values.update({k: v for k, v in io.items() if k in names})
    if "output" in names and stage != "register":
        values["output"] = storage.join(pc.storage, "runs", pc.run_id, f"round={round_}", stage)
    # Every run has its own folder, so a retried task may replace its own partial or finished output.
    for key, value in (
        ("model", pc.base_model),
        ("run_id", pc.run_id),
        ("round", round_),
        ("registry", pc.registry),
        ("overwrite", True),
    ):
        if key in names:
            values[key] = value
    return cls.from_dict(values)


def config_class(stage: str) -> type[StageConfig]:
    module = importlib.import_module(STAGES[stage])
    return next(
        v
        for v in vars(module).values()
        if isinstance(v, type) and issubclass(v, StageConfig) and v is not StageConfig
    )


def prepare(pc: PipelineConfig) -> str:
    """Validate every stage's config up front, fill in defaults, and store the pipeline config; return its URI."""
    if not pc.storage or not pc.base_model:
        raise ConfigError("pipeline: storage and base_model are required")
    if not pc.run_id:
        pc.run_id = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]
    if not pc.registry:
        pc.registry = storage.join(pc.storage, "registry")
    for stage in STAGES:
        stage_config(pc, stage, 0)  # raises ConfigError naming the stage and the key
    uri = storage.join(pc.storage, "runs", pc.run_id, "pipeline.yaml")
    storage.write_bytes(uri, yaml.safe_dump(pc.to_dict(), sort_keys=True).encode())
    log.info("pipeline config %s (hash %s) -> %s", pc.run_id, pc.config_hash(), uri)
    return uri


def load(config_uri: str) -> PipelineConfig:
    return PipelineConfig.from_dict(yaml.safe_load(storage.read_bytes(config_uri)))


def run_stage(stage: str, config_uri: str, round_: int, **io: Any) -> dict:
    """Load the pipeline config, build the stage config, run the stage."""
    module = importlib.import_module(STAGES[stage])
    cfg = stage_config(load(config_uri), stage, round_, **io)
    return module.run(cfg)


def run_component(
    stage: str, config_uri: str, round_: int, *, metrics=None, html=None, markdown=None, **io: Any
) -> str:
    """What every KFP component calls: run the stage, log its metrics to the KFP Metrics artifact, copy its
    HTML/Markdown report into the UI artifacts, and return the output URI for downstream tasks."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    result = run_stage(stage, config_uri, round_, **io)
    if metrics is not None:
        for key, value in sorted(result.get("metrics", {}).items()):
            metrics.log_metric(key.replace("/", "_"), float(value))
    for artifact, name in ((html, "report.html"), (markdown, "report.md")):
        if artifact is not None:
            artifact_text = storage.read_bytes(storage.join(result["uri"], name))
            with open(artifact.path, "wb") as f:
                f.write(artifact_text)
    return str(result["uri"])
