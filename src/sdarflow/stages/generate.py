"""Stage ``generate``: multi-turn rollouts, G per task (a GRPO group), as turn-level trajectory Parquet.

One shard (``--shard i --num-shards n``) takes every n-th task of the round, so shards partition the tasks and each
gets the same task-type mix. Bad input (unknown env or engine, an adapter for another base model, a prompt longer
than the engine's context, vllm not installed) fails in one line before any episode runs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from sdarflow import storage
from sdarflow.config import MAX_SEED, StageConfig, opt
from sdarflow.envs import SPLITS, get_suite
from sdarflow.errors import ConfigError
from sdarflow.models.device import device_opt, resolve_device
from sdarflow.rollout.engine import engine_opt, prompt_format_opt
from sdarflow.rollout.envhost import envs_opt, in_worker
from sdarflow.schema import TRAJECTORY_SCHEMA
from sdarflow.stages.common import allow_unpublished_opt, local_artifact, once, require

if TYPE_CHECKING:
    from sdarflow.rollout.episode import RolloutParams, RolloutResult

log = logging.getLogger(__name__)

VLLM_DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass
class GenerateConfig(StageConfig):
    stage = "generate"
    model: str = opt("", "base model: an HF model folder", reads=True)
    adapter: str = opt(
        "",
        "LoRA adapter (published URI or PEFT folder), or a full fine-tune of --model; empty = the base model",
        reads=True,
    )
    output: str = opt("", "output dataset URI", io=True)
    policy: str = opt(
        "model",
        "who plays: model = the policy (--model, --adapter); expert = the env's expert walkthrough, one episode per "
        "task, as SFT warm-start rows for --model's tokenizer and prompt format (then train --mode sft)",
        choices=("model", "expert"),
    )
    env: str = opt("textworld-cooking", "environment suite name (`sdarflow envs list`)")
    split: str = opt("train", "task split", choices=SPLITS)
    tasks: int = opt(8, "tasks played: N of the split, from --first-task", ge=1)
    first_task: int = opt(
        0, "index of the first task in the split; a pipeline's round r starts at first_task + r x tasks", ge=0
    )
    group_size: int = opt(4, "G rollouts per task (one GRPO group); >= 2, paper uses 8", ge=2)
    max_turns: int = opt(0, "turn limit per episode; 0 = the env's default for the split", ge=0)
    max_new_tokens: int = opt(
        0,
        "tokens per response; 0 = the env's need (24 for commands, 64 for JSON tool calls), plus 128 for the "
        "reasoning in the reference prompt format",
        ge=0,
    )
    prompt_format: str = prompt_format_opt()
    temperature: float = opt(1.0, "sampling temperature; > 0 so a group's samples differ", gt=0)
    top_p: float = opt(1.0, "nucleus sampling mass, (0, 1]", gt=0, le=1)
    history_turns: int = opt(4, "recent actions kept in the prompt", ge=0)
    expert_labels: bool = opt(
        True,
        "record the env's expert action at each turn and whether the policy's action matched it (expert_action, "
        "expert_match; null for an env without an expert): rescore's teacher discrimination reads them",
    )
    engine: str = engine_opt()
    device: str = device_opt()
    batch_size: int = opt(64, "prompts per engine call", ge=1)
    seed: int = opt(
        0, "base seed; each sample's seed derives from it, the episode and the turn", ge=0, le=MAX_SEED
    )
    step_timeout_s: float = opt(
        60.0,
        "seconds one env reset/step may take before its episode ends as failed (run continues); 0 = no limit",
        ge=0,
    )
    env_workers: int = opt(
        4, "env calls run at once (threads) for suites that declare thread_safe; 1 = serial", ge=1
    )
    envs: str = envs_opt()
    vllm_memory: float = opt(
        0.0,
        "vllm: gpu_memory_utilization (on CPU: the RAM share for the KV cache); 0 = 0.2 on CPU, 0.85 on GPU",
        ge=0,
        le=0.99,
    )
    vllm_dtype: str = opt("auto", "vllm: weight dtype; auto = the model's", choices=VLLM_DTYPES)
    vllm_enforce_eager: bool = opt(
        False, "vllm: skip torch.compile / CUDA graphs (faster start, slower steps)"
    )
    shard: int = opt(0, "this task's shard index in [0, num_shards)", io=True, ge=0)
    num_shards: int = opt(1, "shards the round's tasks are split over (one KFP task each)", io=True, ge=1)
    run_id: str = opt("local", "pipeline run id (lineage)", io=True)
    round: int = opt(0, "RL round (lineage)", io=True, ge=0)
    allow_unpublished: bool = allow_unpublished_opt()
    overwrite: bool = opt(False, "replace an existing dataset at --output", io=True)

    def validate(self) -> None:
        if self.policy == "expert" and self.adapter:
            raise ConfigError(
                "generate: --policy expert plays the walkthrough, not an adapter; fix: drop --adapter"
            )
        if self.shard >= self.num_shards:
            raise ConfigError(
                f"generate: shard ({self.shard}) must be in [0, num_shards={self.num_shards}); fix: --shard 0 to "
                f"{self.num_shards - 1}"
            )
        if self.tasks < self.num_shards:
            raise ConfigError(
                f"generate: tasks ({self.tasks}) must be >= num_shards ({self.num_shards}): every shard needs a task; "
                f"fix: fewer shards or more tasks"
            )


Config = GenerateConfig  # the stage's exports are Config and run (sdarflow.stages)


def shard_tasks(tasks: list, shard: int, num_shards: int) -> list:
    """Every ``num_shards``-th task from ``shard``: the shards partition ``tasks`` and differ in size by at most 1."""
    return tasks[shard::num_shards]


def rollout_params(cfg: StageConfig, suite, engine) -> RolloutParams:
    """The rollout loop's settings for a generate or evaluate ``cfg`` on ``engine`` (its context bounds the
    prompts: a prompt past it ends its episode)."""
    from sdarflow.rollout.engine import action_tokens, prompt_format
    from sdarflow.rollout.episode import RolloutParams

    fmt = prompt_format(cfg.prompt_format, engine.tokenizer)
    max_new_tokens = action_tokens(suite, cfg.max_new_tokens, fmt)
    if engine.max_context and engine.max_context <= max_new_tokens:
        raise ConfigError(
            f"{cfg.stage}: max_new_tokens ({max_new_tokens}) leaves no room for a prompt in the model's context "
            f"({engine.max_context}); fix: lower --max-new-tokens"
        )
    return RolloutParams(
        max_turns=cfg.max_turns or 1000,  # the env ends episodes at its own limit
        max_new_tokens=max_new_tokens,
        temperature=cfg.temperature,
        history_turns=cfg.history_turns,
        prompt_format=fmt,
        seed=cfg.seed,
        env_process=in_worker(cfg.envs, resolve_device(cfg.device)),
        max_prompt_tokens=engine.max_context - max_new_tokens if engine.max_context else 0,
        # generate's own settings (evaluate samples at top_p 1 with the loop's defaults)
        **{
            k: getattr(cfg, k)
            for k in ("top_p", "step_timeout_s", "env_workers", "expert_labels")
            if hasattr(cfg, k)
        },
    )


def open_engine(cfg: StageConfig, suite, vllm_options=None) -> tuple:
    """The generation engine of a generate or evaluate ``cfg`` (its adapter verified), its ``rollout_params`` and
    the adapter's local folder (None without one)."""
    from sdarflow.rollout.engine import load_engine

    adapter = local_artifact(cfg.adapter, "adapter", cfg.allow_unpublished, full_model=True)
    kwargs = {"batch_size": cfg.batch_size, "vllm_options": vllm_options, "device": cfg.device}
    engine = load_engine(cfg.engine, cfg.model, adapter, **kwargs)
    return engine, rollout_params(cfg, suite, engine), adapter


@once("trajectories")
def run(cfg: GenerateConfig) -> dict:
    from sdarflow.rollout.loop import run_rollout
    from sdarflow.rollout.vllm_engine import VLLMOptions

    require("generate", model=cfg.model, output=cfg.output)
    suite = get_suite(cfg.env)  # unknown env fails here, before any model loads
    tasks = shard_tasks(suite.tasks(cfg.split, cfg.tasks, start=cfg.first_task), cfg.shard, cfg.num_shards)
    if cfg.policy == "expert":
        return _finish(cfg, _expert(cfg, suite, tasks), "expert")
    vllm_options = VLLMOptions(
        memory=cfg.vllm_memory,
        dtype=cfg.vllm_dtype,
        max_num_seqs=cfg.batch_size,
        enforce_eager=cfg.vllm_enforce_eager,
    )
    engine, params, _ = open_engine(cfg, suite, vllm_options)
    try:
        result = run_rollout(
            engine,
            suite,
            tasks,
            cfg.group_size,
            params,
            engine.tokenizer,
            run_id=cfg.run_id,
            round_=cfg.round,
            policy_version=cfg.adapter or "base",
            desc=f"generate {cfg.env}/{cfg.split} shard {cfg.shard}/{cfg.num_shards}",
        )
    finally:
        engine.close()
    return _finish(cfg, result, engine.name)


def _expert(cfg: GenerateConfig, suite, tasks: list) -> RolloutResult:
    """The walkthrough rows for ``cfg.model``'s tokenizer (the weights are not needed)."""
    from sdarflow.models.policy import load_tokenizer
    from sdarflow.rollout.engine import prompt_format
    from sdarflow.rollout.episode import RolloutParams
    from sdarflow.rollout.loop import expert_rollout

    tokenizer = load_tokenizer(cfg.model)
    params = RolloutParams(
        max_turns=cfg.max_turns or 1000,
        history_turns=cfg.history_turns,
        prompt_format=prompt_format(cfg.prompt_format, tokenizer),
    )
    return expert_rollout(
        suite, tasks, params, tokenizer, tokenizer.eos_token_id, run_id=cfg.run_id, round_=cfg.round
    )


def _finish(cfg: GenerateConfig, result: RolloutResult, engine: str) -> dict:
    """Publish the rows with their report and the engine that generated them (``expert``: the env's walkthroughs),
    and log and return the metrics."""
    from sdarflow import report
    from sdarflow.rollout.report import rollout_report

    metrics = result.metrics()
    table = pa.Table.from_pylist(result.rows, schema=TRAJECTORY_SCHEMA)
    doc = rollout_report(result.rows, metrics, f"generate: {cfg.env}/{cfg.split}, round {cfg.round}")
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
        engine=engine,
        metrics=metrics,
        attachments={"report.md": report.markdown(doc).encode(), "report.html": report.html(doc).encode()},
    )
    log.info(
        "generate %s: %d episodes | success %.3f | turns %.1f | format errors %.3f | %.0f tok/s | "
        "%.1f env steps/s | identical groups %d | env errors %d -> %s",
        engine, len(result.episodes), metrics["rollout/success"], metrics["rollout/mean_turns"],
        metrics["rollout/format_error_rate"], metrics["rollout/tokens_per_s"], metrics["rollout/env_steps_per_s"],
        metrics["rollout/identical_groups"], metrics["rollout/env_errors"], cfg.output,
    )  # fmt: skip
    return {"uri": cfg.output, "rows": len(result.rows), "engine": engine, "metrics": metrics}
