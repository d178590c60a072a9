"""Pipeline overhead: one round of the DAG through the KFP local runner (a subprocess per task, as on a cluster a
pod per task) against calling the same stages directly in one process, on the same sizes."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from bench.common import write_result
from bench.rollout import _model
from sdarflow.demo import PRESETS, run_demo
from sdarflow.pipeline_config import PipelineConfig, prepare, run_stage


def _direct(model: str, root: str, sizes: dict) -> float:
    t0 = time.perf_counter()
    pc = PipelineConfig(
        storage=root, base_model=model, run_id="direct", seed_skills=f"{model}/seed_skills", **sizes
    )
    cfg = prepare(pc)
    gen = run_stage("generate", cfg, 0, adapter="")["uri"]
    skills = run_stage("extract-skills", cfg, 0, input=[gen], previous=pc.seed_skills)["uri"]
    rescored = run_stage("rescore", cfg, 0, input=[gen], skills=skills, adapter="")["uri"]
    adapter = run_stage("train", cfg, 0, input=[rescored], adapter="")["uri"]
    report = run_stage("evaluate", cfg, 0, adapter=adapter)["uri"]
    run_stage("register", cfg, 0, adapter=adapter, eval_report=report, data=[gen, skills, rescored])
    return time.perf_counter() - t0


def run(quick: bool = True) -> dict:
    model = _model()
    sizes = dict(PRESETS["smoke" if quick else "demo"]["pipeline"])
    with tempfile.TemporaryDirectory() as tmp:
        direct = _direct(model, f"{tmp}/direct", sizes)
        t0 = time.perf_counter()
        run_demo(Path(tmp) / "kfp", rounds=1, preset="smoke" if quick else "demo", base_model=model)
        kfp = time.perf_counter() - t0
    overhead = (kfp - direct) / direct
    result = {
        "sizes": sizes,
        "direct_seconds": direct,
        "kfp_local_seconds": kfp,
        "overhead_fraction": overhead,
        "speedup": direct / kfp,
        "target": "overhead <= 0.10",
    }
    write_result(
        "pipeline_overhead",
        result,
        [
            ("direct stage calls (s)", f"{direct:.1f}"),
            ("KFP local runner (s)", f"{kfp:.1f}"),
            ("overhead", f"{overhead:.0%}"),
        ],
    )
    return result
