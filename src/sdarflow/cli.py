"""``sdarflow`` command line: one subcommand per stage (flags built from the stage's config class), plus ``demo``,
``build-model``, ``envs``, ``env``, ``registry`` and ``pipeline``.

Heavy imports happen inside commands, and only the command being run gets its flags, so ``--help`` is fast. User errors (``SdarflowError``) become one line on
stderr and the error's exit code; nothing else is caught.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import json
import logging
import math
import sys
import typing
from collections.abc import Callable, Sequence
from pathlib import Path

from sdarflow import progress
from sdarflow.errors import ConfigError, SdarflowError
from sdarflow.stages import STAGES, config_class

log = logging.getLogger("sdarflow")

# sdarflow.demo.PRESETS' names (a test keeps them equal; importing it here would slow every --help)
PRESET_NAMES = ("demo", "smoke", "gpu")
PRESET_HELP = "sizes: demo (2 CPU cores, ~15 min), smoke (tests), gpu (one GPU machine with sdarflow[gpu])"


def _add_config_flags(parser: argparse.ArgumentParser, config_cls) -> None:
    from sdarflow.config import field_help

    parser.add_argument("--config", help="YAML file with this stage's settings (flags override it)")
    for name, hint, f in field_help(config_cls):
        flag = "--" + name.replace("_", "-")
        help_text = f.metadata.get("help", "")
        default = None if f.default is dataclasses.MISSING else f.default
        if hint is bool:
            parser.add_argument(
                flag,
                dest=name,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=f"{help_text} (default {default})",
            )
            continue
        list_type = typing.get_origin(hint) is list
        parser.add_argument(
            flag,
            dest=name,
            default=None,
            action="append" if list_type else "store",
            choices=f.metadata.get("choices"),
            help=f"{help_text} (default {default!r})" + (" [repeatable]" if list_type else ""),
        )


def _stage_command(name: str) -> Callable[[argparse.Namespace], int]:
    def handler(args: argparse.Namespace) -> int:
        module = importlib.import_module(STAGES[name])
        config_cls = config_class(name)
        overrides = {
            k: v for k, v in vars(args).items() if k in config_cls.__dataclass_fields__ and v is not None
        }
        from sdarflow.pipeline_config import with_local_model

        result = module.run(with_local_model(config_cls.load(args.config, **overrides)))
        print(json.dumps(result, indent=2, sort_keys=True, default=str))
        return 0

    return handler


def _cmd_demo(args: argparse.Namespace) -> int:
    from sdarflow.demo import run_demo

    summary = run_demo(
        args.out,
        storage_root=args.storage,
        rounds=args.rounds,
        preset=args.preset,
        base_model=args.base_model,
        shards=args.shards,
    )
    print(json.dumps(summary, indent=2, sort_keys=True))
    return 0


def _cmd_study(args: argparse.Namespace) -> int:
    from sdarflow.study import StudySettings, run_study

    try:
        stage_settings = json.loads(args.stage_settings) if args.stage_settings else {}
    except json.JSONDecodeError as err:
        raise ConfigError(
            f'study: --stage-settings is not JSON ({err}); fix: pass e.g. \'{{"train": {{"lr": 0.002}}}}\''
        ) from err
    settings = StudySettings(
        methods=args.methods,
        seeds=args.seeds,
        rounds=args.rounds,
        out=args.out,
        base_model=args.base_model or "",
        env=args.env,
        preset=args.preset,
        stage_settings=stage_settings,
    )
    study = run_study(settings)
    print(json.dumps(study["table"], indent=2, sort_keys=True))
    return 0


def _cmd_build_model(args: argparse.Namespace) -> int:
    from sdarflow.train.warmstart import BaseModelSpec, build_base_model

    if not (math.isfinite(args.sft_time_limit) and args.sft_time_limit >= 0):
        raise ConfigError(
            f"build-model: --sft-time-limit ({args.sft_time_limit}) must be seconds >= 0; fix: 0 for no limit"
        )
    spec = BaseModelSpec(
        env=args.env,
        tasks=args.tasks,
        sft_steps=args.sft_steps,
        seed=args.seed,
    )
    print(
        build_base_model(
            args.out, spec, force=args.force, time_limit_s=args.sft_time_limit, device=args.device
        )
    )
    return 0


def _cmd_envs(args: argparse.Namespace) -> int:
    from sdarflow.envs import list_envs

    for name in list_envs():
        print(name)
    return 0


def _cmd_env(args: argparse.Namespace) -> int:
    """Versions for bug reports."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    print(f"python {platform.python_version()} on {platform.platform()}")
    for pkg in (
        "sdarflow",
        "torch",
        "transformers",
        "peft",
        "kfp",
        "pyarrow",
        "deepspeed",
        "textworld",
        "vllm",
    ):
        try:
            print(f"{pkg} {version(pkg)}")
        except PackageNotFoundError:
            print(f"{pkg} (not installed)")
    return 0


def _add_stage(name: str, p: argparse.ArgumentParser) -> None:
    _add_config_flags(p, config_class(name))
    p.set_defaults(func=_stage_command(name))


def _add_demo(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="demo-output")
    p.add_argument(
        "--storage", default=None, help="storage root URI (default OUT/store); s3://bucket/prefix works"
    )
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--preset", default="demo", choices=PRESET_NAMES, help=PRESET_HELP)
    p.add_argument(
        "--shards", type=int, default=1, help="generate shards per round (dsl.ParallelFor fan-out)"
    )
    p.add_argument(
        "--base-model", default=None, help="use this HF model folder instead of building the tiny one"
    )
    p.set_defaults(func=_cmd_demo)


def _add_study(p: argparse.ArgumentParser) -> None:
    from sdarflow.pipeline_cli import study_flags

    study_flags(p)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument(
        "--out", required=True, help="study folder; a rerun skips the (method, seed) cells done there"
    )
    p.add_argument(
        "--base-model", default=None, help="HF model folder; default: build the preset's tiny model"
    )
    p.add_argument("--env", default="textworld-cooking")
    p.add_argument("--preset", default="demo", choices=PRESET_NAMES, help=PRESET_HELP)
    p.add_argument(
        "--stage-settings",
        default=None,
        help='JSON per-stage overrides, e.g. \'{"train": {"lr": 0.002, "epochs": 2}}\'',
    )
    p.set_defaults(func=_cmd_study)


def _add_build_model(p: argparse.ArgumentParser) -> None:
    from sdarflow.train.warmstart import BaseModelSpec

    spec = BaseModelSpec()
    p.add_argument("--out", required=True)
    p.add_argument("--env", default=spec.env)
    p.add_argument(
        "--tasks", type=int, default=spec.tasks, help="train games whose walkthroughs make the SFT data"
    )
    p.add_argument("--sft-steps", type=int, default=spec.sft_steps)
    p.add_argument(
        "--sft-time-limit",
        type=float,
        default=0.0,
        help="fail (never stop early) if SFT takes longer than this many seconds; 0 = no limit",
    )
    p.add_argument("--seed", type=int, default=spec.seed)
    p.add_argument("--force", action="store_true", help="rebuild even if an up-to-date model is there")
    p.add_argument(
        "--device",
        default="auto",
        help="where the SFT runs: auto (CUDA when present), cpu, cuda or cuda:N; the same spec gives the same "
        "model on machines of one device type",
    )
    p.set_defaults(func=_cmd_build_model)


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
    workload = plan.Workload(
        model_params=args.model_params,
        gpus=args.gpus,
        tasks=args.tasks,
        group_size=args.group_size,
        turns=args.turns,
        prompt_tokens=args.prompt_tokens,
        response_tokens=args.response_tokens,
        eval_tasks=args.eval_tasks,
        eval_samples=args.eval_samples,
        eval_turns=args.eval_turns or args.turns,
        epochs=args.epochs,
        rescore_passes=args.rescore_passes,
        envs=args.envs or ("process" if args.gpus > 0 else "local"),
    )
    workload.check()  # before choosing constants: a bad --gpus is named as such
    if args.constants:
        constants = plan.Constants.load(args.constants)
    elif args.gpus > 0:
        constants = plan.PUBLISHED
    else:
        raise ConfigError(
            "plan: --gpus 0 plans for this machine, which needs measured constants; fix: sdarflow plan --calibrate "
            "MODEL --out FILE, then --constants FILE (or --gpus N for published GPU figures)"
        )
    result = plan.estimate(workload, constants)
    print(json.dumps(result, indent=2, sort_keys=True) if args.json else plan.render(result))
    return 0


def _add_plan(p: argparse.ArgumentParser) -> None:
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
        "--envs",
        choices=("local", "process"),
        help="env work added to generation, or overlapped (default: "
        "process with GPUs, local on the CPU, as the stages' --envs auto)",
    )
    p.add_argument(
        "--constants", help="measured constants: a --calibrate file, or bench/results/gpu_check.json"
    )
    p.add_argument(
        "--calibrate", metavar="MODEL", help="measure this machine's constants with MODEL (HF folder)"
    )
    p.add_argument("--env", default="textworld-cooking", help="--calibrate: the env whose turns are timed")
    p.add_argument("--device", default="auto", help="--calibrate: where the model runs")
    p.add_argument("--out", help="--calibrate: write the constants here (JSON)")
    p.add_argument("--json", action="store_true", help="the plan as JSON")
    p.set_defaults(func=_cmd_plan)


def _add_envs(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="envs_command", required=True)
    sub.add_parser("list", help="registered environment names").set_defaults(func=_cmd_envs)


def _add_registry(p: argparse.ArgumentParser) -> None:
    from sdarflow.registry.commands import add_arguments

    add_arguments(p)


def _add_pipeline(p: argparse.ArgumentParser) -> None:
    from sdarflow.pipeline_cli import add_arguments

    add_arguments(p)


# name -> (help, adds the command's flags). Adding them imports the command's modules (a stage's config class
# brings torch), so only the command being run gets them.
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {
    **{name: (f"run the {name} stage", functools.partial(_add_stage, name)) for name in STAGES},
    "demo": ("build the tiny base model and run the whole DAG locally (KFP local runner)", _add_demo),
    "study": (
        "compare methods: train each (method, seed) for R rounds, evaluate, report against GRPO",
        _add_study,
    ),
    "build-model": ("build the tiny demo base model (tokenizer, Qwen2, SFT warm start)", _add_build_model),
    "plan": (
        "estimate a round's time per stage and GPU-hours before launching (capacity planning)",
        _add_plan,
    ),
    "envs": ("environments", _add_envs),
    "env": ("print versions for bug reports", lambda p: p.set_defaults(func=_cmd_env)),
    "registry": ("adapter registry: register, promote (gated), serve", _add_registry),
    "pipeline": ("compile, upload, run and schedule the KFP pipelines", _add_pipeline),
}


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The CLI's parser, with the flags of the command ``argv`` names (of every command when ``argv`` is None)."""
    parser = argparse.ArgumentParser(
        prog="sdarflow", description="SDAR post-training for LLM agents on Kubeflow"
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="debug logging, and the full traceback of an unexpected error",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    # The top level has no option that takes a value, so the first bare word is the command.
    wanted = None if argv is None else next((a for a in argv if not a.startswith("-")), "")
    for name, (help_text, add_flags) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        if wanted is None or name == wanted:
            add_flags(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    progress.quiet_library_bars()
    for noisy in ("httpx", "urllib3", "botocore", "transformers", "DeepSpeed"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        return args.func(args)
    except SdarflowError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    except Exception as err:
        # Every input problem sdarflow knows of has its own message above; anything else is a file or value it
        # did not expect (or a bug): still one line, with the way to the traceback.
        if args.verbose:
            raise
        first = (str(err).strip().splitlines() or [""])[0][:300]
        print(
            f"error: unexpected {type(err).__name__}: {first} (a malformed input, or a bug in sdarflow); fix: check "
            f"the files and values this command reads, or rerun with --verbose for the traceback",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
