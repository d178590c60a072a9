"""The training loop. A run is a sequence of optimizer steps, RL or SFT (:mod:`sdarflow.train.schedule`); a step
takes its mini-batch of RL samples (rescored turn rows with their advantages, :mod:`sdarflow.train.samples`) or of
SFT pairs, splits this rank's share into token-budget micro-batches, backpropagates each one's loss (the
configured method's, :func:`sdarflow.algo.method_loss`, or the SFT loss) and lets the engine
(:mod:`sdarflow.train.engine`: torch or DeepSpeed) apply the step, on a LoRA adapter or the full model.

Micro-batch losses are scaled by their share of the mini-batch's tokens (sequences for ``seq-mean-*``), so gradient
accumulation never changes what the loss means, whichever engine runs it. A non-finite loss or gradient skips the
step; ``max_nonfinite_steps`` in a row fail the run. Step kinds, data order and learning rate are functions of the
step counters, so a run resumed from a checkpoint repeats nothing and skips nothing.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from functools import partial

import torch

from sdarflow import progress
from sdarflow.algo import Objective, aux_grad_share, broadcast_advantages, method_terms
from sdarflow.algo.objective import total_loss
from sdarflow.config import MAX_SEED, opt
from sdarflow.errors import SdarflowError
from sdarflow.models.forward import make_batch, response_logprobs, to_device, token_budget_batches
from sdarflow.train.engine import TrainEngine
from sdarflow.train.report import progress_line
from sdarflow.train.samples import RLSample, TokenAdvantages
from sdarflow.train.schedule import TrainState, WarmupConstant, mini_batch, step_kinds, total_steps
from sdarflow.train.sft import STOP_WINDOW, SFTPair, reached, sft_micro_step

log = logging.getLogger(__name__)

# Keys every metrics.jsonl line carries (null where a step has no such quantity, e.g. the gate on an SFT step).
REQUIRED_METRICS: tuple[str, ...] = (
    "loss/total",
    "loss/pg",
    "loss/aux",
    "actor/clipfrac",
    "actor/entropy",
    "sdar/gate_mean",
    "sdar/gate_active_ratio",
    "sdar/teacher_gap_mean",
)

LossFn = Callable[[list], tuple[torch.Tensor, dict[str, float]]]


class TrainingDiverged(SdarflowError):
    """Too many consecutive non-finite steps."""


class NoTrainingData(SdarflowError):
    """The input holds no rows the chosen mode can train on."""


@dataclass
class TrainLoop(Objective):
    """The trainer's settings: the loss's (:class:`~sdarflow.algo.Objective`) and how the loop steps. The train
    stage's config is a TrainLoop, so each default and help text is declared here once."""

    mode: str = opt(
        "rl",
        "rl: the --method objective (plus SFT steps at --sft-ratio); sft: warm start, NLL on successful rows only",
        choices=("rl", "sft"),
    )
    sft_ratio: float = opt(
        0.0, "SFT steps per RL step on the successful rows (0.25: one after every 4 RL steps); 0 = off", ge=0
    )
    sft_stop_at_loss: float = opt(
        0.0,
        f"mode sft: stop once the mean loss of the last {STOP_WINDOW} steps is at or below this (early-stopped warm "
        f"start); 0 = every step",
        ge=0,
    )
    epochs: int = opt(1, "passes over the round's rows", ge=1)
    mini_batches: int = opt(4, "optimizer steps per epoch", ge=1)
    max_steps: int = opt(0, "total optimizer steps, cycling epochs; 0 = epochs x mini_batches", ge=0)
    micro_batch_tokens: int = opt(8192, "padded tokens per forward/backward (gradient accumulation)", ge=1)
    max_grad_norm: float = opt(1.0, "gradient clipping (global L2 norm); 0 = off", ge=0)
    target_kl: float = opt(
        0.0,
        "stop the run before the first RL step whose mini-batch measures a KL to the rollout policy above this "
        "(actor/approx_kl, k3, before the update), without applying that step: PPO's early stop, 0.01-0.05 as in "
        "Stable-Baselines3; SFT steps are not checked; 0 = off, every step runs (the SDAR reference)",
        ge=0,
    )
    target_kl_window: int = opt(
        1,
        "RL steps whose approx_kl --target-kl compares as a mean: this step's and those of the applied steps "
        "before it in the run (a trailing mean, so it lags a growing KL); 1 = each mini-batch alone "
        "(Stable-Baselines3's rule); e.g. N = --mini-batches, one pass over the round's rows, so one small "
        "mini-batch's noisy estimate does not end the round",
        ge=1,
    )
    max_nonfinite_steps: int = opt(3, "consecutive non-finite steps before the run fails", ge=1)
    seed: int = opt(0, "seed for init and shuffling", ge=0, le=MAX_SEED)
    save_every: int = opt(50, "optimizer steps between checkpoints (with --checkpoint-dir)", ge=1)


@dataclass
class TrainData:
    samples: list[RLSample]
    sft_pairs: list[SFTPair]
    pad_id: int
    # The RL step these rows train at (the reference's global_steps: round + 1); RLSD's decay reads it.
    rl_step: int = 1
    # At least this many SFT steps per RL step (the format repair's cadence, a fraction so 1/3 lands on time).
    sft_floor: Fraction = Fraction(0)
    # A per-token term on the advantages (train --advantage; samples.TOKEN_ADVANTAGES), or None.
    token_advantages: TokenAdvantages | None = None


def train(
    engine: TrainEngine,
    data: TrainData,
    cfg: TrainLoop,
    schedule: WarmupConstant,
    *,
    state: TrainState | None = None,
    on_step: Callable[[dict], None] | None = None,
    on_checkpoint: Callable[[TrainState], None] | None = None,
) -> TrainState:
    """Run optimizer steps from ``state`` (a fresh run when None) until the run's total; return the final state.
    ``on_checkpoint`` is called every ``cfg.save_every`` steps."""
    state = state or TrainState()
    ratio = _sft_ratio(data, cfg)
    main_rows = data.sft_pairs if cfg.mode == "sft" else data.samples
    total = total_steps(cfg.mode, cfg.epochs, min(cfg.mini_batches, len(main_rows)), ratio, cfg.max_steps)
    kinds = itertools.islice(step_kinds(ratio, cfg.mode), state.step, None)
    main_rank = engine.rank == 0  # every rank computes the same records; one reports them
    # On a terminal a live bar; in a log the step lines below (every 10 s) are the progress.
    live = main_rank and progress.interactive()
    bar = progress.bar(
        total=total, initial=state.step, desc=f"train ({cfg.mode})", unit="step", disable=not live
    )
    ticker = progress.Ticker()
    while state.step < total:
        kind = next(kinds)
        record = _one_step(engine, data, cfg, state, kind, schedule.lr_at(state.step))
        if record is None:  # the policy left the trust region: the rest of the round's data is stale
            kl = state.kl_stop["approx_kl"]
            over = f" (the mean of up to {cfg.target_kl_window} RL steps)" if cfg.target_kl_window > 1 else ""
            log.info(
                "train: stopped before step %d of %d: KL %.4g to the rollout policy%s > --target-kl %g (that step "
                "was not applied)",
                state.step + 1, total, kl, over, cfg.target_kl,
            )  # fmt: skip
            break
        state.step += 1
        state.rl_steps += kind == "rl"
        state.sft_steps += kind == "sft"
        state.nonfinite_in_row = state.nonfinite_in_row + 1 if record["skipped"] else 0
        state.history.append(record)
        if on_step:
            on_step(record)
        bar.update(1)
        if main_rank and ticker(last=state.step == total):
            log.info(progress_line(record))
        if record["skipped"]:
            in_row = state.nonfinite_in_row
            log.warning(
                "step %d: non-finite loss or gradient; step skipped (%d in a row)", state.step, in_row
            )
            if in_row >= cfg.max_nonfinite_steps:
                raise TrainingDiverged(
                    f"{in_row} consecutive non-finite steps at step {state.step} (limit --max-nonfinite-steps "
                    f"{cfg.max_nonfinite_steps}); fix: lower the learning rate or check the input log-probs"
                )
        if on_checkpoint and cfg.save_every > 0 and state.step % cfg.save_every == 0:
            on_checkpoint(state)
        if (
            cfg.mode == "sft"
            and cfg.sft_stop_at_loss > 0
            and reached(state.history, cfg.sft_stop_at_loss, "loss/total")
        ):
            log.info(
                "train: stopped at step %d of %d: mean loss <= %g", state.step, total, cfg.sft_stop_at_loss
            )
            break
    bar.close()
    return state


def _sft_ratio(data: TrainData, cfg: TrainLoop) -> float | Fraction:
    """The SFT steps per RL step this run takes (``--sft-ratio``, at least the data's floor); NoTrainingData when
    the mode has nothing to train on."""
    if cfg.mode == "sft" and not data.sft_pairs:
        raise NoTrainingData(
            "mode sft: the input has no successful rows (success = True) with a response; "
            "fix: pass trajectories that contain solved episodes (e.g. expert walkthroughs)"
        )
    if cfg.mode == "rl" and not data.samples:
        raise NoTrainingData(
            "the input has no rows with a response to train on; fix: check the --input dataset"
        )
    ratio = max(Fraction(str(cfg.sft_ratio)), data.sft_floor) if data.sft_floor else cfg.sft_ratio
    if cfg.mode == "rl" and ratio > 0 and not data.sft_pairs:
        log.warning("sft_ratio %.3g: the input has no successful rows, so no SFT batches this run", ratio)
        return 0.0
    return ratio


def _one_step(
    engine: TrainEngine, data: TrainData, cfg: TrainLoop, state: TrainState, kind: str, lr: float
) -> dict | None:
    """One optimizer step of ``kind`` on the next mini-batch of its stream; returns the step's record, or None
    (gradient dropped, ``state.kl_stop`` set) for an RL step whose measured PPO KL is above ``cfg.target_kl``."""
    t0 = time.perf_counter()
    rows, done = (data.samples, state.rl_steps) if kind == "rl" else (data.sft_pairs, state.sft_steps)
    epoch, position, idx = mini_batch(len(rows), min(cfg.mini_batches, len(rows)), cfg.seed, done, kind)
    share: dict[str, float | None] = {}  # the gradient share, measured on the step's first micro-batch
    if kind == "rl":
        loss_fn = partial(
            micro_step,
            engine.forward_model,
            cfg=cfg,
            data=data,
            device=engine.device,
            share=share if engine.grad_params else None,
            share_params=engine.grad_params,
        )
    else:
        loss_fn = partial(sft_micro_step, engine.forward_model, pad_id=data.pad_id, device=engine.device)
    agg = cfg.agg if kind == "rl" else "token-mean"
    metrics, tokens = accumulate(engine, [rows[i] for i in idx], loss_fn, agg, cfg.micro_batch_tokens)
    if kind == "rl" and cfg.target_kl > 0:
        kl = window_kl(state.history, metrics["actor/approx_kl"], cfg.target_kl_window)
        if kl > cfg.target_kl:
            engine.zero_grad()
            state.kl_stop = {"step": state.step + 1, "approx_kl": kl}
            return None
    result = engine.step(lr)
    dt = time.perf_counter() - t0
    finite = result.applied and all(math.isfinite(v) for v in metrics.values())
    return {
        **dict.fromkeys(REQUIRED_METRICS),
        **metrics,
        **share,
        "step": state.step + 1,
        "kind": kind,
        "epoch": epoch,
        "position": position,
        "skipped": not finite,
        "grad_norm": result.grad_norm,
        "lr": lr,
        "tokens": tokens,
        "tokens_per_s": tokens / dt,
        "seconds": dt,
    }


def window_kl(history: list[dict], kl: float, window: int) -> float:
    """The mean of ``kl`` (this RL step's ``actor/approx_kl``) and the finite ones of the last ``window - 1``
    applied RL steps in ``history`` (fewer at the run's start)."""
    earlier = [r["actor/approx_kl"] for r in history if r["kind"] == "rl" and not r["skipped"]]
    kls = [*(earlier[-(window - 1) :] if window > 1 else []), kl]
    return sum(kls) / len(kls)


def extra_sft_step(
    engine: TrainEngine, data: TrainData, cfg: TrainLoop, state: TrainState, lr: float
) -> dict:
    """One SFT step outside the run's schedule (the format guard's remedy, :mod:`sdarflow.extensions.format_probe`):
    the next mini-batch of the SFT stream, counted in ``state.sft_steps`` (so the stream's later batches, and a
    resumed run, stay in order) but not in ``state.step``. Returns the step's record."""
    record = _one_step(engine, data, cfg, state, "sft", lr)
    state.sft_steps += 1
    return record


def accumulate(
    engine: TrainEngine, items: list, loss_fn: LossFn, agg: str, micro_batch_tokens: int
) -> tuple[dict[str, float], int]:
    """Backward over the token-budget micro-batches of one mini-batch (each loss scaled by :func:`_weight`);
    returns its metrics and response tokens."""
    total_tokens = sum(len(x.response) for x in items)
    mine = _rank_share(items, engine.rank, engine.world_size)
    lengths = [len(items[i].prompt) + len(items[i].response) for i, _ in mine]
    sums: dict[str, float] = {}
    for micro_idx in token_budget_batches(lengths, micro_batch_tokens):
        chosen = [mine[j] for j in micro_idx]
        micro = [items[i] for i, _ in chosen]
        counted = [items[i] for i, counts in chosen if counts]
        loss, metrics = loss_fn(micro)
        engine.backward(loss * _weight(micro, counted, items, agg))
        # Metrics average with the micro-batch's share of tokens (token-mean) or sequences, whatever the loss's
        # normaliser, so each is a mean over the mini-batch.
        share = _weight(micro, counted, items, "token-mean" if agg == "token-mean" else "seq-mean-token-mean")
        for k, v in metrics.items():
            sums[k] = sums.get(k, 0.0) + share * v
    return engine.all_reduce_sum(sums), total_tokens


def _rank_share(items: list, rank: int, world: int) -> list[tuple[int, bool]]:
    """(index, counts) of the items this rank computes: a length-balanced stride. A rank left without items
    runs the first one with weight 0, because every rank must take part in the gradient reduction."""
    order = sorted(range(len(items)), key=lambda i: len(items[i].prompt) + len(items[i].response))
    mine = order[rank::world]
    return [(i, True) for i in mine] if mine else [(order[0], False)]


def _weight(micro: list, counted: list, items: list, agg: str) -> float:
    """Factor on a micro-batch's loss so the accumulated gradient is that of the whole mini-batch's loss: the
    micro-batch's share of the mini-batch's tokens (token-mean) or sequences (seq-mean-*); for
    seq-mean-token-sum-norm (a sum over sequences divided by the padded width T), ``T_micro / T_mini``."""
    if not counted:
        return 0.0
    if agg == "token-mean":
        return sum(len(s.response) for s in counted) / max(1, sum(len(x.response) for x in items))
    if agg == "seq-mean-token-sum-norm":
        return max(len(s.response) for s in micro) / max(1, max(len(x.response) for x in items))
    return len(counted) / max(1, len(items))


def micro_step(
    model,
    samples: list[RLSample],
    cfg: TrainLoop,
    data: TrainData,
    device: torch.device | None = None,
    share: dict | None = None,
    share_params: list[torch.Tensor] = (),
) -> tuple[torch.Tensor, dict[str, float]]:
    """Loss and metrics of one micro-batch of ``data`` (not yet scaled for accumulation). An empty ``share`` is
    filled with this micro-batch's gradient share over ``share_params`` (:func:`~sdarflow.algo.aux_grad_share`):
    one step's first micro-batch measures it, for two extra backward passes."""
    batch = make_batch([s.prompt for s in samples], [s.response for s in samples], data.pad_id)
    device = device or batch.mask.device
    batch = to_device(batch, device)
    logp, ent = response_logprobs(model, batch, with_entropy=True)
    width = batch.targets.shape[1]
    old = _pad_right_aligned([s.old_logprobs for s in samples], width).to(device)
    teacher = _pad_right_aligned([s.teacher_logprobs for s in samples], width).to(device)
    ref = None
    if cfg.kl_coef or data.token_advantages:  # the stage checked that every sample has them
        ref = _pad_right_aligned([s.ref_logprobs for s in samples], width).to(device)
    adv = broadcast_advantages(torch.tensor([s.advantage for s in samples], device=device), batch.mask)
    if data.token_advantages:
        adv = data.token_advantages(adv, old, ref, batch.mask)
    terms, metrics = method_terms(
        logp,
        old,
        teacher,
        adv,
        batch.mask,
        cfg,
        ref_logprobs=ref if cfg.kl_coef else None,
        entropy=ent,
        step=data.rl_step,
    )
    if share is not None and not share:
        share.update(aux_grad_share(terms, list(share_params)))
    loss = total_loss(terms, metrics)
    if not torch.isfinite(loss):
        # A NaN in a constant input (old or teacher log-probs) can leave the gradient finite (min/max route it to
        # neither branch), and the step would go through. Make the gradient non-finite too, so every engine skips.
        loss = loss.detach() + float("nan") * logp.sum()
    for key in ("loss/pg", "loss/aux", "actor/clipfrac"):
        metrics.setdefault(key, 0.0)  # absent loss terms are 0
    return loss, metrics


def _pad_right_aligned(values: list[list[float]], width: int) -> torch.Tensor:
    out = torch.zeros((len(values), width), dtype=torch.float32)
    for i, v in enumerate(values):
        if v:
            out[i, width - len(v) :] = torch.tensor(v, dtype=torch.float32)
    return out
