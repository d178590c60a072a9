"""Supervised fine-tuning on (prompt, response) token pairs: the mean negative log-likelihood of the response
tokens (the action and its end-of-turn token). :func:`sft` is the standalone loop that builds the demo base model;
the RL trainer takes :func:`sft_pairs_from_rows` and :func:`sft_micro_step` for ``--mode sft`` and ``--sft-ratio``.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass

import torch

from sdarflow import progress
from sdarflow.algo import masked_mean, masked_mean_value
from sdarflow.errors import SdarflowError
from sdarflow.models.device import model_device
from sdarflow.models.forward import make_batch, response_logprobs, to_device

log = logging.getLogger(__name__)


class SFTTimeLimitExceeded(SdarflowError):
    """The warm start ran past its time limit: it fails rather than stop early, so the model never depends on the
    machine's speed."""


@dataclass
class SFTPair:
    prompt: list[int]
    response: list[int]


def _token_mean_nll(model, pairs: list[SFTPair], pad_id: int, device, with_entropy: bool):
    """(token-mean NLL of the responses, per-token entropy or None, response mask)."""
    batch = to_device(make_batch([p.prompt for p in pairs], [p.response for p in pairs], pad_id), device)
    logp, ent = response_logprobs(model, batch, with_entropy=with_entropy)
    return -masked_mean(logp, batch.mask), ent, batch.mask


def sft_pairs_from_rows(rows: list[dict]) -> list[SFTPair]:
    """Every turn of every solved episode (``success`` True) with a non-empty response, in input order."""
    return [
        SFTPair(list(r["prompt_token_ids"]), list(r["response_token_ids"]))
        for r in rows
        if r.get("success") and r["response_token_ids"]
    ]


def replayed_pairs(rows: list[dict], earlier: list[list[dict]]) -> list[SFTPair]:
    """Self-imitation of earlier successes (Oh et al., 2018): for each task ``rows`` (this round) played and solved
    no episode of, every turn of the solved episodes in the newest of the ``earlier`` datasets (oldest first) that
    solved it. Such a task gives GRPO no signal under a win reward (its group's advantages are all zero);
    replaying its last successes keeps one. Tasks this round did not play are not replayed."""
    unsolved = {r["task_id"] for r in rows} - {r["task_id"] for r in rows if r.get("success")}
    newest: dict[str, list[SFTPair]] = {}
    for dataset in earlier:
        by_task: dict[str, list[dict]] = {}
        for r in dataset:
            if r["task_id"] in unsolved:
                by_task.setdefault(r["task_id"], []).append(r)
        # a later dataset's successes replace an earlier one's, task by task
        newest.update(
            {t: pairs for t, task_rows in by_task.items() if (pairs := sft_pairs_from_rows(task_rows))}
        )
    return [pair for task in sorted(newest) for pair in newest[task]]


def sft_micro_step(
    model, pairs: list[SFTPair], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-mean NLL of one micro-batch (not yet scaled for accumulation) and its metrics."""
    loss, ent, mask = _token_mean_nll(model, pairs, pad_id, device, with_entropy=True)
    value = float(loss.detach())
    metrics = {"loss/total": value, "loss/sft": value, "actor/entropy": masked_mean_value(ent, mask)}
    return loss, metrics


STOP_WINDOW = 20  # steps whose mean loss --sft-stop-at-loss compares (one step's loss is too noisy)


def reached(history: list[dict], stop_at_loss: float, key: str = "loss") -> bool:
    """Whether the mean ``key`` of the last :data:`STOP_WINDOW` records is at or below ``stop_at_loss`` (never
    before there are that many)."""
    recent = [h[key] for h in history[-STOP_WINDOW:] if h.get(key) is not None]
    return len(recent) == STOP_WINDOW and sum(recent) / STOP_WINDOW <= stop_at_loss


def sft(
    model,
    pairs: list[SFTPair],
    pad_id: int,
    *,
    steps: int,
    batch_size: int = 16,
    lr: float = 3e-3,
    seed: int = 0,
    time_limit_s: float | None = None,
    stop_at_loss: float = 0.0,
) -> list[dict]:
    """``steps`` AdamW steps with linear warmup and cosine decay, every one of them unless ``stop_at_loss`` > 0:
    then it stops once the mean loss of the last :data:`STOP_WINDOW` steps is at or below it (an early-stopped
    warm start, less sharp for RL to explore from). The result depends on the seed alone. Past ``time_limit_s``
    (None or 0: no limit) it raises :class:`SFTTimeLimitExceeded`."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.98))
    from transformers import get_cosine_schedule_with_warmup  # lazy: a heavy import only the SFT needs

    # 5% linear warmup, then cosine decay to 0 over the remaining steps. Warmup starts at lr 0, so a run too short
    # for 5% to be a whole step (under 20 steps) has none: its first step trains.
    sched = get_cosine_schedule_with_warmup(opt, num_warmup_steps=steps // 20, num_training_steps=steps)
    model.train()
    history = []
    start = time.perf_counter()
    order: list[int] = []
    bar = progress.bar(range(steps), desc="sft", unit="step")
    for step in bar:
        if len(order) < batch_size:
            extra = list(range(len(pairs)))
            rng.shuffle(extra)
            order += extra
        idx, order = order[:batch_size], order[batch_size:]
        batch = [pairs[i] for i in idx]
        loss = _token_mean_nll(model, batch, pad_id, model_device(model), with_entropy=False)[0]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        history.append({"step": step + 1, "loss": loss.item()})
        bar.set_postfix(loss=f"{history[-1]['loss']:.3f}", refresh=False)
        if (step + 1) % 50 == 0:
            log.info(
                "sft step %d | loss %.4f | %.0f s", step + 1, history[-1]["loss"], time.perf_counter() - start
            )
        if stop_at_loss > 0 and reached(history, stop_at_loss):
            log.info("sft: stopped at step %d of %d: mean loss <= %g", step + 1, steps, stop_at_loss)
            break
        elapsed = time.perf_counter() - start
        if time_limit_s and elapsed > time_limit_s and step + 1 < steps:
            raise SFTTimeLimitExceeded(
                f"sft: {step + 1} of {steps} steps took {elapsed:.0f} s, over the time limit of {time_limit_s:.0f} s; "
                f"nothing was saved (a shorter run would be a different model); fix: raise the time limit "
                f"(--sft-time-limit, 0 = none) or lower --sft-steps"
            )
    model.eval()
    return history
