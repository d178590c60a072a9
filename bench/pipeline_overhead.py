"""Pipeline overhead: one round of the training DAG through the KFP local runner (a Python process per task, as on
a cluster a pod per task) against the same stages called directly in one process, on the same model, settings
and seeds. The difference is what each task pays before and after its work: the interpreter, imports (torch,
transformers, peft, kfp), and the runner's bookkeeping. Sizes are the demo's (``--quick`` included): what a
user's round costs, not a smoke run where start-up is all there is. Two rounds each, in the order direct, KFP, KFP,
direct; the means are compared."""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from bench.common import demo_model, demo_round, demo_settings, write_result


def _kfp_local(settings: dict, pipeline_root: str) -> tuple[float, int]:
    import kfp.local

    from pipelines.training import build_training_pipeline

    kfp.local.init(runner=kfp.local.SubprocessRunner(use_venv=False), pipeline_root=pipeline_root)
    pipeline = build_training_pipeline(rounds=1)
    t0 = time.perf_counter()
    pipeline(**settings)
    seconds = time.perf_counter() - t0
    # every task that ran has its folder in the run's: prepare, the base model's evaluation, the six stages, and
    # the no-op production evaluation, promote_candidate and run report of a run that does not promote
    (run,) = Path(pipeline_root).iterdir()
    return seconds, sum(1 for task in run.iterdir() if task.is_dir())


def run(quick: bool = True) -> dict:
    model = demo_model()
    # A B B A: this machine's speed drifts between rounds; the order cancels a steady drift and warm caches.
    runs: dict[str, list[float]] = {"direct": [], "kfp": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i, kind in enumerate(("direct", "kfp", "kfp", "direct")):
            settings = demo_settings(model, f"{tmp}/store{i}", kind)
            if kind == "direct":
                stages = demo_round(settings)
                runs["direct"].append(sum(stages.values()))
            else:
                seconds, tasks = _kfp_local(settings, f"{tmp}/kfp-local{i}")
                runs["kfp"].append(seconds)
    direct, kfp = statistics.mean(runs["direct"]), statistics.mean(runs["kfp"])
    overhead = (kfp - direct) / direct
    result = {
        "model": model,
        "preset": "demo",
        "runs_seconds": runs,
        "direct_seconds": direct,
        "direct_stage_seconds": stages,
        "kfp_local_seconds": kfp,
        "tasks": tasks,
        "overhead_per_task_seconds": (kfp - direct) / tasks,
        "overhead_fraction": overhead,
        "target": "overhead_fraction <= 0.10",
    }
    write_result(
        "pipeline_overhead",
        result,
        base=model,
        rows=[
            ("direct stage calls (s)", f"{direct:.1f}"),
            (f"KFP local runner, {tasks} tasks (s)", f"{kfp:.1f}"),
            ("overhead per task (s)", f"{(kfp - direct) / tasks:.1f}"),
            ("overhead", f"{overhead:.1%}"),
        ],
    )
    return result
