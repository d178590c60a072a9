"""Rescoring throughput: packed batching (the default: rows packed into token budgets, block-diagonal attention)
against padded batching in arrival order (the obvious baseline), on a realistic mix of turn lengths; achieved
FLOP/s as a fraction of the measured ``torch.matmul`` peak (fp32, same threads)."""

from __future__ import annotations

import random

import torch

from bench.common import bench_model, forward_flops, matmul_peak_flops, median_time, write_result
from sdarflow.models.forward import make_batch, response_logprobs
from sdarflow.teacher.rescore import score


def turn_mix(n: int, seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    """Multi-turn agent rows: prompts grow with the history (80-900 tokens), short actions (4-48 tokens)."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(100, 32000) for _ in range(rng.randint(80, 900))] for _ in range(n)]
    responses = [[rng.randrange(100, 32000) for _ in range(rng.randint(4, 48))] for _ in range(n)]
    return prompts, responses


@torch.inference_mode()
def padded_in_order(model, prompts, responses, rows_per_batch: int) -> None:
    for i in range(0, len(prompts), rows_per_batch):
        batch = make_batch(prompts[i : i + rows_per_batch], responses[i : i + rows_per_batch], pad_id=0)
        response_logprobs(model, batch)


def run(quick: bool = True) -> dict:
    torch.manual_seed(0)
    model = bench_model(layers=2 if quick else 8)
    prompts, responses = turn_mix(48 if quick else 256)
    tokens = sum(len(p) + len(r) for p, r in zip(prompts, responses))
    mean_len = tokens / len(prompts)
    budget = 4096
    t_padded = median_time(lambda: padded_in_order(model, prompts, responses, rows_per_batch=8), repeats=5)
    t_packed = median_time(
        lambda: score(model, prompts, responses, 0, budget, batching="packed", pack_length=1024), repeats=5
    )
    t_sorted = median_time(lambda: score(model, prompts, responses, 0, budget, batching="padded"), repeats=5)
    peak = matmul_peak_flops(torch.float32)
    flops = forward_flops(model, tokens, int(mean_len))
    result = {
        "rows": len(prompts),
        "real_tokens": tokens,
        "tokens_per_s": {
            "padded_in_order": tokens / t_padded,
            "packed": tokens / t_packed,
            "padded_length_sorted": tokens / t_sorted,
        },
        "speedup": t_padded / t_packed,
        "speedup_sorted_padding": t_padded / t_sorted,
        "matmul_peak_flops_fp32": peak,
        "fraction_of_peak": flops / min(t_packed, t_sorted) / peak,
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
            ("fraction of matmul peak", f"{result['fraction_of_peak']:.2f}", ""),
        ],
    )
    return result
