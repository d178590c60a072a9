"""Rollout throughput on the demo's trained model (``bench.common.demo_model``).

``engines``: plain batched generation of fixed-length responses (min = max new tokens, so every engine and batch
size generates the same tokens per prompt) on the same real first-turn prompts and seeds, at several batch sizes:
the ceiling the rollout loop can reach; vLLM beside hf on the same prompts when it is importable.

``loop``: the generate stage's batched multi-turn loop on real ``textworld-cooking`` games at the demo's size
(tasks x group, the stage's own settings), recording every engine call; then the same calls (prompts, seeds,
lengths) replayed back to back through the engine, which generates the same tokens without any env.
``loop_efficiency = loop tokens/s / replay tokens/s`` (the faster replay of the two env hosts): what the loop
loses to env steps, prompt building and parsing between engine calls. Both env hosts are measured (``--envs local``, and ``process``: envs in a worker, two
lanes of episodes taking turns); the judged one is what ``--envs auto`` picks for the hf engine on the CPU.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import time

from bench.common import demo_model, median_time, write_result
from sdarflow.envs import get_suite
from sdarflow.pipeline_config import PipelineConfig, stage_config
from sdarflow.rollout.engine import load_engine
from sdarflow.rollout.envhost import in_worker
from sdarflow.rollout.hf_engine import HFEngine
from sdarflow.rollout.loop import run_rollout
from sdarflow.rollout.prompt import build_messages, encode_prompt
from sdarflow.sizes import SIZES
from sdarflow.stages.generate import rollout_params

TARGET = 0.8
FIXED_TOKENS = 16


class _Recording:
    """An engine that records each ``generate`` call it forwards (for the replay)."""

    def __init__(self, engine) -> None:
        self.engine, self.calls = engine, []

    def __getattr__(self, name: str):
        return getattr(self.engine, name)

    def generate(self, prompts, seeds, **kwargs):
        self.calls.append((prompts, seeds, kwargs))
        return self.engine.generate(prompts, seeds, **kwargs)


def _config(model: str):
    settings = {"storage": "unused", "base_model": model, **SIZES["demo"]["pipeline"]}
    return stage_config(PipelineConfig.from_dict(settings), "generate", 0)


def _first_prompts(suite, tasks, tokenizer) -> list[list[int]]:
    prompts = []
    for task in tasks:
        env = suite.make(task)
        reset = env.reset()
        env.close()
        prompts.append(encode_prompt(tokenizer, build_messages(reset.instruction, [], reset.observation)))
    return prompts


def _fixed_length(engine, prompts, batch_sizes) -> dict:
    out = {}
    for bs in batch_sizes:
        batch = [prompts[i % len(prompts)] for i in range(bs)]

        def call(batch=batch, bs=bs) -> None:
            engine.generate(
                batch,
                list(range(bs)),
                max_new_tokens=FIXED_TOKENS,
                min_new_tokens=FIXED_TOKENS,
                temperature=1.0,
            )

        seconds = median_time(call, repeats=3)
        out[bs] = {"tokens_per_s": bs * FIXED_TOKENS / seconds, "seconds": seconds}
    return out


def _loop(engine, cfg, suite, envs: str) -> dict:
    recording = _Recording(engine)
    tasks = suite.tasks(cfg.split, cfg.tasks, start=cfg.first_task)
    result = run_rollout(
        recording,
        suite,
        tasks,
        cfg.group_size,
        rollout_params(dataclasses.replace(cfg, envs=envs), suite, engine),
        engine.tokenizer,
        run_id="bench",
        round_=0,
        policy_version="base",
    )
    tokens = sum(len(r["response_token_ids"]) for r in result.rows)
    t0 = time.perf_counter()
    replayed = sum(len(s.token_ids) for p, s_, kw in recording.calls for s in engine.generate(p, s_, **kw))
    replay_s = time.perf_counter() - t0
    assert replayed == tokens, "the replay must generate the loop's tokens (same prompts, seeds and batches)"
    loop_tps, replay_tps = tokens / result.stats.seconds, tokens / replay_s
    return recording.calls, {
        "episodes": len(result.episodes),
        "turns": len(recording.calls),
        "tokens": tokens,
        "loop_seconds": result.stats.seconds,
        "loop_engine_seconds": result.stats.engine_seconds,
        "loop_env_seconds": result.stats.env_seconds,
        "replay_seconds": replay_s,
        "loop_tokens_per_s": loop_tps,
        "replay_tokens_per_s": replay_tps,
        "loop_efficiency": loop_tps / replay_tps,
    }


def run(quick: bool = True) -> dict:
    model = demo_model()
    cfg = _config(model)
    suite = get_suite(cfg.env)
    engines = {"hf": load_engine("hf", model, batch_size=cfg.batch_size, device="cpu")}
    vllm = importlib.util.find_spec("vllm") is not None
    if vllm:
        engines["vllm"] = load_engine("vllm", model, batch_size=cfg.batch_size, device="cpu")
    prompts = _first_prompts(suite, suite.tasks(cfg.split, cfg.tasks), engines["hf"].tokenizer)
    batch_sizes = [1, 8, 64] if quick else [1, 8, 64, 256]
    fixed = {name: _fixed_length(e, prompts, batch_sizes) for name, e in engines.items()}
    auto = "process" if in_worker(cfg.envs, "cpu") else "local"  # what --envs auto picks here (hf on the CPU)
    recorded = {envs: _loop(engines["hf"], cfg, suite, envs) for envs in ("local", "process")}
    loops = {envs: lp for envs, (_, lp) in recorded.items()}
    # One ceiling for both hosts: the faster replay (the worker's lanes replay as half batches)
    ceiling = max(lp["replay_tokens_per_s"] for lp in loops.values())
    for lp in loops.values():
        lp["loop_efficiency"] = lp["loop_tokens_per_s"] / ceiling
    loop = loops[auto]
    shared = shared_prompts(engines["hf"], recorded[auto][0])
    for e in engines.values():
        e.close()
    result = {
        "model": model,
        "fixed_length_tokens": FIXED_TOKENS,
        "engines": fixed,
        "vllm": "measured"
        if vllm
        else "not installed in this environment (.venv-vllm has it: make test-vllm)",
        "loop": loop,
        "loop_envs": auto,
        "loop_by_envs": loops,
        "loop_efficiency": loop["loop_efficiency"],
        "shared_prompts": shared,
        "target": f"loop_efficiency >= {TARGET}",
    }
    rows = [("engine, batch", f"tokens/s ({FIXED_TOKENS} tokens per prompt)")]
    rows += [(f"{name} {bs}", f"{v['tokens_per_s']:.0f}") for name, f in fixed.items() for bs, v in f.items()]
    for envs, lp in loops.items():
        rows += [
            (f"loop, envs {envs}, {lp['episodes']} episodes", f"{lp['loop_tokens_per_s']:.0f}"),
            ("  its engine calls replayed", f"{lp['replay_tokens_per_s']:.0f}"),
            ("  engine / env wait / loop (s)", f"{lp['loop_engine_seconds']:.1f} / {lp['loop_env_seconds']:.1f} / "
             f"{lp['loop_seconds']:.1f}"),
            ("  loop_efficiency", f"{lp['loop_efficiency']:.2f}"),
        ]  # fmt: skip
    rows += [
        (
            f"loop_efficiency (envs {auto}, the auto choice here)",
            f"{loop['loop_efficiency']:.2f} (target >= {TARGET})",
        )
    ]
    rows += [
        (
            "hf, each distinct prompt run once / every row its own (the loop's calls)",
            f"{shared['shared_over_own']:.2f}x, same samples: {shared['same_samples']}",
        )
    ]
    write_result("rollout", result, rows, base=model)
    return result


def shared_prompts(engine: HFEngine, calls: list) -> dict:
    """The loop's engine calls replayed by the hf engine as it runs (each distinct prompt of a call once, its KV
    cache copied to the rows that repeat it) and with every row running its own prompt, alternated."""
    own = HFEngine(engine.model, engine.tokenizer, engine.eos_id, engine.batch_size, share_prompts=False)
    times: dict[str, list[float]] = {"shared": [], "own": []}
    samples = {}
    for name, e in (("own", own), ("shared", engine), ("shared", engine), ("own", own)):
        t0 = time.perf_counter()
        samples[name] = [s.token_ids for p, seeds, kw in calls for s in e.generate(p, seeds, **kw)]
        times[name].append(time.perf_counter() - t0)
    seconds = {k: sum(v) / len(v) for k, v in times.items()}
    return {
        "calls": len(calls),
        "rows": sum(len(p) for p, _, _ in calls),
        "distinct_prompts": sum(len({tuple(x) for x in p}) for p, _, _ in calls),
        "seconds": seconds,
        "shared_over_own": seconds["own"] / seconds["shared"],
        "same_samples": samples["own"] == samples["shared"],
    }
