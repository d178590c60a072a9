"""The CLI's contract, for every command and subcommand the parser has (found by walking it, so a command added
tomorrow is covered without editing this file): ``--help`` works and describes every option; an unknown or a missing
required option is one usage and one error line with exit 2; a path the command reads that does not exist is one
``error: ...; fix: ...`` line, a non-zero exit and nothing written. And the KFP side: every pipeline parameter's
description in the compiled YAML is its help text as written."""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from sdarflow.cli import COMMANDS, build_parser, main
from sdarflow.cli.common import ReadsPath


def _walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command path, its parser) for the top level, every group and every leaf command."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk(sub, (*path, name))


def _is_leaf(parser: argparse.ArgumentParser) -> bool:
    return not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


ALL = dict(_walk(build_parser()))
LEAVES = {path: p for path, p in ALL.items() if path and _is_leaf(p)}
REQUIRED = [(path, a) for path, p in LEAVES.items() for a in _options(p) if a.required]
READS = [(path, a) for path, p in LEAVES.items() for a in _options(p) if isinstance(a, ReadsPath)]


def _id(value) -> str:
    if isinstance(value, tuple):
        return " ".join(value) or "sdarflow"
    return value.option_strings[0] if isinstance(value, argparse.Action) else str(value)


def _fill(parser: argparse.ArgumentParser, existing: Path, skip: argparse.Action | None = None) -> list[str]:
    """Values for the required options (but ``skip``) that pass parsing: an existing path where one is read."""
    argv: list[str] = []
    for a in _options(parser):
        if not a.required or a is skip:
            continue
        if isinstance(a, ReadsPath):
            value = str(existing)
        elif a.choices:
            value = str(next(iter(a.choices)))
        else:
            value = "1" if a.type in (int, float) else "x"
        argv += [a.option_strings[0], value]
    return argv


def _one_error(err: str) -> str:
    """argparse's refusal: one usage, then one error line last, and no traceback; returns the error line."""
    assert "Traceback" not in err
    assert err.count("usage:") == 1, err
    lines = err.strip().splitlines()
    assert [line for line in lines if ": error: " in line] == [lines[-1]], err
    return lines[-1]


def test_the_walk_finds_every_command():
    top = {path[0] for path in ALL if len(path) == 1}
    assert top == set(COMMANDS)
    assert ("registry", "promote") in LEAVES and ("pipeline", "compile") in LEAVES
    assert len(LEAVES) >= 25 and READS and REQUIRED


@pytest.mark.parametrize("path", list(ALL), ids=_id)
def test_help_exits_0_and_describes_every_option(path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([*path, "--help"])
    out, err = capsys.readouterr()
    assert exit_.value.code == 0, err
    assert "Traceback" not in out + err and out.startswith("usage:")
    for action in _options(ALL[path]):
        assert action.help and action.help.strip(), (
            f"{_id(path)} {action.option_strings[0]} has no description"
        )
        for flag in action.option_strings:
            assert flag in out, f"{_id(path)} --help does not name {flag}"


@pytest.mark.parametrize("path", list(ALL), ids=_id)
def test_an_unknown_option_is_one_usage_and_one_error(path, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([*path, *(_fill(ALL[path], tmp_path) if path in LEAVES else []), "--no-such-option"])
    assert exit_.value.code == 2
    line = _one_error(capsys.readouterr().err)
    if path in LEAVES:
        assert line.endswith("error: unrecognized arguments: --no-such-option")


@pytest.mark.parametrize(("path", "action"), REQUIRED, ids=[f"{_id(p)} {_id(a)}" for p, a in REQUIRED])
def test_a_missing_required_option_is_named(path, action, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([*path, *_fill(LEAVES[path], tmp_path, skip=action)])
    assert exit_.value.code == 2
    line = _one_error(capsys.readouterr().err)
    assert "the following arguments are required: " + "/".join(action.option_strings) in line


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize(("path", "action"), READS, ids=[f"{_id(p)} {_id(a)}" for p, a in READS])
def test_a_missing_input_path_is_one_line_and_nothing_is_written(path, action, tmp_path, monkeypatch, capsys):
    existing = tmp_path / "there"
    existing.mkdir()
    monkeypatch.chdir(tmp_path)
    missing = tmp_path / "not-there" / "input"
    before = _tree(tmp_path)
    argv = [*path, *_fill(LEAVES[path], existing, skip=action), action.option_strings[0], str(missing)]
    code = main(argv)
    err = capsys.readouterr().err
    assert code != 0
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert re.fullmatch(
        rf"error: {action.option_strings[0]} '{re.escape(str(missing))}' does not exist; fix: .+\n", err
    )
    assert _tree(tmp_path) == before


def test_an_s3_uri_is_left_to_the_command_and_file_uris_are_checked(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    parser.add_argument("--input", action=ReadsPath, append=True)
    assert parser.parse_args(["--input", "s3://bucket/x", "--input", str(tmp_path)]).input == [
        "s3://bucket/x",
        str(tmp_path),
    ]
    assert parser.parse_args(["--input", f"file://{tmp_path}"]).input == [f"file://{tmp_path}"]
    with pytest.raises(Exception, match="does not exist; fix:"):
        parser.parse_args(["--input", f"file://{tmp_path}/nope"])


def test_a_percent_sign_in_help_is_shown_as_written(capsys):
    """The promote help crashed on '95% lower' (argparse read '% l...o' as a format directive)."""
    from sdarflow.cli.common import Parser

    parser = Parser(prog="x")
    parser.add_argument("--gain", help="the 95% lower bound, 100%% sure, %(default)s")
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    assert "the 95% lower bound, 100%% sure, %(default)s" in " ".join(capsys.readouterr().out.split())


# A format directive left in (printf or str.format style) or an escape that was meant for argparse.
_UNRENDERED = re.compile(r"%|\{[A-Za-z_][\w.]*(![rsa])?(:[^{}\s]*)?\}")


@pytest.mark.parametrize("pipeline", ["training", "promote", "study"])
def test_every_pipeline_parameter_description_renders(pipeline, tmp_path):
    out = tmp_path / "spec.yaml"
    assert (
        main(["pipeline", "compile", "--pipeline", pipeline, "--output", str(out), "--allow-release-tags"])
        == 0
    )
    spec = next(yaml.safe_load_all(out.read_text()))
    described = {"pipeline": spec["pipelineInfo"].get("description", "")}
    for name, param in spec["root"]["inputDefinitions"]["parameters"].items():
        described[name] = param.get("description", "")
    for name, text in described.items():
        assert text.strip(), f"{pipeline}: {name} has no description"
        assert not _UNRENDERED.search(text), (
            f"{pipeline}: {name}'s description {text!r} has an unrendered directive"
        )


@pytest.mark.parametrize(
    ("sig", "code", "name"), [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "SIGINT")]
)
def test_a_stopped_command_says_so_in_one_line_and_leaves_nothing_behind(
    tmp_path, game_cache, sig, code, name
):
    """Kubernetes stops a pod with SIGTERM; Python's default handler ended the process without unwinding, so
    build-model's staging folder (and a stage's temporary copies) stayed behind. Stopped mid-SFT, the command now
    unwinds: one line, 128 + the signal, and nothing beside its --output."""
    out = tmp_path / "model"
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    # a shell that ignores SIGINT (nohup, a background job) passes that on, and Python then raises nothing on it
    argv = [
        sys.executable,
        "-c",
        "import signal, sys, sdarflow.cli; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "sys.exit(sdarflow.cli.main())",
        "build-model",
        "--output",
        str(out),
        "--tasks",
        "1",
    ]
    proc = subprocess.Popen([*argv, "--sft-steps", "100000000"], env=env, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []  # stderr, read as it comes so the stop lands in the SFT loop, not before it

    def read() -> None:
        for line in proc.stderr:
            lines.append(line.rstrip("\n"))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    with proc:
        try:
            deadline = time.monotonic() + 300
            while not any(line.startswith("sft:") for line in lines) and time.monotonic() < deadline:
                assert proc.poll() is None, (
                    f"build-model exited {proc.returncode} before its SFT loop: {lines[-20:]}"
                )
                time.sleep(0.2)
            assert any(line.startswith("sft:") for line in lines), f"no SFT loop in 300 s: {lines[-20:]}"
            assert list(tmp_path.glob(".model.*.staging")), f"no staging folder: {lines[-20:]}"
            proc.send_signal(sig)
            proc.wait(timeout=120)
            reader.join(timeout=30)
            assert not reader.is_alive(), "stderr still open after the command exited"
        finally:
            proc.kill()
    # Off a terminal a progress bar is plain lines (its first and last state: tqdm prints the last when the bar is
    # closed, which may follow the error line) and log lines start with the date; what the stop adds is one line.
    error = f"error: stopped by {name}; nothing half-written was kept"
    progress = re.compile(r"^[\w ]+: +\d+%\|")
    assert proc.returncode == code
    assert [line for line in lines if line.startswith("error:")] == [error]
    assert "Traceback" not in "\n".join(lines)
    after = lines[lines.index(error) + 1 :]
    assert all(progress.match(line) or line[:4].isdigit() for line in after), after
    # torch's first backward makes its (empty) inductor cache folder in TMPDIR: torch's, kept across runs by design
    assert [p for p in tmp_path.iterdir() if not p.name.startswith("torchinductor_")] == []
