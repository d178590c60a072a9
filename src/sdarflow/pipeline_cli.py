"""``sdarflow pipeline``: compile the KFP pipelines to IR YAML, and run them locally with the KFP local runner."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

log = logging.getLogger(__name__)


def compile_training(out: str, rounds: int) -> Path:
    from kfp import compiler

    from pipelines.training import build_training_pipeline

    compiler.Compiler().compile(build_training_pipeline(rounds), package_path=out)
    return Path(out)


def _cmd_compile(args: argparse.Namespace) -> int:
    print(compile_training(args.out, args.rounds))
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("pipeline", help="compile or run the KFP pipelines")
    sub = p.add_subparsers(dest="pipeline_command", required=True)
    c = sub.add_parser("compile", help="write the training pipeline's KFP IR YAML")
    c.add_argument("--out", required=True)
    c.add_argument("--rounds", type=int, default=2)
    c.set_defaults(func=_cmd_compile)
