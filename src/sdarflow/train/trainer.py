"""The RL update: rescored turn rows -> GRPO advantages -> mini-batches of token-budget micro-batches -> the
configured method's loss (``sdarflow.algo.method_loss``) on a LoRA adapter (or the full model).

Micro-batch losses are scaled by their share of the mini-batch's tokens (sequences for ``seq-mean-*``), so gradient
accumulation never changes what the loss means. A non-finite loss or gradient skips the step; too many in a row
fail the run.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from sdarflow.algo import grpo_advantages, method_loss
from sdarflow.errors import SdarflowError
from sdarflow.models.forward import make_batch, response_logprobs, token_budget_batches

log = logging.getLogger(__name__)


class TrainingDiverged(SdarflowError):
    """Too many consecutive non-finite steps."""


@dataclass
class RLSample:
    prompt: list[int]
    response: list[int]
    old_logprobs: list[float]
    teacher_logprobs: list[float]
    advantage: float


@dataclass
class RLHyper:
    method: str = "sdar"
    lam: float = 0.01
    beta: float = 5.0
    clip_low: float = 0.2
    clip_high: float = 0.2
    rlsd_lam: float = 0.5
    rlsd_clip_eps: float = 0.2
    agg: str = "token-mean"
    epochs: int = 1
    mini_batches: int = 4
    micro_batch_tokens: int = 4096
    max_grad_norm: float = 1.0
    max_nonfinite_steps: int = 3
    seed: int = 0


def episode_advantages(rows: list[dict], norm_by_std: bool = True) -> dict[str, float]:
    """GRPO: one advantage per episode from its return, normalized within its group; keyed by traj_id."""
    episodes: dict[str, tuple[str, float]] = {}
    for r in rows:
        episodes.setdefault(r["traj_id"], (r["group_id"], float(r["episode_return"])))
    trajs = sorted(episodes)
    group_index = {g: i for i, g in enumerate(sorted({episodes[t][0] for t in trajs}))}
    rewards = torch.tensor([episodes[t][1] for t in trajs], dtype=torch.float32)
    groups = torch.tensor([group_index[episodes[t][0]] for t in trajs], dtype=torch.long)
    adv = grpo_advantages(rewards, groups, norm_by_std=norm_by_std)
    return dict(zip(trajs, adv.tolist(), strict=True))


def make_samples(rows: list[dict], norm_by_std: bool = True) -> list[RLSample]:
    adv = episode_advantages(rows, norm_by_std)
    return [
        RLSample(
            r["prompt_token_ids"],
            r["response_token_ids"],
            r["old_logprobs"],
            r["teacher_logprobs"],
            adv[r["traj_id"]],
        )
        for r in rows
        if r["response_token_ids"]
    ]


def _pad_right_aligned(values: list[list[float]], width: int) -> torch.Tensor:
    out = torch.zeros((len(values), width), dtype=torch.float32)
    for i, v in enumerate(values):
        if v:
            out[i, width - len(v) :] = torch.tensor(v, dtype=torch.float32)
    return out


def micro_step(
    model, samples: list[RLSample], hp: RLHyper, pad_id: int
) -> tuple[torch.Tensor, dict[str, float]]:
    """Loss and metrics of one micro-batch (not yet scaled for accumulation)."""
    batch = make_batch([s.prompt for s in samples], [s.response for s in samples], pad_id)
    logp, ent = response_logprobs(model, batch, with_entropy=True)
    width = batch.targets.shape[1]
    old = _pad_right_aligned([s.old_logprobs for s in samples], width)
    teacher = _pad_right_aligned([s.teacher_logprobs for s in samples], width)
    adv = torch.tensor([s.advantage for s in samples], dtype=torch.float32)[:, None] * batch.mask  # (B, R)
    loss, metrics = method_loss(
        hp.method,
        logprobs=logp,
        old_logprobs=old,
        teacher_logprobs=teacher,
        advantages=adv,
        mask=batch.mask,
        lam=hp.lam,
        beta=hp.beta,
        clip_low=hp.clip_low,
        clip_high=hp.clip_high,
        rlsd_lam=hp.rlsd_lam,
        rlsd_clip_eps=hp.rlsd_clip_eps,
        agg=hp.agg,
    )
    metrics = {k: float(v) for k, v in metrics.items()}
    metrics["actor/entropy"] = float((ent.detach() * batch.mask).sum() / batch.mask.sum().clamp_min(1))
    return loss, metrics


def _weight(samples: list[RLSample], total_tokens: int, total_seqs: int, agg: str) -> float:
    if agg == "token-mean":
        return sum(len(s.response) for s in samples) / total_tokens
    return len(samples) / total_seqs


def rl_update(
    model,
    optimizer: torch.optim.Optimizer,
    samples: list[RLSample],
    hp: RLHyper,
    pad_id: int,
    on_step: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Run ``epochs`` passes of ``mini_batches`` optimizer steps over ``samples``; return one metrics dict a step."""
    rng = random.Random(hp.seed)
    params = [p for p in model.parameters() if p.requires_grad]
    history: list[dict] = []
    nonfinite_in_row = 0
    n_steps = hp.epochs * hp.mini_batches
    bar = tqdm(total=n_steps, desc="train", unit="step", leave=False)
    for epoch in range(hp.epochs):
        order = list(range(len(samples)))
        rng.shuffle(order)
        for mb in range(hp.mini_batches):
            idx = order[mb :: hp.mini_batches]
            if not idx:
                continue
            t0 = time.perf_counter()
            mini = [samples[i] for i in idx]
            total_tokens = sum(len(s.response) for s in mini)
            agg_metrics: dict[str, float] = {}
            for micro_idx in token_budget_batches(
                [len(s.prompt) + len(s.response) for s in mini], hp.micro_batch_tokens
            ):
                micro = [mini[i] for i in micro_idx]
                w = _weight(micro, total_tokens, len(mini), hp.agg)
                loss, metrics = micro_step(model, micro, hp, pad_id)
                (loss * w).backward()
                for k, v in metrics.items():
                    agg_metrics[k] = agg_metrics.get(k, 0.0) + w * v
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, hp.max_grad_norm))
            step = len(history) + 1
            finite = math.isfinite(grad_norm) and all(math.isfinite(v) for v in agg_metrics.values())
            if finite:
                optimizer.step()
                nonfinite_in_row = 0
            else:
                nonfinite_in_row += 1
                log.warning(
                    "step %d: non-finite loss or gradient; step skipped (%d in a row)", step, nonfinite_in_row
                )
                if nonfinite_in_row >= hp.max_nonfinite_steps:
                    raise TrainingDiverged(
                        f"{nonfinite_in_row} consecutive non-finite steps at step {step}; "
                        f"fix: lower the learning rate or check the input log-probs"
                    )
            optimizer.zero_grad(set_to_none=True)
            dt = time.perf_counter() - t0
            record = {
                "step": step,
                "epoch": epoch,
                "skipped": not finite,
                "grad_norm": grad_norm,
                "lr": optimizer.param_groups[0]["lr"],
                "tokens_per_s": total_tokens / dt,
                "seconds": dt,
                **agg_metrics,
            }
            history.append(record)
            if on_step:
                on_step(record)
            bar.update(1)
            log.info(progress_line(record))
    bar.close()
    return history


def progress_line(r: dict) -> str:
    return (
        f"step {r['step']} | loss {r.get('loss/total', float('nan')):.4f} | pg {r.get('loss/pg', 0.0):.4f} | "
        f"gate {r.get('sdar/gate_mean', float('nan')):.3f} | gap {r.get('sdar/teacher_gap_mean', float('nan')):.3f} | "
        f"clip {r.get('actor/clipfrac', 0.0):.3f} | grad {r['grad_norm']:.3f} | {r['seconds']:.2f} s/it"
    )


def jsonl_writer(path: Path) -> Callable[[dict], None]:
    """Append one JSON line per step, flushed, so a watcher (or a crash) sees every finished step."""
    path.parent.mkdir(parents=True, exist_ok=True)

    def write(record: dict) -> None:
        with path.open("a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")

    return write
