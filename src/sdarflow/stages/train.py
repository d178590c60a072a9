"""Stage ``train``: one RL update of the LoRA adapter on rescored turn rows with the chosen method
(default SDAR: GRPO clipped loss + lambda * gated OPSD loss). Publishes the adapter (PEFT format) with its
``metrics.jsonl`` (one line per optimizer step) and a summary."""

from __future__ import annotations

import dataclasses
import json
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from sdarflow import storage
from sdarflow.algo import AGG_MODES, METHODS
from sdarflow.config import StageConfig, opt
from sdarflow.errors import ConfigError
from sdarflow.schema import RESCORED_SCHEMA
from sdarflow.stages.common import local_artifact, require

log = logging.getLogger(__name__)


@dataclass
class TrainConfig(StageConfig):
    stage = "train"
    input: list[str] = opt([], "rescored dataset URI(s)", io=True)
    model: str = opt("", "base model HF folder", io=True)
    adapter: str = opt(
        "", "adapter to continue training (published URI or folder); empty = a new LoRA", io=True
    )
    output: str = opt("", "output adapter URI", io=True)
    method: str = opt(
        "sdar", "objective: grpo, opsd, grpo_opsd (ungated), rlsd, skill_sd, sdar", choices=METHODS
    )
    lam: float = opt(0.01, "lambda, weight of the distillation loss; paper 0.01 (0.1 lets it dominate)")
    beta: float = opt(5.0, "gate sharpness: g = sigmoid(beta * (teacher - student)); paper 5, 0 = ungated")
    clip_low: float = opt(0.2, "PPO ratio clip below 1")
    clip_high: float = opt(0.2, "PPO ratio clip above 1")
    rlsd_lam: float = opt(0.5, "RLSD: share of the advantage re-weighted by the teacher gap")
    rlsd_clip_eps: float = opt(0.2, "RLSD: clip of the re-weighting factor")
    agg: str = opt("token-mean", "loss aggregation", choices=AGG_MODES)
    norm_by_std: bool = opt(True, "GRPO: divide by the group's reward std")
    lr: float = opt(5e-4, "AdamW learning rate for the LoRA weights")
    lora_rank: int = opt(8, "LoRA rank")
    lora_alpha: int = opt(16, "LoRA alpha")
    lora_targets: list[str] = opt(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], "modules that get LoRA"
    )
    epochs: int = opt(1, "passes over the round's rows")
    mini_batches: int = opt(4, "optimizer steps per epoch")
    micro_batch_tokens: int = opt(8192, "padded tokens per forward/backward (gradient accumulation)")
    max_grad_norm: float = opt(1.0, "gradient clipping")
    max_nonfinite_steps: int = opt(3, "consecutive non-finite steps before the run fails")
    seed: int = opt(0, "seed for init and shuffling")
    overwrite: bool = opt(False, "replace an existing adapter at --output", io=True)

    def validate(self) -> None:
        if self.lam < 0 or self.beta < 0:
            raise ConfigError(f"train: lam ({self.lam}) and beta ({self.beta}) must be >= 0")
        if self.lam > 0.1:
            log.warning(
                "train: lam %.3g > 0.1: distillation tends to dominate GRPO and degrade results", self.lam
            )
        if self.mini_batches < 1 or self.epochs < 1:
            raise ConfigError("train: epochs and mini_batches must be >= 1")


def run(cfg: TrainConfig) -> dict:
    from sdarflow.models import load_policy
    from sdarflow.models.policy import BASE_FILE, base_fingerprint, new_lora
    from sdarflow.train.trainer import RLHyper, jsonl_writer, make_samples, rl_update

    require("train", input=cfg.input, model=cfg.model, output=cfg.output)
    rows = storage.read_table(cfg.input, kind="rescored", schema=RESCORED_SCHEMA).to_pylist()
    torch.manual_seed(cfg.seed)
    policy = load_policy(cfg.model, local_artifact(cfg.adapter, "adapter"), trainable=True)
    model = policy.model
    if not cfg.adapter:
        model = new_lora(model, cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets)
    model.train()
    samples = make_samples(rows, cfg.norm_by_std)
    hyper_fields = {f.name for f in dataclasses.fields(RLHyper)}
    hp = RLHyper(**{k: v for k, v in cfg.to_dict().items() if k in hyper_fields})
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=cfg.lr, weight_decay=0.0
    )
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        history = rl_update(
            model,
            optimizer,
            samples,
            hp,
            policy.tokenizer.pad_token_id,
            on_step=jsonl_writer(out / "metrics.jsonl"),
        )
        model.save_pretrained(out)
        (out / BASE_FILE).write_text(json.dumps({"fingerprint": base_fingerprint(cfg.model)}))
        summary = summarize(history)
        (out / "train_summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
        storage.publish_dir(
            out,
            cfg.output,
            kind="adapter",
            overwrite=cfg.overwrite,
            config_hash=cfg.config_hash(),
            inputs=[*cfg.input, cfg.model] + ([cfg.adapter] if cfg.adapter else []),
            method=cfg.method,
            metrics=summary,
        )
    log.info(
        "train: %d samples, %d steps, method %s -> %s", len(samples), len(history), cfg.method, cfg.output
    )
    return {"uri": cfg.output, "steps": len(history), "metrics": summary}


def summarize(history: list[dict]) -> dict[str, float]:
    """Mean of each numeric metric over the steps, plus the count of skipped (non-finite) steps."""
    if not history:
        return {"train/steps": 0.0}
    keys = {
        k for h in history for k, v in h.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    out = {
        f"train/{k}" if "/" not in k else k: sum(h.get(k, 0.0) for h in history) / len(history) for k in keys
    }
    out["train/steps"] = float(len(history))
    out["train/skipped_steps"] = float(sum(h["skipped"] for h in history))
    return out
