"""Training step throughput (forward + backward of the RL loss on response tokens) as a fraction of the measured
matmul peak, and peak memory of chunked vs naive float32 log-prob computation at vocab 32k and 2k tokens."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from bench.common import bench_model, forward_flops, matmul_peak_flops, median_time, write_result
from sdarflow.algo import Objective, method_loss
from sdarflow.models.forward import make_batch, response_logprobs

_MEMORY_PROBE = r"""
import json, sys, torch
from sdarflow.algo import linear_token_logprobs
mode, n, v, hdim = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), 512
torch.manual_seed(0)
hidden = torch.randn(n, hdim, requires_grad=True)
weight = torch.randn(v, hdim, requires_grad=True)
labels = torch.randint(v, (n,))
def hwm_kb():  # this process's peak RSS; unlike ru_maxrss it is not inherited from a big parent at fork
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1])
before = hwm_kb()
if mode == "naive":  # what a plain implementation does: full float32 logits, log_softmax, gather
    lp = torch.log_softmax((hidden @ weight.T).float(), -1).gather(-1, labels[:, None]).squeeze(-1)
else:
    lp = linear_token_logprobs(hidden, weight, labels, chunk_size=256)
lp.sum().backward()
after = hwm_kb()
print(json.dumps({"extra_kb": after - before}))
"""


def _probe(mode: str, n: int, vocab: int) -> float:
    """Extra peak RSS (MB) of one log-prob forward+backward, in a fresh process so peaks don't mix."""
    # Large blocks through mmap: freed memory leaves RSS at once, so the RSS peak is the live-tensor peak.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    out = subprocess.run(
        [sys.executable, "-c", _MEMORY_PROBE, mode, str(n), str(vocab)],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])["extra_kb"] / 1024


def run(quick: bool = True) -> dict:
    torch.manual_seed(0)
    model = bench_model(layers=4 if quick else 8).train()
    batch_size, prompt_len, resp_len = (4, 384, 64) if quick else (8, 512, 128)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(100, 32000, (prompt_len,), generator=g).tolist() for _ in range(batch_size)]
    responses = [torch.randint(100, 32000, (resp_len,), generator=g).tolist() for _ in range(batch_size)]
    batch = make_batch(prompts, responses, pad_id=0)
    old = torch.full(batch.mask.shape, -5.0)

    def step() -> None:
        logp, _ = response_logprobs(model, batch)
        adv = torch.ones_like(old) * batch.mask
        loss, _ = method_loss(logp, old, old + 0.1, adv, batch.mask, Objective(method="sdar"))
        loss.backward()
        model.zero_grad(set_to_none=True)

    seconds = median_time(step, repeats=5)
    tokens = batch_size * (prompt_len + resp_len)
    # backward ~ 2x forward; the LM head runs on the response tokens only
    flops = 3 * forward_flops(model, [prompt_len + resp_len] * batch_size, batch_size * resp_len)
    peak = matmul_peak_flops(torch.float32)
    n_tok, vocab = 2048, 32000
    naive_mb, chunked_mb = _probe("naive", n_tok, vocab), _probe("chunked", n_tok, vocab)
    result = {
        "model_params_m": sum(p.numel() for p in model.parameters()) / 1e6,
        "batch": {"sequences": batch_size, "prompt_tokens": prompt_len, "response_tokens": resp_len},
        "seconds_per_step": seconds,
        "tokens_per_s": tokens / seconds,
        "achieved_flops": flops / seconds,
        "matmul_peak_flops_fp32": peak,
        "fraction_of_peak": flops / seconds / peak,
        "logprob_memory_mb": {"naive": naive_mb, "chunked": chunked_mb, "tokens": n_tok, "vocab": vocab},
        "chunked_over_naive_memory": chunked_mb / max(naive_mb, 1e-9),
        "targets": {"fraction_of_peak": ">= 0.5", "chunked_over_naive_memory": "<= 0.25"},
    }
    write_result(
        "train_step",
        result,
        [
            ("model params (M)", f"{result['model_params_m']:.1f}"),
            ("tokens/s", f"{result['tokens_per_s']:.0f}"),
            ("GFLOP/s achieved / matmul peak", f"{flops / seconds / 1e9:.1f} / {peak / 1e9:.1f}"),
            ("fraction of peak", f"{result['fraction_of_peak']:.2f}"),
            ("log-prob peak MB naive / chunked", f"{naive_mb:.0f} / {chunked_mb:.0f}"),
        ],
    )
    return result
