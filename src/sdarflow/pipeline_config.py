"""The pipeline's one config: the settings a user sets in the KFP UI, validated once by the first task and stored
as YAML next to the run's data; each stage task then reads its own stage config from it.

Components pass only ``config_uri``, the round and upstream URIs, never twenty parameters. Output URIs follow the
data layout ``<storage>/runs/<run_id>/round=<r>/<stage>`` (``.../generate/shard=<i>`` when generate is sharded).
What the thin KFP components call is in :mod:`sdarflow.kfp_runtime`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import inspect
import logging
import re
import tempfile
import typing
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sdarflow import storage
from sdarflow.config import MAX_SEED, StageConfig, content_hash, like, opt
from sdarflow.defaults import RELEASE_STAGES
from sdarflow.errors import ConfigError
from sdarflow.extensions.options import OPTIONS, option_settings
from sdarflow.model_cache import local_model
from sdarflow.registry import Registry
from sdarflow.registry.gate import GATE_HELP, GatePolicy
from sdarflow.registry.layout import MODEL_CARD, RESERVED_FILES, parse_version
from sdarflow.rollout.engine import ENGINE_HELP
from sdarflow.skills.library import SkillLibrary, reference_library
from sdarflow.stages import STAGES, config_class
from sdarflow.teacher import UNKNOWN_CONTEXT
from sdarflow.tracking import tracking_opt
from sdarflow.train.format_guard import GUARD_HELP

log = logging.getLogger(__name__)

PROMOTE_TO = ("", "staging", "production")
DATA_CURSORS = ("continue", "fixed")
ROUND_TASKS = ("next", "same")
# kl_coef: the train stage's env preset (a KFP parameter cannot be None, which is the stage's "unset")
KL_FROM_ENV = -1.0
# Registry references a run may start from; anything else in ``start_adapter`` is an adapter URI or folder.
REGISTRY_REFS = (*RELEASE_STAGES, "latest")
REFERENCE_SKILLS = "reference"  # seed_skills: the env's SDAR reference library, published into the run
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_GENERATE, _TRAIN, _EVALUATE = (config_class(s) for s in ("generate", "train", "evaluate"))


@dataclass
class PipelineConfig(StageConfig):
    """Settings exposed as pipeline parameters. Defaults are the paper's where it has one."""

    stage = "pipeline"
    storage: str = opt("", "storage root URI: local folder or s3://bucket/prefix", io=True)
    base_model: str = opt(
        "", "base model HF folder, or s3://... (copied to each GPU pod's local disk once per pod)", io=True
    )
    run_id: str = opt("", "run id; empty = generated (UTC time + random suffix)", io=True)
    registry: str = opt("", "adapter registry URI; empty = <storage>/registry", io=True)
    seed_skills: str = opt(
        "",
        f"skill library round 0 merges into: a library URI or folder (e.g. the base model's seed_skills), "
        f"'{REFERENCE_SKILLS}' = the SDAR reference's hand-written library of the env (search-qa), or empty",
        io=True,
    )
    start_adapter: str = opt(
        "",
        "adapter round 0 continues from: empty = a new LoRA; production, staging, latest or a version "
        "number of policy_name in the registry (resolved when the run starts; an alias that is not set yet "
        "starts a new LoRA); or an adapter URI",
        io=True,
    )
    policy_name: str = like(_EVALUATE, "policy_name", "policy name in the registry")
    env: str = like(_GENERATE, "env", "environment suite (`sdarflow envs list`)")
    tasks: int = like(_GENERATE, "tasks", "train tasks per round")
    group_size: int = like(_GENERATE, "group_size")
    max_turns: int = like(_GENERATE, "max_turns")
    method: str = like(_TRAIN, "method")
    sdar_coef: float = like(_TRAIN, "sdar_coef")
    gate_beta: float = like(_TRAIN, "gate_beta")
    lr: float = like(
        _TRAIN,
        "lr",
        "learning rate (AdamW): the SDAR reference's 7B LoRA trains at 3e-6, the tiny demo model at 2e-3",
    )
    lora_rank: int = like(_TRAIN, "lora_rank", "LoRA rank (8-64 for RL); 0 = full fine-tune")
    train_steps: int = like(
        _TRAIN, "mini_batches", "optimizer steps per round: the round's rows in this many mini-batches"
    )
    kl_coef: float = opt(
        KL_FROM_ENV,
        "KL loss to the base policy; -1 = the env's reference setting (0.01 alfworld/webshop, 0.001 search)",
        ge=KL_FROM_ENV,
    )
    entropy_coef: float = like(_TRAIN, "entropy_coef")
    options: str = opt(
        "",
        f"training options (docs/training.md), '+'-separated: {', '.join(OPTIONS)} (ppl: search-qa); e.g. "
        "scpo+ema; stage_settings win over them",
    )
    format_guard: str = like(_TRAIN, "format_guard", f"train's {GUARD_HELP}")
    rollout_engine: str = like(_GENERATE, "engine", f"{ENGINE_HELP} (generate and evaluate)")
    train_engine: str = like(_TRAIN, "engine")
    retrieval: str = like(config_class("rescore"), "retrieval", "skill retrieval strategy of the teacher")
    eval_tasks: int = like(_EVALUATE, "tasks", "evaluation tasks per split")
    eval_samples: int = like(_EVALUATE, "samples", "evaluation samples per task (n of pass@k)")
    promote_to: str = opt(
        "",
        "'' = register only; 'staging' = alias every registered version (through the registry's staging policy "
        "if it has one); 'production' = promote the last round's version through the gate (a refusal of either "
        "is reported, the run still succeeds)",
        choices=PROMOTE_TO,
    )
    serve_deployment: str = opt(
        "",
        "after a promotion to production, roll this serving Deployment ([NAMESPACE/]NAME, e.g. "
        "sdarflow/sdarflow-serve; it serves the alias) so its new pods fetch the version; the run's service "
        "account needs k8s/serving's role; '' = serving is not rolled",
    )
    gate: dict[str, float] = opt(
        {},
        'the gate thresholds this run tightens the registry\'s policy to, e.g. {"min_gain": 0.02} (min_gain, '
        "passk_tolerance, ood_tolerance, floor, min_tasks); empty: the registry's policy (`sdarflow registry "
        "gate`); a looser value refuses the promotion",
        keys=tuple(GATE_HELP),
    )
    checkpoint_every: int = opt(
        2,
        "train checkpoints every this many optimizer steps to the run's storage (round=<r>/train-checkpoints, "
        "removed once the round's adapter is published), so a retried train task resumes there; 0 = none",
        ge=0,
    )
    seed: int = like(_GENERATE, "seed", "base seed of every stage")
    data_cursor: str = opt(
        "continue",
        "where the train tasks, the evaluation tasks and the seed start: continue = after the tasks of the "
        "newest version of policy_name registered on this env, with the next seed (a scheduled run trains on "
        "new tasks with new samples, and its gate judges on tasks no earlier run was judged on); fixed = "
        "first_task and seed as set (to reproduce a run)",
        choices=DATA_CURSORS,
    )
    round_tasks: str = opt(
        "next",
        "which train tasks each round plays: next = the split's next tasks (the policy must learn what carries over "
        "to new tasks); same = round 0's tasks again every round, with new samples (the overfit check: can the "
        "method learn tasks it sees again?)",
        choices=ROUND_TASKS,
    )
    tracking_uri: str = tracking_opt()
    shards: int = opt(
        1, "generate tasks per round (set at compile time: `pipeline compile --shards`)", io=True, ge=1
    )
    stage_settings: dict[str, dict[str, Any]] = opt(
        {},
        "per-stage settings beyond these parameters, {stage: {field: value}}, e.g. "
        '{"train": {"lora_alpha": 64}}: a stage\'s fields are its `sdarflow <stage> --help` flags, and they '
        "win over the parameters above",
        keys=tuple(STAGES),
    )

    def validate(self) -> None:
        from sdarflow.registry.layout import validate_name

        # a bad option name fails now
        option_settings(self.options.split("+") if self.options else [], "pipeline: options")
        # the run id is a folder name under <storage>/runs: one safe path component
        if self.run_id and (not _RUN_ID.fullmatch(self.run_id) or ".." in self.run_id):
            raise ConfigError(
                f"pipeline: run_id {self.run_id!r} is not a folder name (letters, digits, '.', '_', '-'; no "
                f"'..' or slashes); fix: e.g. run_id 20261201-nightly, or leave it empty for a generated one"
            )
        validate_name(self.policy_name)
        if self.serve_deployment:
            from sdarflow.registry.roll import parse_target

            parse_target(self.serve_deployment)
            if self.promote_to != "production":
                raise ConfigError(
                    f"pipeline: serve_deployment {self.serve_deployment!r} rolls serving after a promotion to "
                    f"production, and promote_to is {self.promote_to or 'empty'}; fix: promote_to production, or "
                    f"leave serve_deployment empty"
                )
        if self.tasks < self.shards:
            raise ConfigError(
                f"pipeline: tasks ({self.tasks}) must be >= shards ({self.shards}): every generate shard "
                f"needs a task; fix: raise tasks or compile with fewer --shards"
            )
        GatePolicy.from_dict(self.gate)  # each threshold of its type, within its bounds


def kfp_parameters(
    required: tuple[str, ...] = (), leave_out: tuple[str, ...] = ()
) -> list[inspect.Parameter]:
    """PipelineConfig's fields as KFP parameters (the prepare component's and the training pipeline's signature):
    each with its default (none for ``required``) and its type as KFP reads it (``dict`` for a mapping)."""
    hints = typing.get_type_hints(PipelineConfig)
    defaults = PipelineConfig().to_dict()
    return [
        inspect.Parameter(
            f.name,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            default=inspect.Parameter.empty if f.name in required else defaults[f.name],
            annotation=typing.get_origin(hints[f.name]) or hints[f.name],
        )
        for f in dataclasses.fields(PipelineConfig)
        if f.name not in leave_out
    ]


def _same(*names: str) -> dict[str, str]:
    return {name: name for name in names}


# Which pipeline settings feed which stage fields.
_SHARED: dict[str, dict[str, str]] = {
    "generate": {**_same("env", "tasks", "group_size", "max_turns", "seed"), "rollout_engine": "engine"},
    "extract-skills": {},
    "rescore": _same("retrieval"),
    "train": {
        **_same("method", "sdar_coef", "gate_beta", "seed", "lr", "lora_rank", "kl_coef", "entropy_coef"),
        **_same("format_guard", "tracking_uri"),
        "train_steps": "mini_batches",
        "train_engine": "engine",
    },
    "evaluate": {
        **_same("env", "max_turns", "policy_name", "tracking_uri"),
        "eval_tasks": "tasks",
        "eval_samples": "samples",
        "rollout_engine": "engine",
    },
    "register": {**_same("promote_to"), "policy_name": "name"},
}


def run_uri(storage_root: str, run_id: str, *parts: str) -> str:
    """A run's folder, or something in it: ``<storage>/runs/<run_id>/<parts>`` (the one definition of the layout)."""
    return storage.join(storage_root, "runs", run_id, *parts)


def shared_cache(pc: PipelineConfig) -> str:
    """``<storage>/cache``: what a run's tasks share with other runs (base evaluations, games), keyed by maker."""
    return storage.join(pc.storage, "cache")


def stage_uri(storage_root: str, run_id: str, round_: int, stage: str, shard: int | None = None) -> str:
    """A stage's output in a round: ``.../round=<r>/<stage>``, and ``.../shard=<i>`` for one generate shard."""
    shard_part = [] if shard is None else [f"shard={shard}"]
    return run_uri(storage_root, run_id, f"round={round_}", stage, *shard_part)


def generate_uris(storage_root: str, run_id: str, round_: int, shards: int) -> list[str]:
    """A round's trajectory datasets: one, or one per generate shard (``generate/shard=<i>``)."""
    return [
        stage_uri(storage_root, run_id, round_, "generate", i if shards > 1 else None) for i in range(shards)
    ]


def stage_config(pc: PipelineConfig, stage: str, round_: int, **io: Any) -> StageConfig:
    """The stage's config: shared pipeline settings, then per-stage overrides, then this task's I/O URIs."""
    cls = config_class(stage)
    names = {f.name for f in dataclasses.fields(cls)}
    values = {dst: getattr(pc, src) for src, dst in _SHARED[stage].items()}
    if stage == "train" and pc.checkpoint_every:
        values["save_every"] = pc.checkpoint_every
        values["checkpoint_uri"] = stage_uri(pc.storage, pc.run_id, round_, "train-checkpoints")
    if values.get("kl_coef") == KL_FROM_ENV:
        del values["kl_coef"]  # the stage's own default: the env preset's
    if values.get("promote_to") == "production":
        values["promote_to"] = ""  # production goes through the gated promote task, never through register
    values.update(option_settings(pc.options.split("+") if pc.options else [], "options").get(stage, {}))
    values.update(pc.stage_settings.get(stage, {}))
    # A component passes its single-dataset input and its sharded inputs together; one of the two is empty.
    values.update({k: [u for u in v if u] if isinstance(v, list) else v for k, v in io.items() if k in names})
    if stage == "train" and values.get("replay_rounds") and "replay" not in io:
        # the rollouts of the rounds before this one, oldest first, at the paths their generate tasks publish
        earlier = range(max(0, round_ - int(values["replay_rounds"])), round_)
        values["replay"] = [u for r in earlier for u in generate_uris(pc.storage, pc.run_id, r, pc.shards)]
    if "adapter" in names and not values.get("adapter") and pc.start_adapter:
        values["adapter"] = pc.start_adapter  # round 0 continues from the run's start adapter
    if stage == "extract-skills" and not values.get("previous"):
        values["previous"] = pc.seed_skills  # round 0 merges into the run's seed library
    if stage == "generate":
        # Only generate fans out in the pipeline; other stages' own shard fields keep their (single) defaults.
        values["num_shards"] = pc.shards
        # Each round plays the next tasks of the split, as an RL trainer steps through its prompt dataset: the
        # policy must learn what carries over between tasks, not the answers to the same few.
        step = 0 if pc.round_tasks == "same" else round_
        try:
            values["first_task"] = int(values.get("first_task", 0)) + step * int(values["tasks"])
        except (TypeError, ValueError) as err:
            raise ConfigError(
                f"generate: first_task ({values.get('first_task')!r}) and tasks ({values['tasks']!r}) must be whole "
                f"numbers; fix: e.g. first_task 0, tasks 8"
            ) from err
    if stage == "register":
        values["request"] = request_key(pc)
        played, evaluated = stage_config(pc, "generate", round_), stage_config(pc, "evaluate", round_)
        values["cursor"] = {
            "env": played.env,
            "next_task": played.first_task + played.tasks,
            "seed": played.seed,
            "next_eval_task": evaluated.first_task + evaluated.tasks,
        }
    if "output" in names and stage != "register":
        shard = values.get("shard", 0) if stage == "generate" and pc.shards > 1 else None
        values["output"] = stage_uri(pc.storage, pc.run_id, round_, stage, shard)
    # Every run has its own folder, so a retried task may replace its own partial or finished output.
    for key, value in (
        ("model", pc.base_model),
        ("base_model_uri", pc.base_model),  # stays the URI when `model` becomes a pod's local copy
        ("run_id", pc.run_id),
        ("round", round_),
        ("registry", pc.registry),
        ("overwrite", True),
    ):
        if key in names:
            values[key] = value
    return cls.from_dict(values)


def base_eval_config(pc: PipelineConfig) -> StageConfig:
    """The base model's evaluate config on the rounds' tasks, samples and seeds (the gate's reference for a first
    version, every round report's baseline). Its output, ``<storage>/cache/base-evaluations/<key>``, is keyed by the
    base weights' fingerprint (not the URI) and every evaluation setting, so later runs from the same base reuse it."""
    from sdarflow.models.identity import base_fingerprint

    cfg = _reference_eval_config(pc)
    # an s3:// base is fingerprinted where it is (ranged reads); a known model's name is imported first
    base = pc.base_model if pc.base_model.startswith("s3://") else local_model(pc.base_model)
    settings = {
        k: v for k, v in cfg.to_dict().items() if k not in ("model", "output", "overwrite", "tracking_uri")
    }
    key = content_hash({"base": base_fingerprint(base), "settings": settings}, 16)
    cfg.output = storage.join(shared_cache(pc), "base-evaluations", key)
    return cfg


def _reference_eval_config(pc: PipelineConfig) -> StageConfig:
    """The rounds' evaluate config for a model compared with nothing (the base model; production)."""
    cfg = stage_config(pc, "evaluate", 0)
    cfg.adapter = cfg.baseline = cfg.registry = ""
    return cfg


def production_eval_config(pc: PipelineConfig) -> StageConfig | None:
    """The production version's evaluate config on this run's evaluation tasks, so the gate compares candidate and
    production task by task (production's registered report is on an earlier run's tasks); its adapter is copied
    into the run. None when the run does not promote to production or there is no production version yet."""
    if pc.promote_to != "production":
        return None
    registry = Registry(pc.registry)
    if "production" not in registry.aliases(pc.policy_name):
        return None
    cfg = _reference_eval_config(pc)
    cfg.adapter = copy_version(pc, registry, "production", "production-adapter")
    cfg.output = run_uri(pc.storage, pc.run_id, "production-evaluation")
    return cfg


def new_run_id() -> str:
    """A run id that sorts by start time and is unique across concurrent starts: UTC time + random suffix."""
    return dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]


def prepare(pc: PipelineConfig) -> str:
    """Validate every stage's config up front, fill in defaults, and store the pipeline config; return its URI."""
    if not pc.storage or not pc.base_model:
        raise ConfigError(
            "pipeline: storage and base_model are required; fix: set both, e.g. storage s3://bucket/sdarflow and "
            "base_model s3://bucket/models/qwen"
        )
    if not pc.run_id:
        pc.run_id = new_run_id()
    if not pc.registry:
        pc.registry = storage.join(pc.storage, "registry")
    if pc.data_cursor == "continue":
        continue_cursor(pc)
    for stage in STAGES:
        stage_config(pc, stage, 0)  # raises ConfigError naming the stage and the key
    if stage_config(pc, "train", 0).lora_rank == 0:  # pc.lora_rank, or stage_settings' for train
        raise ConfigError(
            "pipeline: lora_rank 0 trains the whole model, and the run ends by registering an adapter for the "
            "base model (the registry promotes and serves LoRA adapters); fix: lora_rank 8-64, or run full "
            "fine-tune rounds outside the registry with `sdarflow study` or `python -m bench.learning_check`"
        )
    if pc.serve_deployment:  # a Deployment the promotion could not roll fails now, not after the training
        from sdarflow.registry.roll import ServingRoll

        ServingRoll(pc.serve_deployment, Registry(pc.registry), pc.policy_name, "production")
    pc.start_adapter = resolve_start_adapter(pc)
    pc.seed_skills = resolve_seed_skills(pc)
    uri = run_uri(pc.storage, pc.run_id, "pipeline.yaml")
    storage.write_bytes(uri, yaml.safe_dump(pc.to_dict(), sort_keys=True).encode())
    log.info("pipeline config %s (hash %s) -> %s", pc.run_id, pc.config_hash(), uri)
    return uri


def continue_cursor(pc: PipelineConfig) -> None:
    """``data_cursor=continue``: start where the versions of ``policy_name`` registered on this env stopped (their
    lineages' cursors: the furthest train and evaluation task, so a version registered by hand with an earlier
    cursor cannot rewind the tasks later runs are judged on) with the newest one's seed + 1, or the next seed no
    version recorded (one registered by hand with a lower seed must not replay an earlier run's). Every registered
    version counts, promoted or not, so a refused promotion does not replay its tasks; a cursor that is not one
    (registered before register checked them) is skipped with a warning; with none the settings stay."""
    from sdarflow.registry.intake import Cursor

    registry = Registry(pc.registry)
    cursors: list[tuple[int, Cursor]] = []  # newest first
    for version in reversed(registry.versions(pc.policy_name)):
        recorded = registry.lineage(pc.policy_name, version).get("cursor")
        if not (isinstance(recorded, dict) and recorded.get("env") == pc.env):
            continue
        try:
            cursors.append((version, Cursor.check(recorded, f"'{pc.policy_name}' v{version}'s cursor", "")))
        except ConfigError as err:
            log.warning("data cursor: skipped (%s)", err)
    if not cursors:
        return
    version, newest = cursors[0]
    cursor = Cursor(
        env=pc.env,
        next_task=max(c.next_task for _, c in cursors),
        seed=newest.seed,
        next_eval_task=max(c.next_eval_task for _, c in cursors),
    )
    played = {c.seed for _, c in cursors}
    seed = (cursor.seed + 1) % (MAX_SEED + 1)
    while seed in played:
        seed = (seed + 1) % (MAX_SEED + 1)
    generate = {**pc.stage_settings.get("generate", {}), "first_task": cursor.next_task}
    if "seed" in generate:  # where generate's seed is set, the new one goes
        generate["seed"] = seed
    evaluate = {**pc.stage_settings.get("evaluate", {}), "first_task": cursor.next_eval_task}
    pc.stage_settings = {**pc.stage_settings, "generate": generate, "evaluate": evaluate}
    pc.seed = seed
    log.info(
        "data cursor: %s v%d stopped at train task %d with seed %d and evaluation task %d; this run starts "
        "there with seed %d",
        pc.policy_name, version, cursor.next_task, cursor.seed, cursor.next_eval_task, seed,
    )  # fmt: skip


def request_key(pc: PipelineConfig) -> str:
    """What a prepared run trains, as one hash (lineage ``request``): its settings (the data cursor's among them),
    the start adapter's identity (the registry version it resolved to, else its URI and manifest, which names every
    file's sha256) and a published seed library's content version."""
    settings = {
        k: v
        for k, v in pc.to_dict().items()
        if k not in ("run_id", "data_cursor", "tracking_uri", "serve_deployment")
    }
    if pc.seed_skills and storage.is_published(pc.seed_skills):
        settings["seed_skills"] = storage.read_manifest(pc.seed_skills).get("version", pc.seed_skills)
    if pc.start_adapter and storage.is_published(pc.start_adapter):
        manifest = storage.read_manifest(pc.start_adapter)
        settings["start_adapter"] = (
            [manifest.get("registry"), manifest.get("name"), manifest["version"]]
            if "version" in manifest
            else [pc.start_adapter, manifest]
        )
    return content_hash(_whole_numbers(settings))


def _whole_numbers(value: Any) -> Any:
    """``value`` with whole floats as ints: KFP passes a dict parameter's numbers as floats (2 arrives as 2.0)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _whole_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_whole_numbers(v) for v in value]
    return value


def unchanged_since(pc: PipelineConfig) -> str:
    """Why a prepared run would train nothing new ("" when it would): the newest registered version of
    ``policy_name`` came from the same :func:`request_key` (e.g. ``data_cursor=fixed`` and an unchanged start)."""
    registry = Registry(pc.registry)
    versions = registry.versions(pc.policy_name)
    if not versions:
        return ""
    lineage = registry.lineage(pc.policy_name, versions[-1])
    if lineage.get("request") != request_key(pc):
        return ""
    return (
        f"nothing changed since run {lineage.get('run_id')} registered {pc.policy_name} v{versions[-1]}: the same "
        f"start adapter, tasks, seeds and settings; fix: data_cursor continue (new tasks and seeds), or change a "
        f"setting or the start adapter"
    )


def resolve_seed_skills(pc: PipelineConfig) -> str:
    """The seed library's URI: ``reference`` becomes the env's SDAR reference library, published into the run."""
    if pc.seed_skills != REFERENCE_SKILLS:
        return pc.seed_skills
    folder = reference_library(pc.env)
    if folder is None:
        raise ConfigError(
            f"pipeline: seed_skills {REFERENCE_SKILLS!r}: the SDAR reference has no skill library for {pc.env} "
            f"(search-qa has one); fix: a published library URI, or leave seed_skills empty"
        )
    # overwrite: a retried prepare publishes it again
    return SkillLibrary.load(folder).publish(run_uri(pc.storage, pc.run_id, "seed-skills"), overwrite=True)


def resolve_start_adapter(pc: PipelineConfig) -> str:
    """The adapter URI round 0 starts from; a registry reference is resolved now (a scheduled run continues from
    what is in production when it starts) and copied into the run."""
    ref = pc.start_adapter.strip()
    if ref not in REGISTRY_REFS and parse_version(ref) is None:
        return ref  # empty (a new LoRA) or an adapter URI/folder
    registry = Registry(pc.registry)
    if ref in RELEASE_STAGES and ref not in registry.aliases(pc.policy_name):
        msg = "start_adapter: %s has no %s version yet in %s; starting from a new LoRA"
        log.warning(msg, pc.policy_name, ref, pc.registry)
        return ""
    return copy_version(pc, registry, ref, "start-adapter")


def copy_version(pc: PipelineConfig, registry, ref: str, folder: str) -> str:
    """The adapter of the registry version ``ref`` resolves to, published in ``runs/<run_id>/<folder>``, its
    manifest naming the registry, the policy, the version and the reference it was ``resolved_from``."""
    version = registry.resolve(pc.policy_name, ref)
    target = run_uri(pc.storage, pc.run_id, folder)
    with tempfile.TemporaryDirectory() as tmp:
        copy = registry.fetch_adapter(pc.policy_name, version, dest=tmp)  # sha256-verified copy
        for name in (*RESERVED_FILES, MODEL_CARD):  # registry bookkeeping, not adapter files
            (Path(copy) / name).unlink(missing_ok=True)
        storage.publish_dir(
            copy,
            target,
            kind="adapter",
            overwrite=True,
            registry=pc.registry,
            name=pc.policy_name,
            version=version,
            resolved_from=ref,
            teacher_contexts=registry.lineage(pc.policy_name, version).get(
                "teacher_contexts", [UNKNOWN_CONTEXT]
            ),
        )
    log.info("%s: %s %s = v%d -> %s", folder, pc.policy_name, ref, version, target)
    return target


def load(config_uri: str) -> PipelineConfig:
    return PipelineConfig.from_dict(yaml.safe_load(storage.read_bytes(config_uri)))
