"""``make gpu-check``: on a machine with an NVIDIA GPU, one round of every stage on a model sized for the GPU, each
stage checked to have run on CUDA, in at most 8 minutes. Writes ``bench/results/gpu_check.json``: per-stage
seconds, vLLM vs hf generation tokens/s on the same prompts, train tokens/s and model FLOP utilization.

The stages run as the pipeline runs them (``pipeline_config.stage_config``): generate and evaluate on vLLM with
the adapter (on the hf engine, on the GPU, where vLLM is not installed: the result names the engine), rescore on
the GPU (float32, packed batches), train with DeepSpeed in bf16. The model is the demo's tokenizer with a wider,
deeper random-init Qwen2 (``--hidden``, ``--layers``): its success rate is meaningless, its throughput is the
point. A smoke base model already built in ``--work/tiny`` is used as it is (a machine without TextWorld cannot
build one). ``--allow-cpu`` runs the same path on the CPU at the smallest sizes (hf engine,
torch training); the tests use it so the script cannot rot where no GPU is.

    python -m bench.gpu_check [--hidden 1024 --layers 16] [--work DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

LIMIT_S = 8 * 60
# Dense bf16 tensor-core peak by device name (vendor data sheets, no sparsity); MFU is also given against the
# measured matmul peak, which needs no table.
PEAK_BF16_FLOPS = {
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "L4": 121e12,
    "A10": 125e12,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=1024, help="hidden size of the GPU-sized model")
    parser.add_argument("--layers", type=int, default=16, help="decoder layers of the GPU-sized model")
    parser.add_argument("--tasks", type=int, default=16, help="tool-use tasks generated (x 4 samples)")
    parser.add_argument("--work", help="working folder (default: a temporary one, removed at the end)")
    parser.add_argument("--out", help="result file (default on a GPU: bench/results/gpu_check.json)")
    parser.add_argument(
        "--allow-cpu",
        action="store_true",
        help="run on the CPU when there is no GPU (smallest sizes; for tests)",
    )
    args = parser.parse_args(argv)
    if args.allow_cpu and not args.out:
        parser.error("--allow-cpu needs --out: a CPU run must not replace the committed GPU result")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import torch

    on_gpu = torch.cuda.is_available()
    if not on_gpu and not args.allow_cpu:
        print(
            "error: gpu-check needs an NVIDIA GPU, and torch sees none; fix: run `make gpu-check` on a GPU machine "
            "(driver >= 580, sdarflow[gpu] installed)",
            file=sys.stderr,
        )
        return 2
    work = Path(args.work or tempfile.mkdtemp(prefix="sdarflow-gpu-check-"))
    try:
        result = run(work, on_gpu, args)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    from bench.common import RESULTS
    from sdarflow.provenance import provenance

    made_by = provenance()  # the model is random-init at the shape result["model"] gives: no base to name
    path = Path(args.out) if args.out else RESULTS / "gpu_check.json"
    result = {"benchmark": "gpu_check", "machine": made_by.pop("machine"), "provenance": made_by, **result}
    path.write_text(json.dumps(result, indent=2) + "\n")
    for stage, s in result["seconds"].items():
        where = {True: "cuda", False: "NOT ON CUDA", None: "no model"}[result["on_cuda"][stage]]
        print(f"{stage:>24} {s:8.1f} s  {where}")
    print(f"{'generate tokens/s':>24} {result['generate_tokens_per_s']}")
    print(f"{'train tokens/s':>24} {result['train_tokens_per_s']:.0f}  MFU {result['mfu']}")
    failed = [stage for stage, ok in result["on_cuda"].items() if ok is False] if on_gpu else []
    if failed or (on_gpu and result["total_seconds"] > LIMIT_S):
        print(
            f"error: gpu-check: stages off the GPU {failed or 'none'}, {result['total_seconds']:.0f} s of "
            f"{LIMIT_S} s; see {path}",
            file=sys.stderr,
        )
        return 1
    return 0


def run(work: Path, on_gpu: bool, args) -> dict:
    import torch

    from sdarflow import plan
    from sdarflow.pipeline_config import PipelineConfig, stage_config
    from sdarflow.rollout.engine import pick_engine
    from sdarflow.rounds import run_round
    from sdarflow.sizes import SIZES
    from sdarflow.stages import evaluate, generate
    from sdarflow.train.warmstart import SEED_SKILLS, build_base_model, is_built

    device = "cuda" if on_gpu else "cpu"
    seconds: dict[str, float] = {}
    on_cuda: dict[str, bool | None] = {}

    @contextlib.contextmanager
    def cuda_watch(stage: str):
        before = 0
        if on_gpu:
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        yield
        # an in-process stage allocates CUDA memory beyond what was held before it; vLLM's workers are other
        # processes, checked by engine
        on_cuda[stage] = on_gpu and torch.cuda.max_memory_allocated() > before

    def timed(stage: str, fn, *a, **kw):
        with cuda_watch(stage):
            t0 = time.perf_counter()
            out = fn(*a, **kw)
            seconds[stage] = round(time.perf_counter() - t0, 2)
        return out

    prebuilt = is_built(work / "tiny", SIZES["smoke"]["model"])
    tiny = timed("build-model", build_base_model, work / "tiny", SIZES["smoke"]["model"], device=device)
    if prebuilt:
        on_cuda["build-model"] = None  # found up to date: nothing ran
    hidden, layers = (args.hidden, args.layers) if on_gpu else (128, 2)
    model = sized_model(tiny, work / "model", hidden, layers)
    params = n_params(model)
    engine = pick_engine("auto", torch.device(device))
    if on_gpu and engine == "hf":
        logging.getLogger(__name__).warning("vLLM is not installed: generate and evaluate run the hf engine")
    pc = PipelineConfig(
        storage=str(work / "store"),
        base_model=str(model),
        run_id="gpu-check",
        seed_skills=str(tiny / SEED_SKILLS),
        env="tool-use",
        tasks=args.tasks if on_gpu else 2,
        group_size=4 if on_gpu else 2,
        max_turns=4 if on_gpu else 2,
        eval_tasks=args.tasks if on_gpu else 1,
        eval_samples=4 if on_gpu else 2,
        stage_settings={
            "generate": {"engine": engine, "device": device},
            # a random-init model: its teacher is near uniform and the seed skills are TextWorld's, so the
            # guards that protect training runs from such a teacher are off for this throughput check
            "rescore": {"device": device, "allow_general_only": True, "allow_degenerate_teacher": True},
            "train": {"engine": "deepspeed" if on_gpu else "torch", "mini_batches": 2 if on_gpu else 1},
            "evaluate": {"engine": engine, "device": device},
        },
    )
    # a LoRA to generate and evaluate with: one train step on the first round's own rollouts
    rnd = run_round(pc, 0, watch=cuda_watch)
    seconds.update({stage: round(t, 2) for stage, t in rnd.seconds.items()})
    gen, tr = rnd.generate, rnd.train
    leave_process_group()  # the in-process DeepSpeed run's group and env must not leak into vLLM's start
    gen2 = timed("generate-with-adapter", generate.run, stage_config(pc, "generate", 1, adapter=tr["uri"]))
    ev = timed("evaluate", evaluate.run, stage_config(pc, "evaluate", 1, adapter=tr["uri"]))
    on_cuda["extract-skills"] = None  # rule-based: no model, nothing to place
    if engine == "vllm":
        for stage in ("generate", "generate-with-adapter", "evaluate"):
            on_cuda[stage] = on_gpu  # vLLM refuses to start on a GPU machine without CUDA
    throughput = engine_throughput(model, gen2["uri"], device, on_gpu, engine)
    train_tps = float(tr["metrics"]["train/tokens_per_s"])
    # the round's own env: its turns are what this machine's rollouts wait on (and TextWorld may not be installed)
    constants = timed("plan-calibrate", plan.calibrate, str(model), env=pc.env, device=device)
    if "vllm" in throughput:  # the stages generate with vLLM on a GPU; calibrate times the hf engine
        speedup = throughput["vllm"] / throughput["hf"]
        constants = dataclasses.replace(
            constants,
            prefill_flops=constants.prefill_flops * speedup,
            decode_flops=constants.decode_flops * speedup,
            source=f"{constants.source}; generation scaled by vLLM/hf {speedup:.1f}x",
        )
    return {
        "device": torch.cuda.get_device_name(0) if on_gpu else "cpu",
        "model": {"hidden": hidden, "layers": layers, "parameters": params},
        "generate_engine": engine,
        "seconds": seconds,
        "total_seconds": round(sum(seconds.values()) + throughput.pop("seconds"), 1),
        "limit_seconds": LIMIT_S,
        "on_cuda": on_cuda,
        "generate_tokens_per_s": throughput,
        "train_tokens_per_s": train_tps,
        "mfu": mfu(params, train_tps, on_gpu),
        "eval_pass@1": ev["metrics"].get("test/pass@1"),
        "rollout_success": gen["metrics"]["rollout/success"],
        "plan_constants": dataclasses.asdict(constants),  # sdarflow plan --constants gpu_check.json
    }


def leave_process_group() -> None:
    """Undo what a single-process DeepSpeed run set up (``train.launch.ensure_process_group_env``)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(key, None)


def sized_model(tiny: Path, out: Path, hidden: int, layers: int) -> Path:
    """The tiny model's tokenizer with a random-init Qwen2 of ``hidden`` x ``layers`` (head dim 64)."""
    from sdarflow.models import load_tokenizer
    from sdarflow.models.tiny import TinyShape, build_model, save

    tokenizer = load_tokenizer(str(tiny))
    heads = max(1, hidden // 64)
    shape = TinyShape(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=4 * hidden, num_layers=layers,
        num_heads=heads, num_kv_heads=heads, max_positions=2048,
    )  # fmt: skip
    return save(build_model(tokenizer, shape, seed=0), tokenizer, out)


def n_params(model: Path) -> int:
    from safetensors import safe_open

    total = 0
    for weights in model.glob("*.safetensors"):
        with safe_open(str(weights), "pt") as f:
            total += sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())
    return total


def engine_throughput(model: Path, trajectories: str, device: str, on_gpu: bool, stages_engine: str) -> dict:
    """Generated tokens/s of the hf engine and (where the stages ran it) vLLM on the same prompts, seeds and
    lengths."""
    from sdarflow import storage
    from sdarflow.rollout.engine import load_engine
    from sdarflow.schema import TRAJECTORY_SCHEMA

    rows = storage.read_table(trajectories, kind="trajectories", schema=TRAJECTORY_SCHEMA)
    prompts = [list(p) for p in rows.column("prompt_token_ids").to_pylist()][: 256 if on_gpu else 4]
    out: dict = {"seconds": 0.0}
    for name in sorted({"hf", stages_engine}):
        engine = load_engine(name, str(model), batch_size=64, device=device)
        try:
            engine.generate(
                prompts[:2], [0, 1], max_new_tokens=4, temperature=1.0
            )  # warm up (vLLM starts here)
            t0 = time.perf_counter()
            samples = engine.generate(prompts, list(range(len(prompts))), max_new_tokens=64, temperature=1.0)
            dt = time.perf_counter() - t0
        finally:
            engine.close()
        out[name] = sum(len(s.token_ids) for s in samples) / dt
        out["seconds"] += dt
    return out


def mfu(params: int, tokens_per_s: float, on_gpu: bool) -> dict | None:
    """Model FLOP utilization of training: 6 x parameters FLOPs per token (forward 2N, backward 4N; a LoRA's
    frozen weights skip their weight gradients, so this overstates the work by up to 2N) over the peak."""
    if not on_gpu or not tokens_per_s:
        return None
    import torch

    achieved = 6 * params * tokens_per_s
    n = 8192
    a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    measured = 10 * 2 * n**3 / (time.perf_counter() - t0)
    name = torch.cuda.get_device_name(0)
    spec = next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)
    return {
        "achieved_flops": achieved,
        "vs_measured_bf16_matmul": achieved / measured,
        "vs_datasheet_bf16": achieved / spec if spec else None,
    }


if __name__ == "__main__":
    os.environ.setdefault("TQDM_DISABLE", "1")
    sys.exit(main())
