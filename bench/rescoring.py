"""Rescoring throughput: packed batching (the default: rows packed into token budgets, block-diagonal attention)
against padded batching in arrival order (the obvious baseline: 8 rows a batch within the stage's token budget)
and padded batching of length-sorted rows, on two length distributions:

- ``demo``: the turns of a real generated dataset (the demo model's round-0 trajectories,
  ``bench.common.demo_trajectories``), prompt and response lengths in the order the rescore stage reads them;
- ``agent``: a multi-turn agent under the SDAR reference's prompt (``agent_lengths``): prompts that grow with the
  history from 300-500 to at most 3000 tokens, ``<think>``/``<action>`` replies of 20-300 tokens.

Both run through the real-model testbed (SmolLM2-135M-Instruct, ``bench.common.testbed_model``; the Qwen2-shaped
bench model where its package is absent), token ids redrawn at random (what is timed depends on the lengths).

``speedup`` = baseline seconds / packed seconds. ``speedup_bound`` = the baseline's padded tokens / real tokens:
what skipping every pad gains at an equal speed per token (attention over a padded row grows with its square, so
the baseline can lose more than its share of pads). ``fraction_of_bound`` = speedup / speedup_bound.
``fraction_of_peak`` = the packed run's FLOP/s (``bench.common.forward_flops`` of the real rows, the LM head on the
response tokens) over the measured fp32 matmul peak. ``profile``: one more run of each batching under torch's
profiler, its self CPU seconds by operator.
"""

from __future__ import annotations

import math
import random
import time

import torch

from bench.common import (
    bench_model,
    demo_trajectories,
    forward_flops,
    matmul_peak_flops,
    testbed_model,
    write_result,
)
from sdarflow.models.forward import make_batch, response_logprobs
from sdarflow.stages.rescore import RescoreConfig
from sdarflow.teacher.rescore import score

ROWS_PER_BATCH = (
    8  # the baseline's batch: rows in arrival order, padded to the longest, within the token budget
)
TARGETS = {"fraction_of_bound": ">= 0.9 (both)", "fraction_of_peak": ">= 0.5 (agent)"}


def demo_lengths(rows: int) -> tuple[list[int], list[int]]:
    """Prompt and response lengths of the first ``rows`` turns of the demo's generated dataset."""
    table = demo_trajectories().slice(0, rows)
    return (
        [len(p) for p in table.column("prompt_token_ids").to_pylist()],
        [len(r) for r in table.column("response_token_ids").to_pylist()],
    )


def agent_lengths(rows: int, seed: int = 0) -> tuple[list[int], list[int]]:
    """Prompt and response lengths of a multi-turn agent under the SDAR reference's prompt (task, admissible
    actions and the history so far; replies ``<think>...</think><action>...</action>``), episode by episode as a
    generate stage writes them: an episode runs 4-30 turns (the reference allows 50); its first prompt is 300-500
    tokens and each turn adds 60-150 (the last observation and action) up to 3000; a reply is log-uniform in 20-300
    tokens."""
    rng = random.Random(seed)
    prompts: list[int] = []
    responses: list[int] = []
    while len(prompts) < rows:
        prompt = rng.randint(300, 500)
        for _ in range(rng.randint(4, 30)):
            prompts.append(min(prompt, 3000))
            responses.append(round(math.exp(rng.uniform(math.log(20), math.log(300)))))
            prompt += rng.randint(60, 150)
    return prompts[:rows], responses[:rows]


def arrival_batches(lengths: list[int], rows: int, max_tokens: int) -> list[list[int]]:
    """The baseline's batches: rows in arrival order, at most ``rows`` a batch and at most ``max_tokens`` padded
    tokens (the stage's budget, as the other batchings get)."""
    batches: list[list[int]] = []
    current: list[int] = []
    for i, n in enumerate(lengths):
        if current and (
            len(current) == rows or max(n, *(lengths[j] for j in current)) * (len(current) + 1) > max_tokens
        ):
            batches.append(current)
            current = []
        current.append(i)
    return [*batches, current] if current else batches


@torch.inference_mode()
def padded_in_order(model, prompts, responses, batches: list[list[int]]) -> None:
    for idx in batches:
        response_logprobs(model, make_batch([prompts[i] for i in idx], [responses[i] for i in idx], pad_id=0))


def _measure(model, prompt_lens: list[int], response_lens: list[int], passes: int, seed: int = 0) -> dict:
    """Seconds of each batching on the same rows, run in the order A B C (C B A ...) so a drift in this machine's
    speed cancels, with the figures above."""
    rng = random.Random(seed)
    vocab = model.config.vocab_size
    prompts = [[rng.randrange(100, vocab) for _ in range(n)] for n in prompt_lens]
    responses = [[rng.randrange(100, vocab) for _ in range(n)] for n in response_lens]
    stage = RescoreConfig()  # the stage's defaults: what users run
    budget, pack_length = stage.batch_tokens(torch.device("cpu")), stage.pack_length
    lengths = [p + r for p, r in zip(prompt_lens, response_lens)]
    baseline = arrival_batches(lengths, ROWS_PER_BATCH, budget)
    methods = {
        "padded_in_order": lambda: padded_in_order(model, prompts, responses, baseline),
        "packed": lambda: score(
            model, prompts, responses, 0, budget, batching="packed", pack_length=pack_length
        ),
        "padded_length_sorted": lambda: score(model, prompts, responses, 0, budget, batching="padded"),
    }
    score(model, prompts[:1], responses[:1], 0, budget)  # first-call costs (threads, allocator) untimed
    times: dict[str, list[float]] = {name: [] for name in methods}
    for p in range(passes):
        for name in methods if p % 2 == 0 else reversed(methods):
            t0 = time.perf_counter()
            methods[name]()
            times[name].append(time.perf_counter() - t0)
    seconds = {name: sum(t) / len(t) for name, t in times.items()}
    profiled = {name: _profile(fn) for name, fn in methods.items()}
    tokens = sum(lengths)
    padded_tokens = sum(max(lengths[i] for i in idx) * len(idx) for idx in baseline)
    speedup, bound = seconds["padded_in_order"] / seconds["packed"], padded_tokens / tokens
    flops = forward_flops(model, lengths, head_tokens=sum(response_lens))
    return {
        "rows": len(lengths),
        "row_tokens": {"mean": tokens / len(lengths), "min": min(lengths), "max": max(lengths)},
        "response_tokens_mean": sum(response_lens) / len(lengths),
        "real_tokens": tokens,
        "forward_flops": flops,
        "seconds": seconds,
        "tokens_per_s": {name: tokens / s for name, s in seconds.items()},
        "speedup": speedup,
        "speedup_bound": bound,
        "fraction_of_bound": speedup / bound,
        "speedup_sorted_padding": seconds["padded_in_order"] / seconds["padded_length_sorted"],
        "achieved_flops": flops / seconds["packed"],
        "profile": profiled,
        "settings": {"max_batch_tokens": budget, "pack_length": pack_length, "passes": passes},
    }


def _profile(fn, top: int = 5) -> dict:
    """One more run of ``fn`` under torch's profiler: its self CPU seconds in all and by operator (the ``top``
    slowest): where a batching's time goes, e.g. attention against the linear layers."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    ops = {e.key: e.self_cpu_time_total / 1e6 for e in prof.key_averages()}
    slowest = sorted(ops.items(), key=lambda kv: -kv[1])[:top]
    return {"seconds": round(sum(ops.values()), 3), "top_ops": {k: round(v, 3) for k, v in slowest}}


def run(quick: bool = True) -> dict:
    path = testbed_model()
    if path is None:
        torch.manual_seed(0)
        model, name = bench_model(layers=2 if quick else 8), "bench model (Qwen2-shaped, random weights)"
    else:
        from transformers import AutoModelForCausalLM

        model, name = (
            AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval(),
            "smollm2-135m-instruct",
        )
    peak = matmul_peak_flops(torch.float32)
    distributions = {
        "demo": _measure(model, *demo_lengths(96 if quick else 512), passes=2),
        "agent": _measure(model, *agent_lengths(32 if quick else 96), passes=2),
    }
    for d in distributions.values():
        d["fraction_of_peak"] = d["achieved_flops"] / peak
    result = {
        "model": name,
        "distributions": distributions,
        "baseline_rows_per_batch": ROWS_PER_BATCH,
        "matmul_peak_flops_fp32": peak,
        "targets": TARGETS,
    }
    rows = [
        (
            "distribution",
            "padded tok/s",
            "sorted tok/s",
            "packed tok/s",
            "speedup",
            "bound",
            "of bound",
            "of peak",
        )
    ]
    for label, d in distributions.items():
        t = d["tokens_per_s"]
        rows.append(
            (
                f"{label} ({d['rows']} rows, mean {d['row_tokens']['mean']:.0f} tokens)",
                f"{t['padded_in_order']:.0f}",
                f"{t['padded_length_sorted']:.0f}",
                f"{t['packed']:.0f}",
                f"{d['speedup']:.2f}x",
                f"{d['speedup_bound']:.2f}x",
                f"{d['fraction_of_bound']:.2f}",
                f"{d['fraction_of_peak']:.2f}",
            )
        )
    write_result("rescoring", result, rows, base=path)
    return result
