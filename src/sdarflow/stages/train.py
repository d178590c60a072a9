"""Stage ``train``: one RL update of the policy on rescored turn rows with the chosen method (default SDAR: GRPO
clipped loss + lambda * gated OPSD loss), optionally interleaved with SFT steps on the successful rows
(``--sft-ratio``), or a supervised warm start on successful/expert rows only (``--mode sft``).

Trains a LoRA adapter (or the full model with ``--lora-rank 0``) through the ``torch`` or ``deepspeed`` engine,
checkpoints atomically every ``--save-every`` steps into ``--checkpoint-dir`` and resumes from the newest
checkpoint there. Publishes the adapter (PEFT format; a full HF model folder for a full fine-tune) with
``metrics.jsonl`` (one line per optimizer step), ``train_summary.json``, ``report.md`` and ``report.html``.
With more than one GPU and the deepspeed engine, the stage re-launches itself with one process per GPU.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import torch

from sdarflow import storage
from sdarflow.config import StageConfig, cache_dir, content_hash, opt
from sdarflow.errors import ConfigError, SchemaError, StorageError
from sdarflow.extensions.options import TrainOptions
from sdarflow.extensions.train_round import RoundOptions
from sdarflow.models.device import precision_opt, resolve_device, weights_dtype
from sdarflow.schema import check_vocab
from sdarflow.stages.common import allow_unpublished_opt, local_artifact, once, require
from sdarflow.tracking import check_available, tracking_opt
from sdarflow.train.checkpoint import checkpointing
from sdarflow.train.engine import TRAIN_ENGINES, make_engine
from sdarflow.train.format_guard import GUARD_HELP, GUARDS
from sdarflow.train.format_guard import SUMMARY_KEY as FORMAT_RATES
from sdarflow.train.launch import deterministic_mode, relaunch, resolve_engine, should_relaunch
from sdarflow.train.report import jsonl_writer, publish_run, run_summary
from sdarflow.train.rl_setup import (
    PRESET_CHOICES,
    resolve_objective,
    rl_shaping,
    train_inputs,
)
from sdarflow.train.samples import EPISODE_WEIGHTS, read_rows
from sdarflow.train.schedule import TrainState, WarmupConstant
from sdarflow.train.sft import replayed_pairs
from sdarflow.train.trainer import TrainLoop, train

log = logging.getLogger(__name__)

ZERO_STAGES = (2, 3)
OPTIMIZER_FILE = "optimizer.pt"  # a carried AdamW: {"steps": n, "state": {param name: moments}}
# Settings that may change between a run and its resumption: run length, checkpoint cadence, output location.
RESUMABLE_CHANGES = frozenset(
    {"output", "overwrite", "checkpoint_dir", "checkpoint_uri", "max_steps", "save_every", "keep_checkpoints"}
)


@dataclass
class TrainConfig(StageConfig, TrainOptions, TrainLoop):
    """The train stage's flags: the loss's and the trainer's (:class:`TrainLoop`, an Objective), the research
    options' (:class:`~sdarflow.extensions.options.TrainOptions`), then the stage's own."""

    stage = "train"
    input: list[str] = opt([], "rescored dataset URI(s) (mode sft: trajectories work too)", reads=True)
    replay: list[str] = opt(
        [],
        "earlier rounds' trajectories or rescored datasets, oldest first: for each task this round's input plays "
        "and solves no episode of, the solved episodes of the newest of them that solves it join the --sft-ratio "
        "SFT steps (self-imitation: a task the policy stopped solving keeps its last successes); the pipeline "
        "fills it from --replay-rounds",
        reads=True,
    )
    replay_rounds: int = opt(
        0,
        "the pipeline's --replay: the rollouts of this many rounds before this one (needs --sft-ratio > 0)",
        ge=0,
    )
    model: str = opt("", "base model HF folder", reads=True)
    adapter: str = opt(
        "",
        "adapter, or full fine-tune of --model, to continue training (published URI or folder); empty = a new LoRA",
        reads=True,
    )
    output: str = opt("", "output URI: the adapter, or the model of a full fine-tune", io=True)
    preset: str = opt(
        "auto",
        "reference settings for --kl-coef and --invalid-action-penalty: alfworld/webshop (0.01, 0.1), search "
        "(0.001, 0.01); auto = from the env that generated the rows",
        choices=PRESET_CHOICES,
    )
    invalid_action_penalty: float | None = opt(
        None,
        "subtracted from the GRPO score of a turn whose action did not parse; unset = --preset's: 0.1 "
        "alfworld/webshop, 0.01 search",
        ge=0,
    )
    adv_stats: str = opt(
        "turn",
        "GRPO group mean/std over turn rows (reference, compute_mean_std_cross_steps) or over episodes (each scored "
        "by its rows' mean; its rows share its advantage)",
        choices=("turn", "episode"),
    )
    episode_weight: str = opt(
        "tokens",
        "weight of an episode in the policy gradient: tokens (each response token its episode's advantage, so long "
        "episodes weigh more; the reference) or equal (each row's advantage times its group's mean episode length "
        "over its episode's: every episode weighs the same, GRPO's 1/|o_i| with the episode as o_i)",
        choices=EPISODE_WEIGHTS,
    )
    format_repair_every: int = opt(
        4,
        "--format-guard repair: one SFT step on the repaired malformed turns after every this many RL steps",
        ge=1,
    )
    format_guard: str = opt("warn", GUARD_HELP, choices=GUARDS)
    norm_by_std: bool = opt(True, "GRPO: divide by the group's score std (False: Dr. GRPO)")
    engine: str = opt(
        "auto",
        "torch (plain AdamW, one device) or deepspeed (ZeRO; bf16 on GPU; one process per GPU); auto = deepspeed "
        "when the node has more than one GPU or this is one of several launched workers, else torch",
        choices=("auto", *TRAIN_ENGINES),
    )
    precision: str = precision_opt(
        "the base weights on this rank's GPU (a LoRA's frozen base; DeepSpeed trains bf16 copies against float32 "
        "masters either way); auto keeps float32 for a full fine-tune with --engine torch. LoRA weights train in "
        "float32"
    )
    zero_stage: int = opt(
        2, "deepspeed: ZeRO stage, 2 (shard optimizer + gradients) or 3 (+ parameters)", choices=ZERO_STAGES
    )
    lr: float = opt(5e-4, "AdamW learning rate (after warmup)", gt=0)
    weight_decay: float = opt(0.0, "AdamW weight decay (the SDAR reference's, verl's default: 0.01)", ge=0)
    carry_optimizer: bool = opt(
        False,
        f"one AdamW across rounds, as the SDAR reference keeps one for its whole run: continue the input adapter's "
        f"moments and step count (its {OPTIMIZER_FILE}, when it carries one) and publish this run's with the output",
    )
    warmup_steps: int = opt(
        0, "linear learning-rate warmup over this many optimizer steps, then constant", ge=0
    )
    lora_rank: int = opt(
        8, "LoRA rank; 0 = full fine-tune (every weight trains; publishes a full HF model)", ge=0
    )
    lora_alpha: int = opt(16, "LoRA alpha", ge=1)
    lora_targets: list[str] = opt(
        [], "modules that get LoRA (names, e.g. q_proj); empty: every linear layer of the model's blocks"
    )
    deterministic: bool = opt(False, "deterministic kernels and 1 CPU thread: bit-exact kill/resume on CPU")
    checkpoint_dir: str = opt(
        "", "local folder for checkpoints; a rerun with the same folder resumes; empty = off", io=True
    )
    checkpoint_uri: str = opt(
        "",
        "storage URI (s3:// or folder) every checkpoint is also published to, and a rerun resumes from when it is "
        "newer than the local ones (a retried pod on another node); removed once the output is published; "
        "without --checkpoint-dir the local copies go to the cache folder ($SDARFLOW_CACHE); empty = off",
        io=True,
    )
    keep_checkpoints: int = opt(2, "newest checkpoints kept in --checkpoint-dir (and --checkpoint-uri)", ge=1)
    allow_unpublished: bool = allow_unpublished_opt()
    overwrite: bool = opt(False, "replace an existing adapter at --output", io=True)
    tracking_uri: str = tracking_opt()

    def validate(self) -> None:
        if 0 < self.clip_ratio_c <= 1:
            raise ConfigError(
                f"train: clip_ratio_c ({self.clip_ratio_c}) must be > 1 (it bounds -A * ratio for A < 0), "
                f"or 0 to turn the dual clip off; fix: --clip-ratio-c 3 (the reference's) or 0"
            )
        if self.sdar_coef > 0.1:
            log.warning(
                "train: sdar_coef %.3g > 0.1: distillation tends to dominate GRPO and degrade results",
                self.sdar_coef,
            )
        if self.target_kl and self.method == "opsd":
            raise ConfigError(
                "train: --target-kl stops on the PPO ratio's KL, and opsd has no policy-gradient term to measure it "
                "on; fix: drop --target-kl, or train a method with one (grpo, sdar, grpo_opsd, rlsd, skill_sd)"
            )
        if (self.replay or self.replay_rounds) and not (self.mode == "rl" and self.sft_ratio > 0):
            raise ConfigError(
                "train: --replay (--replay-rounds) adds earlier successes to the SFT steps, and this run takes none "
                "(mode rl with --sft-ratio > 0 does); fix: --mode rl --sft-ratio 0.25, or no replay"
            )
        self.validate_options()
        if self.checkpoint_dir and "://" in self.checkpoint_dir:
            raise ConfigError(
                f"train: checkpoint_dir '{self.checkpoint_dir}' must be a local folder (a volume), not a URI; "
                f"fix: mount a volume and pass its path"
            )

    def resume_fingerprint(self) -> str:
        """Identity of the run a checkpoint belongs to: settings and inputs, minus what may change on resume."""
        params = {k: v for k, v in self.to_dict().items() if k not in RESUMABLE_CHANGES}
        return content_hash(params, 16)


Config = TrainConfig  # the stage's exports are Config and run (sdarflow.stages)


def weights_placement(cfg: TrainConfig, full: bool) -> tuple[torch.device, torch.dtype]:
    """Where and as what the model loads: on this rank's GPU (``LOCAL_RANK``) when there is one, else the CPU;
    ``--precision`` there, except that ``auto`` keeps float32 for a ``full`` fine-tune with the torch engine
    (AdamW on bf16 weights loses updates smaller than their rounding). Eight ranks of a 7B model so hold 14 GB
    each on their GPUs, not 28 GB each in host memory."""
    place = resolve_device("auto")
    full_torch = cfg.engine == "torch" and full
    precision = "fp32" if cfg.precision == "auto" and full_torch else cfg.precision
    return place, weights_dtype(precision, place)


def build_model(cfg: TrainConfig):
    """(policy, trainable model, the round's research options): the base with the given adapter, a new LoRA, or
    all weights (rank 0; a full fine-tune given as the adapter continues as one)."""
    from sdarflow.models import load_policy
    from sdarflow.models.identity import is_full_fine_tune
    from sdarflow.models.policy import new_lora

    adapter = local_artifact(cfg.adapter, "adapter", cfg.allow_unpublished, full_model=True)
    continued = bool(adapter) and is_full_fine_tune(adapter)
    if continued and (cfg.lora_rank > 0 or cfg.ema_decay):
        raise ConfigError(
            f"train: --adapter {cfg.adapter} is a full fine-tune (trained with --lora-rank 0), which continues as "
            f"one (no LoRA, so no --ema-decay average); fix: pass --lora-rank 0 and --ema-decay 0, or start a "
            f"LoRA from the base model without --adapter"
        )
    if adapter and not continued and cfg.lora_rank == 0:
        log.warning(
            "train: --lora-rank 0 with the LoRA --adapter %s: the LoRA continues, not a full fine-tune",
            cfg.adapter,
        )
    place, dtype = weights_placement(cfg, full=continued or (cfg.lora_rank == 0 and not adapter))
    policy = load_policy(cfg.model, adapter, trainable=True, device=str(place), dtype=dtype)
    model = policy.model
    if not cfg.adapter and cfg.lora_rank > 0:
        model = new_lora(model, cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets)
    model.train()
    return policy, model, RoundOptions(cfg, model, adapter)


@once(None)  # adapter, or model when fully fine-tuned
def run(cfg: TrainConfig) -> dict:
    require("train", input=cfg.input, model=cfg.model, output=cfg.output)
    check_available(cfg.tracking_uri)
    cfg = dataclasses.replace(cfg, engine=resolve_engine(cfg.engine, torch.cuda.device_count()))
    own_folder = bool(cfg.checkpoint_uri and not cfg.checkpoint_dir)
    if own_folder:
        # chosen before a relaunch, so every rank writes to the same folder; by mirror and settings, so a rerun in
        # this pod finds its own and nothing else's
        key = content_hash({"mirror": cfg.checkpoint_uri, "run": cfg.resume_fingerprint()}, 16)
        cfg = dataclasses.replace(cfg, checkpoint_dir=str(cache_dir() / "checkpoints" / key))
    if should_relaunch(cfg.engine, torch.cuda.device_count()):
        result = relaunch(cfg.to_dict(), cfg.output, torch.cuda.device_count())
    else:
        if cfg.engine == "torch" and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise ConfigError(
                f"train: engine torch trains in one process, but this is one of {os.environ['WORLD_SIZE']} "
                f"launched workers; fix: pass --engine deepspeed for multi-process training"
            )
        with deterministic_mode(cfg.deterministic):
            result = _train(cfg)
    if cfg.checkpoint_uri and int(os.environ.get("RANK", "0")) == 0:
        # published: the mirrored checkpoints (and the local ones this run chose a folder for) are spent
        storage.delete_tree(cfg.checkpoint_uri)
        if own_folder:
            shutil.rmtree(cfg.checkpoint_dir, ignore_errors=True)
    return result


def _replay_rows(uri: str) -> list[dict]:
    """An earlier round's rows for --replay; a missing or wrong dataset is named as one."""
    try:
        return read_rows("sft", [uri], task_id=True, what="train --replay")
    except (StorageError, SchemaError) as err:
        raise ConfigError(f"train --replay: {err}") from None


def carried_optimizer(cfg: TrainConfig, engine) -> int:
    """With ``--carry-optimizer``, load the input adapter's AdamW state into ``engine``; the optimizer steps it had
    taken (0 when there is none to carry: a new LoRA, or an adapter trained without it)."""
    if not (cfg.carry_optimizer and cfg.adapter and storage.is_published(cfg.adapter)):
        return 0
    if storage.member_entry(storage.read_manifest(cfg.adapter), OPTIMIZER_FILE) is None:
        log.info("train: %s carries no optimizer state; a new AdamW", cfg.adapter)
        return 0
    body = torch.load(io.BytesIO(storage.read_member(cfg.adapter, OPTIMIZER_FILE)), weights_only=True)
    engine.load_optimizer_state(body["state"])
    log.info("train: continuing the optimizer of %s after %d steps", cfg.adapter, body["steps"])
    return int(body["steps"])


def _train(cfg: TrainConfig) -> dict:
    rows = read_rows(cfg.mode, cfg.input)
    cfg, rl_step = resolve_objective(cfg, rows)
    torch.manual_seed(cfg.seed)  # LoRA initialization
    policy, model, options = build_model(cfg)
    ids = ("prompt_token_ids", "response_token_ids")
    vocab = model.get_input_embeddings().weight.shape[0]
    check_vocab(
        pa.table({k: [r[k] for r in rows] for k in ids}), vocab, f"dataset {', '.join(cfg.input)}", cfg.model
    )
    # what the base loaded as (DeepSpeed on a GPU then trains bf16 copies of any float32 weights)
    weights = str(model.get_input_embeddings().weight.dtype).removeprefix("torch.")
    engine = make_engine(
        cfg.engine,
        model,
        lr=cfg.lr,
        max_grad_norm=cfg.max_grad_norm,
        zero_stage=cfg.zero_stage,
        weight_decay=cfg.weight_decay,
    )
    shaping = None
    if cfg.mode == "rl":
        values, fitted, warm = options.state_values(engine, policy.tokenizer.pad_token_id, rows)
        shaping = rl_shaping(cfg, rows, values, warm)
        shaping.metrics.update(fitted)
    # only with --replay, which only rl mode takes (an sft run's rows carry no task ids)
    replayed = replayed_pairs(rows, [_replay_rows(uri) for uri in cfg.replay]) if cfg.replay else []
    if cfg.replay_rounds and not cfg.replay:
        log.info(
            "train: --replay-rounds and no --replay: nothing to replay (a pipeline fills --replay with its earlier "
            "rounds' rollouts; its first round has none)"
        )
    data = train_inputs(cfg, rows, shaping, policy, rl_step, options.repairs(rows, policy, shaping), replayed)
    schedule = WarmupConstant(cfg.lr, cfg.warmup_steps, start=carried_optimizer(cfg, engine))
    state, save_checkpoint = checkpointing(cfg, engine, data, schedule, options.ema)
    resumed_from = state.step if state else 0
    state = state or TrainState()
    warmup = bool(shaping and shaping.warmup)  # a warm-up round fits only the value head
    probing = options.probing(rows, policy, engine, data, schedule, active=bool(shaping) and not warmup)

    with tempfile.TemporaryDirectory(prefix="sdarflow-train-") as tmp, probing:
        out = Path(tmp)
        writer = jsonl_writer(out / "metrics.jsonl", state.history) if engine.rank == 0 else None
        start = {}
        if not warmup:
            start = options.start(engine.model, state)
            state = train(
                engine,
                data,
                cfg,
                schedule,
                state=state,
                on_step=options.on_step(writer, engine.model, state),
                on_checkpoint=save_checkpoint,
            )
        summary = {**run_summary(state.history), **start}
        if cfg.target_kl:  # the step --target-kl stopped before (0: every step ran)
            summary["train/kl_stop_step"] = float(state.kl_stop["step"] if state.kl_stop else 0)
        if shaping:
            summary.update(shaping.metrics)
        if cfg.replay:  # SFT pairs from earlier rounds' successes of tasks this round did not solve
            summary["sft/replayed_pairs"] = float(len(replayed))
        objective = {**cfg.settings(), "rl_step": rl_step}  # as the run used them: the preset resolved
        with engine.gathered():  # ZeRO-3: every rank takes part in gathering the full weights
            masters = engine.master_weights()
            adam = engine.optimizer_state() if cfg.carry_optimizer else None  # collective too
            if engine.rank == 0:
                if adam is not None:
                    torch.save({"steps": schedule.start + state.step, "state": adam}, out / OPTIMIZER_FILE)
                lineage = {FORMAT_RATES: shaping.format_rates} if shaping else {}
                lineage.update(options.lineage(state, warmup))
                record = {**summary, "objective": objective, "weights_dtype": weights, **lineage}
                options.save(out)
                publish_run(cfg, policy, model, masters, out, state.history, summary, record)
        engine.barrier()
    label = "sft" if cfg.mode == "sft" else cfg.method
    log.info("train: %s, %d steps (resumed at %d) -> %s", label, state.step, resumed_from, cfg.output)
    return {"uri": cfg.output, "steps": state.step, "resumed_from_step": resumed_from, "metrics": summary}
