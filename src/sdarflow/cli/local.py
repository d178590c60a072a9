"""Commands that run on this machine: ``sdarflow <stage>`` (one per pipeline stage, its flags built from the
stage's config class, so the CLI and the KFP component run the same ``run(config)``), ``demo``, ``study``,
``build-model``, ``import-model``, ``plan`` (a round's time per stage and GPU-hours before launching, from measured
or published constants: ``sdarflow.plan``), ``envs`` and ``env``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import typing
from pathlib import Path

from sdarflow import stopping
from sdarflow.cli.common import (
    PRESET_NAMES,
    ReadsModel,
    ReadsPath,
    emit,
    output_flag,
    study_flags,
)
from sdarflow.errors import ConfigError
from sdarflow.stages import STAGES, config_class

# the fields of train.warmstart.BaseModelSpec that build-model takes as flags
SPEC_FLAGS = ("env", "tasks", "sft_steps", "sft_stop_at_loss", "solution_share", "seed")


def _cmd_demo(args: argparse.Namespace) -> int:
    from sdarflow.demo import run_demo

    summary = run_demo(
        args.out,
        storage_root=args.storage,
        rounds=args.rounds,
        preset=args.preset,
        base_model=args.base_model,
        shards=args.shards,
        options=args.options,
    )
    emit({k: v for k, v in summary.items() if k != "transcripts"})  # they are in summary.json and the report
    return 0


def _cmd_study(args: argparse.Namespace) -> int:
    from sdarflow.sizes import SIZES
    from sdarflow.study import StudySettings, run_study

    try:
        stage_settings = json.loads(args.stage_settings) if args.stage_settings else {}
    except json.JSONDecodeError as err:
        raise ConfigError(
            f'study: --stage-settings is not JSON ({err}); fix: pass e.g. \'{{"train": {{"lr": 0.002}}}}\''
        ) from err
    preset = args.preset or "demo"
    if args.preset is None and args.base_model:
        from sdarflow.model_cache import local_model
        from sdarflow.start_point import default_preset

        preset = default_preset(Path(local_model(args.base_model)))
    settings = StudySettings(
        methods=args.methods,
        seeds=args.seeds,
        rounds=args.rounds,
        out=args.out,
        base_model=args.base_model or "",
        env=args.env or SIZES[preset]["pipeline"].get("env") or StudySettings.env,
        preset=preset,
        stage_settings=stage_settings,
    )
    study = run_study(settings)
    emit(study["table"])
    return 0


def _cmd_build_model(args: argparse.Namespace) -> int:
    from sdarflow.train.warmstart import BaseModelSpec, build_base_model

    if not (math.isfinite(args.sft_time_limit) and args.sft_time_limit >= 0):
        raise ConfigError(
            f"build-model: --sft-time-limit ({args.sft_time_limit}) must be seconds >= 0; fix: 0 for no limit"
        )
    spec = BaseModelSpec(**{name: getattr(args, name) for name in SPEC_FLAGS})
    print(
        build_base_model(
            args.out, spec, force=args.force, time_limit_s=args.sft_time_limit, device=args.device
        )
    )
    return 0


def _cmd_import_model(args: argparse.Namespace) -> int:
    from sdarflow.models.gguf_import import KNOWN, import_gguf, known_file

    if bool(args.name) == bool(args.gguf):
        raise ConfigError(
            "import-model: name a known model or pass --gguf FILE, not both and not neither; "
            f"fix: e.g. sdarflow import-model {next(iter(KNOWN))} --output DIR"
        )
    if args.name:
        path = known_file(args.name)
        source, license_ = KNOWN[args.name].source, KNOWN[args.name].license
    else:
        path = Path(args.gguf)
        source, license_ = args.source or f"the GGUF file {path.name}", args.license
    print(import_gguf(path, Path(args.out), args.name or path.stem, source, license_, force=args.force))
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


def _model_flags(p: argparse.ArgumentParser, base_model_help: str) -> None:
    """``--base-model`` and ``--preset``, as ``demo`` and ``study`` take them."""
    p.add_argument("--base-model", default=None, action=ReadsModel, help=base_model_help)
    p.add_argument(
        "--preset",
        default=None,
        choices=PRESET_NAMES,
        help="sizes: demo (the tiny model on 2 CPU cores, ~15 min), smoke (tests), gpu (one GPU machine with "
        "sdarflow[gpu]), pretrained (a ~135M pretrained model on 2 CPU cores, with an SFT warm start); default: "
        "demo, or pretrained with a --base-model sdarflow did not build",
    )


def add_demo(p: argparse.ArgumentParser) -> None:
    output_flag(
        p, "folder the demo writes (base model, store, summary.json, run_report.html)", default="demo-output"
    )
    p.add_argument(
        "--storage", default=None, help="storage root URI (default OUT/store); s3://bucket/prefix works"
    )
    p.add_argument("--rounds", type=int, default=2, help="RL rounds (default 2)")
    p.add_argument(
        "--shards", type=int, default=1, help="generate shards per round (dsl.ParallelFor fan-out)"
    )
    p.add_argument(
        "--options",
        default="",
        metavar="OPTION[+OPTION...]",
        help="training options, the pipeline's options parameter (docs/training.md), e.g. solution",
    )
    _model_flags(
        p,
        "use this HF model folder, or a known pretrained model by name (smollm2-135m-instruct), instead of "
        "building the tiny one",
    )
    p.set_defaults(func=_cmd_demo)


def add_study(p: argparse.ArgumentParser) -> None:
    study_flags(p)
    p.add_argument("--rounds", type=int, default=2, help="RL rounds per (method, seed) cell (default 2)")
    output_flag(p, "study folder; a rerun skips the (method, seed) cells done there", required=True)
    _model_flags(
        p, "HF model folder or a known pretrained model's name; default: build the preset's tiny model"
    )
    p.add_argument(
        "--env",
        default=None,
        help="environment (`sdarflow envs list`); default: the preset's, else textworld-cooking",
    )
    p.add_argument(
        "--stage-settings",
        default=None,
        help='JSON per-stage overrides, e.g. \'{"train": {"lr": 0.002, "epochs": 2}}\'',
    )
    p.set_defaults(func=_cmd_study)


def add_build_model(p: argparse.ArgumentParser) -> None:
    from sdarflow.train.warmstart import BaseModelSpec

    spec = {f.name: f for f in dataclasses.fields(BaseModelSpec)}
    output_flag(p, "the model folder to write (a normal HF folder)", required=True)
    for name in SPEC_FLAGS:
        f = spec[name]
        flag = "--" + name.replace("_", "-")
        p.add_argument(
            flag, type=type(f.default), default=f.default, help=f"{f.metadata['help']} ({f.default})"
        )
    p.add_argument(
        "--sft-time-limit",
        type=float,
        default=0.0,
        help="fail (never stop early) if SFT takes longer than this many seconds; 0 = no limit",
    )
    p.add_argument("--force", action="store_true", help="rebuild even if an up-to-date model is there")
    p.add_argument(
        "--device",
        default="auto",
        help="where the SFT runs: auto (CUDA when present), cpu, cuda or cuda:N; the same spec gives the same "
        "model on machines of one device type",
    )
    p.set_defaults(func=_cmd_build_model)


def add_import_model(p: argparse.ArgumentParser) -> None:
    from sdarflow.models.gguf_import import KNOWN

    p.add_argument(
        "name", nargs="?", default="", help=f"a known model: {', '.join(sorted(KNOWN))} (or pass --gguf)"
    )
    output_flag(p, "the model folder to write (a normal HF folder)", required=True)
    p.add_argument(
        "--gguf", default="", action=ReadsPath, help="a GGUF file of your own instead of a known model"
    )
    p.add_argument("--source", default="", help="--gguf: where the file comes from, for the model card")
    p.add_argument("--license", default="unknown", help="--gguf: the model's license, for the model card")
    p.add_argument("--force", action="store_true", help="import again even if the folder holds this file")
    p.set_defaults(func=_cmd_import_model)


def _cmd_tool_server(args: argparse.Namespace) -> int:
    from sdarflow.envs import EnvError
    from sdarflow.envs.tool_server import ENDPOINT_ENV, make_server

    if not 0 <= args.port <= 65535:
        raise EnvError(f"--port {args.port} is not a TCP port; fix: 0 to 65535 (0 = any free one)")
    try:
        server = make_server(args.host, args.port)
    except OSError as err:  # in use, or an address this machine does not have
        raise EnvError(
            f"cannot listen on {args.host}:{args.port} ({err.strerror or err}); fix: pick another --port or --host"
        ) from None
    host, port = server.server_address[:2]
    print(
        f"tool server on http://{host}:{port} (export {ENDPOINT_ENV}=http://{host}:{port}); Ctrl-C stops it"
    )
    try:
        server.serve_forever()
    except (KeyboardInterrupt, stopping.Terminated):  # how a server is stopped: not an error
        pass
    finally:
        server.server_close()
    return 0


def add_envs(p: argparse.ArgumentParser) -> None:
    from sdarflow.envs.tool_server import DEFAULT_PORT

    sub = p.add_subparsers(dest="envs_command", required=True)
    sub.add_parser("list", help="registered environment names").set_defaults(func=_cmd_envs)
    serve = sub.add_parser(
        "tool-server", help="serve the tool-use tools over HTTP (the tool-use-http env's reference server)"
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 = any free)"
    )
    serve.set_defaults(func=_cmd_tool_server)


def add_env(p: argparse.ArgumentParser) -> None:
    p.set_defaults(func=_cmd_env)


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


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r} is not a JSON object; fix: e.g. '{{\"key\": 1}}'")
    return value


def _add_config_flags(parser: argparse.ArgumentParser, config_cls) -> None:
    from sdarflow.config import field_help

    parser.add_argument(
        "--config", action=ReadsPath, help="YAML file with this stage's settings (flags override it)"
    )
    for name, hint, f in field_help(config_cls):
        help_text = f.metadata.get("help", "")
        default = None if f.default is dataclasses.MISSING else f.default
        list_type = typing.get_origin(hint) is list
        shown = f"{help_text} (default {default!r})" + (" [repeatable]" if list_type else "")
        if hint is bool:
            kwargs = {"action": argparse.BooleanOptionalAction, "help": f"{help_text} (default {default})"}
        elif f.metadata.get("reads"):
            kwargs = {"action": ReadsPath, "append": list_type, "help": shown}
        elif typing.get_origin(hint) is dict:
            kwargs = {"type": _json_object, "help": f"{help_text} (a JSON object)"}
        else:
            # numeric choices are compared as numbers (argparse compares the raw string otherwise)
            choices = f.metadata.get("choices")
            numeric = choices and not isinstance(choices[0], str)
            kwargs = {"action": "append" if list_type else "store", "choices": choices, "help": shown}
            kwargs["type"] = type(choices[0]) if numeric else None
        parser.add_argument("--" + name.replace("_", "-"), dest=name, default=None, **kwargs)


def _run_stage(args: argparse.Namespace) -> int:
    from sdarflow.model_cache import with_local_model

    config_cls = config_class(args.command)
    overrides = {
        k: v for k, v in vars(args).items() if k in config_cls.__dataclass_fields__ and v is not None
    }
    emit(STAGES.get(args.command).run(with_local_model(config_cls.load(args.config, **overrides))))
    return 0


def add_stage(name: str, p: argparse.ArgumentParser) -> None:
    _add_config_flags(p, config_class(name))
    p.set_defaults(func=_run_stage)
