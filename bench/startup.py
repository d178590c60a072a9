"""Start-up: ``sdarflow --help``, and the fixed cost of each task of the demo's training DAG.

A KFP task is a fresh process: before its stage does useful work it pays the interpreter, the imports (KFP's
executor, the component, ``sdarflow.kfp_runtime`` and the stage), loading the run's config (``kfp_runtime._load``
and the stage's config) and, for a model stage, loading the model and its first forward pass. A probe process
times those phases cold, then repeats the config and model phases in the same process, warm: what the same stage
pays when called in-process (as ``study`` and ``bench.common.demo_round`` call it). ``fixed_cost_s`` = cold phases
- warm phases; the target is the median over the DAG's tasks. Medians of ``repeats`` fresh probes per task.

``production``: that fixed cost against a round at the production preset's sizes (``sdarflow plan``'s formulas and
published H100 figures, the pod start left out): the share this machine's per-task start would be there. A 7B
model's load is longer than the demo model's, so this is a lower bound on a cluster.
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import demo_model, demo_settings, write_result

HELP_TARGET_S, TASK_TARGET_S = 0.5, 3.0

# task -> (component module, what the task runs: a stage, "base" for the base model's evaluation, or None)
TASKS = {
    "prepare": ("prepare", None),
    "evaluate-base": ("evaluate_base", "base"),
    "generate": ("generate", "generate"),
    "extract-skills": ("extract_skills", "extract-skills"),
    "rescore": ("rescore", "rescore"),
    "train": ("train", "train"),
    "evaluate": ("evaluate", "evaluate"),
    "register": ("register", "register"),
    "promote-candidate": ("promote_candidate", None),
    "run-report": ("run_report", None),
}
MODEL_STAGES = {"base", "generate", "rescore", "train", "evaluate"}  # what loads the base model

# Runs in a fresh interpreter: argv = component, what, config URI, the model folder ('' = the task loads none), the
# parent's spawn time.
PROBE = r"""
import time
started = time.time()
import importlib, json, sys
component, what, config_uri, model, spawned = sys.argv[1:6]
phases = {"interpreter_s": started - float(spawned)}
t = time.perf_counter()
importlib.import_module("kfp.dsl.executor_main")
importlib.import_module("components." + component)
from sdarflow import kfp_runtime
from sdarflow.pipeline_config import base_eval_config, stage_config
if what not in ("None", "base"):
    from sdarflow.stages import STAGES
    STAGES.get(what)
phases["imports_s"] = time.perf_counter() - t

def config():
    if what == "None":
        return None if component == "prepare" else kfp_runtime._load(config_uri)
    pc = kfp_runtime._load(config_uri)
    return base_eval_config(pc) if what == "base" else stage_config(pc, what, 0)

def load_model():
    import torch
    from sdarflow.models import load_policy
    policy = load_policy(model, None, trainable=what == "train", device="cpu")
    with torch.inference_mode():
        policy.model(torch.tensor([policy.tokenizer.encode("look around")]))

def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t

for label in ("cold", "warm"):
    phases[f"config_{label}_s"] = timed(config)
    phases[f"model_{label}_s"] = timed(load_model) if model else 0.0
print("PHASES " + json.dumps(phases))
"""


def _seconds(argv: list[str], repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _probe(
    component: str, what: str | None, config_uri: str, model: str, bytecode: bool = True
) -> dict[str, float]:
    """The probe's phases; ``bytecode=False``: no compiled bytecode to read (an empty ``pycache_prefix``), as in
    an image whose install compiled none."""
    with tempfile.TemporaryDirectory() as empty:
        flags = [] if bytecode else ["-X", f"pycache_prefix={empty}"]
        args = [component, str(what), config_uri, model if what in MODEL_STAGES else "", repr(time.time())]
        out = subprocess.run(
            [sys.executable, *flags, "-c", PROBE, *args],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    return json.loads(next(ln for ln in out.splitlines() if ln.startswith("PHASES "))[len("PHASES ") :])


def task_costs(config_uri: str, model: str, repeats: int) -> dict[str, dict[str, float]]:
    """Per task: the median of each phase over ``repeats`` fresh probes, the fresh process's start, the same work
    in-process (warm) and the difference."""
    costs = {}
    for task, (component, what) in TASKS.items():
        probes = [_probe(component, what, config_uri, model) for _ in range(repeats)]
        med = {k: statistics.median(p[k] for p in probes) for k in probes[0]}
        fresh = med["interpreter_s"] + med["imports_s"] + med["config_cold_s"] + med["model_cold_s"]
        in_process = med["config_warm_s"] + med["model_warm_s"]
        costs[task] = {
            **med,
            "fresh_start_s": fresh,
            "in_process_s": in_process,
            "fixed_cost_s": fresh - in_process,
        }
    return costs


def import_profile(min_s: float = 0.05) -> dict[str, float]:
    """Where a model task's start goes: ``python -X importtime`` of what the train task imports and loads (KFP's
    executor, the component, the stage, transformers' auto classes, peft): the cumulative seconds of every
    top-level package (torch, kfp, ...) wherever it was first imported, and of every module the code imports itself
    (a lazy one included), that took at least ``min_s``. Nested: a module's figure includes what it imported (torch
    is inside ``sdarflow.kfp_runtime``), and importtime's own cost inflates them all."""
    code = (
        "import kfp.dsl.executor_main, components.train, sdarflow.kfp_runtime, sdarflow.stages.train; "
        "from transformers import AutoModelForCausalLM; import peft"
    )
    err = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code], check=True, capture_output=True, text=True
    ).stderr
    profile = {}
    for line in err.splitlines():
        found = re.match(r"import time:\s+\d+ \|\s+(\d+) \| ( *)(\S+)", line)
        if found and (not found.group(2) or "." not in found.group(3)) and int(found.group(1)) >= min_s * 1e6:
            profile[found.group(3)] = int(found.group(1)) / 1e6
    return profile


def production_share(fixed_cost_s: float) -> dict:
    """The per-task fixed cost against a production round (``sdarflow plan``: 7B, 8 GPUs, the preset's sizes at
    20 turns, published H100 figures), pod scheduling and image pulls left out."""
    import dataclasses

    from sdarflow import plan
    from sdarflow.sizes import PIPELINE_PRESETS

    preset = PIPELINE_PRESETS["production"]
    workload = plan.Workload(
        model_params=7e9,
        gpus=8,
        tasks=preset["tasks"],
        group_size=preset["group_size"],
        turns=20,
        prompt_tokens=1024,
        response_tokens=64,
        eval_tasks=preset["eval_tasks"],
        eval_samples=preset["eval_samples"],
        eval_turns=20,
    )
    estimate = plan.estimate(workload, dataclasses.replace(plan.PUBLISHED, task_start_s=fixed_cost_s))
    tasks = len(estimate["stages_seconds"])
    return {
        "plan": "sdarflow plan --model-params 7e9 --gpus 8 --tasks 128 --group-size 8 --turns 20 --eval-tasks 256 "
        "--eval-samples 8",
        "round_seconds": estimate["round_seconds"],
        "tasks": tasks,
        "fixed_cost_share": tasks * fixed_cost_s / estimate["round_seconds"],
    }


def run(quick: bool = True) -> dict:
    from sdarflow.pipeline_config import PipelineConfig, prepare

    cli = shutil.which("sdarflow", path=str(Path(sys.executable).parent)) or "sdarflow"  # this venv's
    help_s = _seconds([cli, "--help"])
    model = demo_model()
    # An image's install compiles bytecode (pip does; the GPU images ask uv to); an editable checkout run with
    # PYTHONDONTWRITEBYTECODE has none for sdarflow itself: compile it, so the probes start as a pod does.
    import components
    import sdarflow

    sources = [str(Path(m.__file__).parent) for m in (sdarflow, components)]
    subprocess.run([sys.executable, "-m", "compileall", "-q", *sources], check=True)
    with tempfile.TemporaryDirectory() as tmp:
        config_uri = prepare(PipelineConfig.from_dict(demo_settings(model, f"{tmp}/store", "startup")))
        costs = task_costs(config_uri, model, repeats=3 if quick else 5)
        cold = [_probe("train", "train", config_uri, model, bytecode=False) for _ in range(2)]
    train_no_bytecode = statistics.median(
        p["interpreter_s"] + p["imports_s"] + p["config_cold_s"] + p["model_cold_s"] for p in cold
    )
    median = statistics.median(c["fixed_cost_s"] for c in costs.values())
    result = {
        "help_seconds": help_s,
        "tasks": costs,
        "fixed_cost_median_s": median,
        "train_start_without_bytecode_s": train_no_bytecode,
        "train_import_profile_s": import_profile(),
        "production": production_share(median),
        "targets": {"help_seconds": f"<= {HELP_TARGET_S}", "fixed_cost_median_s": f"<= {TASK_TARGET_S}"},
    }
    rows = [("task", "interpreter", "imports", "config", "model", "in-process", "fixed cost (s)")]
    rows += [
        (
            task,
            f"{c['interpreter_s']:.2f}",
            f"{c['imports_s']:.2f}",
            f"{c['config_cold_s']:.2f}",
            f"{c['model_cold_s']:.2f}",
            f"{c['in_process_s']:.2f}",
            f"{c['fixed_cost_s']:.2f}",
        )
        for task, c in costs.items()
    ]
    rows += [
        ("median fixed cost per task (s)", f"{median:.2f} (target <= {TASK_TARGET_S})"),
        ("train's fresh start without compiled bytecode (s)", f"{train_no_bytecode:.2f}"),
        ("share of a production round", f"{result['production']['fixed_cost_share']:.2%}"),
        ("sdarflow --help (s)", f"{help_s:.2f} (target <= {HELP_TARGET_S})"),
    ]
    write_result("startup", result, rows)
    return result
