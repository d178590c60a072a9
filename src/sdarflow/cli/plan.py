"""``sdarflow plan``: a round's time per stage and GPU-hours before launching, from measured or published
constants (``sdarflow.plan``)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from sdarflow.cli.common import ReadsPath, output_flag
from sdarflow.errors import ConfigError


def _cmd_plan(args: argparse.Namespace) -> int:
    from sdarflow import plan

    if args.calibrate:
        constants = plan.calibrate(args.calibrate, env=args.env, device=args.device)
        text = json.dumps(dataclasses.asdict(constants), indent=2, sort_keys=True)
        if args.out:
            Path(args.out).write_text(text + "\n")
        print(text)
        return 0
    missing = [
        f"--{k.replace('_', '-')}" for k in ("model_params", "tasks", "turns") if getattr(args, k) is None
    ]
    if missing:
        raise ConfigError(
            f"plan: {', '.join(missing)} required; fix: e.g. --model-params 7e9 --tasks 512 --turns 20"
        )
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(plan.Workload)}
    values["eval_turns"] = args.eval_turns or args.turns
    values["envs"] = args.envs or ("process" if args.gpus > 0 else "local")
    workload = plan.Workload(**values)
    workload.check()  # before choosing constants: a bad --gpus is named as such
    if args.constants:
        constants = plan.Constants.load(args.constants)
    elif args.gpus > 0:
        constants = plan.PUBLISHED
    else:
        raise ConfigError(
            "plan: --gpus 0 plans for this machine, which needs measured constants; fix: sdarflow plan --calibrate "
            "MODEL --output FILE, then --constants FILE (or --gpus N for published GPU figures)"
        )
    result = plan.estimate(workload, constants)
    print(json.dumps(result, indent=2, sort_keys=True) if args.json else plan.render(result))
    return 0


def add_plan(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model-params", type=float, help="model parameters, e.g. 7e9")
    p.add_argument("--gpus", type=int, default=0, help="GPUs the round runs on; 0 = this machine's CPU")
    p.add_argument("--tasks", type=int, help="tasks per round")
    p.add_argument("--group-size", type=int, default=8, help="rollouts per task")
    p.add_argument("--turns", type=float, help="mean turns per episode")
    p.add_argument("--prompt-tokens", type=float, default=1024, help="mean prompt tokens per turn")
    p.add_argument("--response-tokens", type=float, default=64, help="mean tokens per action")
    p.add_argument("--eval-tasks", type=int, default=128, help="evaluate: tasks per split")
    p.add_argument("--eval-samples", type=int, default=4, help="evaluate: samples per task")
    p.add_argument("--eval-turns", type=float, default=None, help="evaluate: mean turns (default --turns)")
    p.add_argument("--epochs", type=int, default=1, help="train: passes over the round's rows")
    p.add_argument("--rescore-passes", type=int, default=3, help="student, teacher, reference (2 in round 0)")
    p.add_argument(
        "--precision",
        default="bf16",
        choices=("bf16", "fp32"),
        help="the weights on each GPU: the stages' --precision (auto is bf16 on a GPU; default bf16)",
    )
    p.add_argument(
        "--envs",
        choices=("local", "process"),
        help="env work added to generation, or overlapped (default: "
        "process with GPUs, local on the CPU, as the stages' --envs auto)",
    )
    p.add_argument(
        "--constants",
        action=ReadsPath,
        help="measured constants: a --calibrate file, or bench/results/gpu_check.json",
    )
    p.add_argument(
        "--calibrate",
        metavar="MODEL",
        action=ReadsPath,
        help="measure this machine's constants with MODEL (HF folder)",
    )
    p.add_argument("--env", default="textworld-cooking", help="--calibrate: the env whose turns are timed")
    p.add_argument("--device", default="auto", help="--calibrate: where the model runs")
    output_flag(p, "--calibrate: write the constants here (JSON)")
    p.add_argument("--json", action="store_true", help="the plan as JSON")
    p.set_defaults(func=_cmd_plan)
