"""Start-up cost of the CLI: ``sdarflow --help`` and commands that need no model or dataset import neither torch
nor pyarrow (together ~2 s of a user's wait)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "pyarrow", "transformers", "peft", "kfp")


def _imported_after(argv: list[str] | None) -> dict:
    """Heavy modules in ``sys.modules`` after ``import sdarflow.cli`` (and ``main(argv)``) in a fresh interpreter."""
    code = (
        "import contextlib, io, json, sys\n"
        "import sdarflow.cli\n"
        f"argv = {argv!r}\n"
        "if argv is not None:\n"
        "    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "        sdarflow.cli.main(argv)\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.parametrize(
    "argv", [None, ["--help"], ["--version"], ["-v", "demo", "--help"], ["env"], ["envs", "list"]]
)
def test_cli_start_imports_no_torch_or_pyarrow(argv):
    assert _imported_after(argv) == []


def test_a_stage_command_gets_its_flags_only_when_named(capsys):
    from sdarflow.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser(["train", "--help"]).parse_args(["train", "--help"])
    assert "--kl-kind" in capsys.readouterr().out
    # flags of a command not named are not built, and every command's are when argv is None
    assert build_parser(["env"]).parse_args(["env"]).command == "env"
    assert build_parser().parse_args(["train", "--kl-kind", "kl"]).kl_kind == "kl"


def test_the_interpreter_freezes_its_objects_at_exit_only():
    # atexit runs handlers last-registered first: this one, registered before sdarflow's, sees the result
    code = (
        "import atexit, gc\n"
        "atexit.register(lambda: print('at exit', gc.get_freeze_count()))\n"
        "import sdarflow.cli\n"
        "print('running', gc.get_freeze_count())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[:2] == ["running", "0"] and out[2:4] == ["at", "exit"] and int(out[4]) > 1000


def test_version(capsys):
    from sdarflow import __version__
    from sdarflow.cli import main

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out == f"sdarflow {__version__}\n"


@pytest.mark.parametrize(
    "command",
    [["demo"], ["study"], ["build-model"], ["plan"], ["pipeline", "compile"], ["pipeline", "trainjob"],
     ["registry", "serve-config"]],
)  # fmt: skip
def test_one_spelling_of_the_output_flag(command, capsys):
    from sdarflow.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser(command).parse_args([*command, "--help"])
    assert "--output PATH" in capsys.readouterr().out
    required = ["--registry", ".", "--base-model", "b"] if command[0] == "registry" else []
    args, _ = build_parser(command).parse_known_args([*command, *required, "--output", "x"])
    assert args.out == "x"
    args, rest = build_parser(command).parse_known_args([*command, *required, "--output", "y", "--out", "x"])
    assert args.out == "y" and "--out" in rest  # not an abbreviation of --output


def test_registry_commands_spell_the_name_as_the_pipeline_does(capsys):
    from sdarflow.cli import build_parser

    argv = ["registry", "show", "--registry", ".", "--policy-name", "agent", "--version", "1"]
    assert build_parser(argv).parse_args(argv).name == "agent"
    with pytest.raises(SystemExit):
        build_parser(argv).parse_args([*argv[:4], "--name", "agent", "--version", "1"])
    assert "required: --policy-name" in capsys.readouterr().err  # --name is no spelling of it


def test_a_reader_that_stops_reading_is_not_an_error():
    """`sdarflow plan ... | head -1`: the pipe's reader is gone before the output is written; the command ends
    quietly with the SIGPIPE status, as a Unix tool does, instead of an 'unexpected BrokenPipeError'."""
    import os
    import signal

    read, write = os.pipe()
    os.close(read)
    argv = ["plan", "--model-params", "7e9", "--gpus", "8", "--tasks", "64", "--turns", "20"]
    with os.fdopen(write, "w") as out:
        done = subprocess.run(
            [sys.executable, "-m", "sdarflow.cli", *argv], stdout=out, stderr=subprocess.PIPE, text=True
        )
    assert done.returncode == 128 + signal.SIGPIPE and done.stderr == ""
