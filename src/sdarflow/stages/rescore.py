"""Stage ``rescore``: ``old_logprobs`` (policy, plain context) and ``teacher_logprobs`` (same policy with retrieved
skills in its context) for every response token, plus ``skill_ids`` and whether a task-specific skill was found."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import pyarrow as pa

from sdarflow import storage
from sdarflow.config import StageConfig, opt
from sdarflow.rollout.prompt import SKILL_PLACES
from sdarflow.schema import RESCORE_FIELDS, RESCORED_SCHEMA, TRAJECTORY_SCHEMA
from sdarflow.skills.retrieve import STRATEGIES, get_strategy
from sdarflow.stages.common import local_artifact, require

log = logging.getLogger(__name__)


@dataclass
class RescoreConfig(StageConfig):
    stage = "rescore"
    input: list[str] = opt([], "trajectory dataset URI(s)", io=True)
    skills: str = opt("", "skill library (published URI or folder)", io=True)
    model: str = opt("", "base model HF folder", io=True)
    adapter: str = opt("", "the adapter that generated the trajectories (the policy being trained)", io=True)
    output: str = opt("", "output rescored dataset URI", io=True)
    retrieval: str = opt("keyword", "skill retrieval strategy", choices=tuple(STRATEGIES))
    skill_place: str = opt("system", "where the teacher's skills go in the context", choices=SKILL_PLACES)
    max_batch_tokens: int = opt(16384, "padded tokens per forward pass")
    overwrite: bool = opt(False, "replace an existing dataset at --output", io=True)


def run(cfg: RescoreConfig) -> dict:
    from sdarflow.models import load_policy
    from sdarflow.skills.library import SkillLibrary
    from sdarflow.teacher.rescore import gap_stats, score, teacher_prompts

    require("rescore", input=cfg.input, skills=cfg.skills, model=cfg.model, output=cfg.output)
    table = storage.read_table(cfg.input, kind="trajectories", schema=TRAJECTORY_SCHEMA)
    lib = SkillLibrary.load(local_artifact(cfg.skills, "skills"))
    policy = load_policy(cfg.model, local_artifact(cfg.adapter, "adapter"))
    rows = table.select(
        ["prompt_token_ids", "response_token_ids", "prompt_messages", "task_type"]
    ).to_pylist()
    responses = [r["response_token_ids"] for r in rows]
    t0 = time.perf_counter()
    pad = policy.tokenizer.pad_token_id
    old = score(
        policy.model,
        [r["prompt_token_ids"] for r in rows],
        responses,
        pad,
        cfg.max_batch_tokens,
        desc="rescore student",
    )
    teach = teacher_prompts(rows, lib, get_strategy(cfg.retrieval), policy.tokenizer, cfg.skill_place)
    teacher = score(policy.model, teach.prompts, responses, pad, cfg.max_batch_tokens, desc="rescore teacher")
    seconds = time.perf_counter() - t0

    metrics = gap_stats(old, teacher)
    tokens = sum(len(r) for r in responses)
    rollout = table["rollout_logprobs"].to_pylist()
    drift = [abs(a - b) for ro, o in zip(rollout, old, strict=True) for a, b in zip(ro, o, strict=True)]
    metrics.update(
        {
            # Engine vs trainer log-probs of the same tokens: silent off-policy error if it grows.
            "rescore/engine_logprob_gap_abs": sum(drift) / max(1, len(drift)),
            "rescore/retrieval_hit_rate": sum(teach.hits) / max(1, len(teach.hits)),
            "rescore/tokens_per_s": 2 * tokens / max(seconds, 1e-9),
        }
    )
    new_cols = {
        "old_logprobs": old,
        "teacher_logprobs": teacher,
        "skill_ids": teach.skill_ids,
        "skill_hit": teach.hits,
    }
    types = {f.name: f.type for f in RESCORE_FIELDS}
    for name, values in new_cols.items():
        table = table.append_column(pa.field(name, types[name]), pa.array(values, type=types[name]))
    storage.write_table(
        table,
        cfg.output,
        kind="rescored",
        schema=RESCORED_SCHEMA,
        config_hash=cfg.config_hash(),
        inputs=[*cfg.input, cfg.skills, cfg.model] + ([cfg.adapter] if cfg.adapter else []),
        overwrite=cfg.overwrite,
        metrics=metrics,
        skill_library=lib.version,
    )
    log.info(
        "rescore: %d rows, gap mean %.4f, hit rate %.2f -> %s",
        table.num_rows,
        metrics["rescore/gap_mean"],
        metrics["rescore/retrieval_hit_rate"],
        cfg.output,
    )
    return {"uri": cfg.output, "rows": table.num_rows, "metrics": metrics, "skill_library": lib.version}
