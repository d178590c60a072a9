"""Stage ``generate``: multi-turn rollouts, G per task (a GRPO group), as turn-level trajectory Parquet."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import pyarrow as pa

from sdarflow import storage
from sdarflow.config import StageConfig, opt
from sdarflow.envs import SPLITS, get_suite
from sdarflow.errors import ConfigError
from sdarflow.rollout.engine import ENGINES
from sdarflow.schema import TRAJECTORY_SCHEMA
from sdarflow.stages.common import local_artifact, policy_version, require

log = logging.getLogger(__name__)


@dataclass
class GenerateConfig(StageConfig):
    stage = "generate"
    model: str = opt("", "base model: an HF model folder", io=True)
    adapter: str = opt("", "LoRA adapter (published URI or PEFT folder); empty = the base model", io=True)
    output: str = opt("", "output dataset URI", io=True)
    env: str = opt("textworld-cooking", "environment suite name (`sdarflow envs list`)")
    split: str = opt("train", "task split", choices=SPLITS)
    tasks: int = opt(8, "tasks: the first N of the split")
    group_size: int = opt(4, "G rollouts per task (one GRPO group); >= 2, paper uses 8")
    max_turns: int = opt(0, "turn limit per episode; 0 = the env's default for the split")
    max_new_tokens: int = opt(24, "tokens per action")
    temperature: float = opt(1.0, "sampling temperature; > 0 so a group's samples differ")
    top_p: float = opt(1.0, "nucleus sampling mass, (0, 1]")
    history_turns: int = opt(4, "recent actions kept in the prompt")
    engine: str = opt("hf", "generation engine", choices=ENGINES)
    batch_size: int = opt(64, "prompts per engine call")
    seed: int = opt(0, "base seed; each sample's seed derives from it, the episode and the turn")
    shard: int = opt(0, "this task's shard index in [0, num_shards)", io=True)
    num_shards: int = opt(1, "shards the round's tasks are split over (one KFP task each)", io=True)
    run_id: str = opt("local", "pipeline run id (lineage)", io=True)
    round: int = opt(0, "RL round (lineage)", io=True)
    overwrite: bool = opt(False, "replace an existing dataset at --output", io=True)

    def validate(self) -> None:
        if self.group_size < 2:
            raise ConfigError(
                f"generate: group_size ({self.group_size}) must be >= 2: GRPO normalizes within a group"
            )
        if self.tasks < 1:
            raise ConfigError(f"generate: tasks ({self.tasks}) must be >= 1")
        if not 0 <= self.shard < self.num_shards:
            raise ConfigError(f"generate: shard ({self.shard}) must be in [0, num_shards={self.num_shards})")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"generate: top_p ({self.top_p}) must be in (0, 1]")


def run(cfg: GenerateConfig) -> dict:
    from sdarflow.models import load_policy
    from sdarflow.rollout.engine import make_engine
    from sdarflow.rollout.loop import SamplingParams, rollout

    require("generate", model=cfg.model, output=cfg.output)
    suite = get_suite(cfg.env)  # unknown env fails here, before any model loads
    policy = load_policy(cfg.model, local_artifact(cfg.adapter, "adapter"))
    tasks = suite.tasks(cfg.split, cfg.tasks)[cfg.shard :: cfg.num_shards]
    engine = make_engine(cfg.engine, policy.model, policy.tokenizer, policy.eos_id, cfg.batch_size)
    params = SamplingParams(
        max_turns=cfg.max_turns or 1000,  # the env ends episodes at its own limit
        max_new_tokens=cfg.max_new_tokens,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        history_turns=cfg.history_turns,
        seed=cfg.seed,
    )
    t0 = time.perf_counter()
    rows, episodes = rollout(
        engine,
        suite,
        tasks,
        cfg.group_size,
        params,
        policy.tokenizer,
        run_id=cfg.run_id,
        round_=cfg.round,
        policy_version=policy_version(cfg.adapter),
        desc=f"generate {cfg.split}",
    )
    seconds = time.perf_counter() - t0
    metrics = rollout_metrics(rows, episodes, seconds)
    table = pa.Table.from_pylist(rows, schema=TRAJECTORY_SCHEMA)
    storage.write_table(
        table,
        cfg.output,
        kind="trajectories",
        schema=TRAJECTORY_SCHEMA,
        config_hash=cfg.config_hash(),
        inputs=[cfg.model] + ([cfg.adapter] if cfg.adapter else []),
        overwrite=cfg.overwrite,
        run_id=cfg.run_id,
        round=cfg.round,
        metrics=metrics,
    )
    log.info(
        "generate: %d episodes, success %.3f, %d rows -> %s",
        len(episodes),
        metrics["rollout/success"],
        len(rows),
        cfg.output,
    )
    return {"uri": cfg.output, "rows": len(rows), "metrics": metrics}


def rollout_metrics(rows: list[dict], episodes, seconds: float) -> dict[str, float]:
    n = max(1, len(episodes))
    tokens = sum(len(r["response_token_ids"]) for r in rows)
    return {
        "rollout/episodes": float(len(episodes)),
        "rollout/success": sum(e.won for e in episodes) / n,
        "rollout/mean_turns": sum(len(e.rows) for e in episodes) / n,
        "rollout/format_error_rate": sum(not r["format_ok"] for r in rows) / max(1, len(rows)),
        "rollout/tokens": float(tokens),
        "rollout/tokens_per_s": tokens / max(seconds, 1e-9),
        "rollout/env_steps_per_s": len(rows) / max(seconds, 1e-9),
        "rollout/seconds": seconds,
    }
