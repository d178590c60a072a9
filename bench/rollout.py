"""Rollout throughput: generated tokens/s of the engines at several batch sizes (the same prompts and seeds), and
env steps/s of the whole batched multi-turn loop on ``textworld-cooking``."""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path

from bench.common import median_time, write_result
from sdarflow.envs import get_suite
from sdarflow.models import load_policy
from sdarflow.rollout.engine import HFEngine
from sdarflow.rollout.loop import SamplingParams, rollout
from sdarflow.rollout.prompt import build_messages, encode_prompt

DEMO_MODEL = Path("demo-output/base-model")


def _model() -> str:
    """The demo base model if `make demo` built one, else a smoke-size model built now (same architecture)."""
    if (DEMO_MODEL / "config.json").is_file():
        return str(DEMO_MODEL)
    from sdarflow.demo import PRESETS
    from sdarflow.train.warmstart import build_base_model

    return str(build_base_model(Path(tempfile.mkdtemp()) / "tiny", PRESETS["smoke"]["model"]))


def run(quick: bool = True) -> dict:
    model_path = _model()
    policy = load_policy(model_path)
    suite = get_suite("textworld-cooking")
    tasks = suite.tasks("train", 4)
    env = suite.make(tasks[0])
    reset = env.reset()
    env.close()
    prompt = encode_prompt(policy.tokenizer, build_messages(reset.instruction, [], reset.observation))
    engine = HFEngine(policy.model, policy.tokenizer, policy.eos_id, batch_size=256)
    batch_sizes = [1, 8, 32] if quick else [1, 8, 32, 128]
    gen = {}
    for bs in batch_sizes:
        samples: list = []

        def call(bs=bs, samples=samples) -> None:
            samples[:] = engine.generate([prompt] * bs, list(range(bs)), max_new_tokens=16, temperature=1.0)

        seconds = median_time(call, repeats=5)
        tokens = sum(len(s.token_ids) for s in samples)
        gen[bs] = {"tokens_per_s": tokens / seconds, "seconds": seconds, "tokens": tokens}
    loop = {}
    for group in [1, 4] if quick else [1, 4, 8]:
        stats: dict = {}

        def episode_batch(group=group, stats=stats) -> None:
            rows, _ = rollout(
                engine,
                suite,
                tasks,
                group,
                SamplingParams(max_turns=8, temperature=1.0),
                policy.tokenizer,
                run_id="bench",
                round_=0,
                policy_version="base",
            )
            stats["steps"] = len(rows)

        seconds = median_time(episode_batch, repeats=3)
        loop[len(tasks) * group] = {"env_steps_per_s": stats["steps"] / seconds, "seconds": seconds}
    base = gen[batch_sizes[0]]["tokens_per_s"]
    result = {
        "model": model_path,
        "engines": {"hf": {"generate": gen, "loop": loop}},
        "speedup": {f"hf_batch{bs}_vs_batch1": gen[bs]["tokens_per_s"] / base for bs in batch_sizes},
        "vllm": "available" if importlib.util.find_spec("vllm") else "not installed in this environment",
    }
    rows = [("engine batch", "tokens/s", "speedup vs batch 1")]
    rows += [
        (f"hf {bs}", f"{v['tokens_per_s']:.0f}", f"{v['tokens_per_s'] / base:.1f}x") for bs, v in gen.items()
    ]
    rows += [(f"loop {n} episodes", f"{v['env_steps_per_s']:.1f} env steps/s", "") for n, v in loop.items()]
    write_result("rollout", result, rows)
    return result
