"""Rescoring throughput: packed batching (the default: rows packed into token budgets, block-diagonal attention)
against padded batching in arrival order (the obvious baseline), on the turn lengths of a real generated dataset
(the demo model's round-0 trajectories, ``bench.common.demo_trajectories``: prompt and response lengths in the
order the rescore stage reads them) run through a Qwen2-shaped model big enough that compute dominates; the
forward FLOPs, and the achieved FLOP/s as a fraction of the measured ``torch.matmul`` peak (fp32, same threads)."""

from __future__ import annotations

import random

import torch

from bench.common import (
    bench_model,
    demo_trajectories,
    forward_flops,
    matmul_peak_flops,
    median_time,
    write_result,
)
from sdarflow.models.forward import make_batch, response_logprobs
from sdarflow.stages.rescore import RescoreConfig
from sdarflow.teacher.rescore import score


def real_turns(rows: int, vocab: int, seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    """The first ``rows`` turns of the demo's generated dataset, their token ids redrawn in ``vocab`` (the bench
    model's; what is timed depends on the lengths, not the ids)."""
    table = demo_trajectories().slice(0, rows)
    rng = random.Random(seed)

    def redraw(column: str) -> list[list[int]]:
        return [[rng.randrange(100, vocab) for _ in ids] for ids in table.column(column).to_pylist()]

    return redraw("prompt_token_ids"), redraw("response_token_ids")


ROWS_PER_BATCH = 8


@torch.inference_mode()
def padded_in_order(model, prompts, responses, rows_per_batch: int) -> None:
    for i in range(0, len(prompts), rows_per_batch):
        batch = make_batch(prompts[i : i + rows_per_batch], responses[i : i + rows_per_batch], pad_id=0)
        response_logprobs(model, batch)


def run(quick: bool = True) -> dict:
    torch.manual_seed(0)
    model = bench_model(layers=2 if quick else 8)
    prompts, responses = real_turns(96 if quick else 512, model.config.vocab_size)
    tokens = sum(len(p) + len(r) for p, r in zip(prompts, responses))
    mean_len = tokens / len(prompts)
    stage = RescoreConfig()  # the stage's defaults: what users run
    budget, pack_length = stage.batch_tokens(torch.device("cpu")), stage.pack_length
    t_padded = median_time(lambda: padded_in_order(model, prompts, responses, ROWS_PER_BATCH), repeats=5)
    t_packed = median_time(
        lambda: score(model, prompts, responses, 0, budget, batching="packed", pack_length=pack_length),
        repeats=5,
    )
    t_sorted = median_time(lambda: score(model, prompts, responses, 0, budget, batching="padded"), repeats=5)
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]
    # No batching that skips padding can beat the baseline by more than its padded/real token ratio.
    padded_tokens = sum(
        max(lengths[i : i + ROWS_PER_BATCH]) * len(lengths[i : i + ROWS_PER_BATCH])
        for i in range(0, len(lengths), ROWS_PER_BATCH)
    )
    peak = matmul_peak_flops(torch.float32)
    flops = forward_flops(model, tokens, int(mean_len))
    result = {
        "rows": len(prompts),
        "lengths": "the demo model's round-0 trajectories (real turns, dataset order)",
        "mean_row_tokens": mean_len,
        "real_tokens": tokens,
        "forward_flops": flops,
        "tokens_per_s": {
            "padded_in_order": tokens / t_padded,
            "packed": tokens / t_packed,
            "padded_length_sorted": tokens / t_sorted,
        },
        "speedup": t_padded / t_packed,
        "speedup_bound": padded_tokens / tokens,
        "settings": {
            "max_batch_tokens": budget,
            "pack_length": pack_length,
            "baseline_rows_per_batch": ROWS_PER_BATCH,
        },
        "speedup_sorted_padding": t_padded / t_sorted,
        "matmul_peak_flops_fp32": peak,
        "fraction_of_peak": flops / t_packed / peak,  # the default batching
        "targets": {"speedup": ">= 1.5", "fraction_of_peak": ">= 0.5"},
    }
    write_result(
        "rescoring",
        result,
        [
            ("batching", "tokens/s", "speedup"),
            ("padded, arrival order", f"{tokens / t_padded:.0f}", "1.00x"),
            ("padded, length-sorted", f"{tokens / t_sorted:.0f}", f"{t_padded / t_sorted:.2f}x"),
            ("packed", f"{tokens / t_packed:.0f}", f"{t_padded / t_packed:.2f}x"),
            ("bound: baseline padded / real tokens", "", f"{padded_tokens / tokens:.2f}x"),
            ("fraction of matmul peak", f"{result['fraction_of_peak']:.2f}", ""),
        ],
    )
    return result
