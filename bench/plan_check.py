"""Capacity planner against a measured round: ``sdarflow.plan.calibrate`` measures this machine's constants on the
demo's base model (prefill, decode, forward, train step, env turns), then a demo round runs with every stage called
directly, and ``plan.estimate`` predicts each stage's work from the round's own workload (its episodes, mean
turns, prompt and response lengths). ``ratio = predicted / measured`` for the round and each model stage; the
planner's target is the round within 30%."""

from __future__ import annotations

import dataclasses
import math
import statistics
import tempfile
from pathlib import Path

from bench.common import demo_model, demo_round, demo_settings, write_result
from sdarflow import plan, storage
from sdarflow.models.identity import safetensors_shapes
from sdarflow.pipeline_config import stage_uri
from sdarflow.registry.intake import load_report
from sdarflow.schema import TRAJECTORY_SCHEMA
from sdarflow.sizes import SIZES

TARGET = 0.3


def workload(root: str, run_id: str, sizes: dict) -> plan.Workload:
    """The round's workload as the planner takes it, from what the round published."""
    gen = stage_uri(root, run_id, 0, "generate")
    table = storage.read_table(gen, kind="trajectories", schema=TRAJECTORY_SCHEMA)
    metrics = storage.read_manifest(gen)["metrics"]
    report = load_report(stage_uri(root, run_id, 0, "evaluate"))
    return plan.Workload(
        model_params=0,  # set by the caller
        gpus=0,
        tasks=sizes["tasks"],
        group_size=sizes["group_size"],
        turns=metrics["rollout/mean_turns"],
        prompt_tokens=statistics.mean(len(p) for p in table.column("prompt_token_ids").to_pylist()),
        response_tokens=statistics.mean(len(r) for r in table.column("response_token_ids").to_pylist()),
        eval_tasks=sizes["eval_tasks"],
        eval_samples=sizes["eval_samples"],
        eval_turns=statistics.mean(s["mean_turns"] for s in report["splits"].values()),
        rescore_passes=2,  # round 0 starts from the base model: no separate reference pass
        envs="local",  # what --envs auto picks on this CPU
    )


def run(quick: bool = True) -> dict:
    model = demo_model()
    params = sum(
        math.prod(shape) for shape in safetensors_shapes(Path(model) / "model.safetensors", "model").values()
    )
    constants = plan.calibrate(model, device="cpu")
    sizes = SIZES["demo"]["pipeline"]
    with tempfile.TemporaryDirectory() as tmp:
        measured = demo_round(demo_settings(model, f"{tmp}/store", "plan"))
        load = dataclasses.replace(workload(f"{tmp}/store", "plan", sizes), model_params=params)
    predicted = plan.estimate(load, constants)["work_seconds"]
    stages = ("generate", "rescore", "train", "evaluate")
    ratios = {s: predicted[s] / measured[s] for s in stages}
    ratio = sum(predicted.values()) / sum(measured.values())
    result = {
        "model": model,
        "model_params": params,
        "constants": dataclasses.asdict(constants),
        "workload": dataclasses.asdict(load),
        "measured_seconds": measured,
        "predicted_seconds": predicted,
        "ratio_by_stage": ratios,
        "ratio": ratio,
        "target": f"|ratio - 1| <= {TARGET}",
    }
    rows = [("stage", "measured (s)", "predicted (s)", "ratio")]
    rows += [(s, f"{measured[s]:.1f}", f"{predicted[s]:.1f}", f"{ratios[s]:.2f}") for s in stages]
    rows.append(("round", f"{sum(measured.values()):.1f}", f"{sum(predicted.values()):.1f}", f"{ratio:.2f}"))
    write_result("plan_check", result, rows, base=model)
    return result
