"""Env plug-ins: a package registering a suite in the ``sdarflow.envs`` entry-point group is found without any
change to sdarflow. The package here is a real distribution (``.dist-info`` with ``entry_points.txt``) on sys.path."""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path

import pytest

from sdarflow.cli import main
from sdarflow.envs import EnvError, get_suite, list_envs

PLUGIN_ENV = """
from sdarflow.envs import Reset, Step, Task


class MyEnv:
    def __init__(self, task):
        self.task = task

    def reset(self):
        return Reset(instruction="say hi", observation="...")

    def step(self, action):
        won = action == "hi"
        return Step("bye", float(won), True, won)

    def expert_action(self):
        return "hi"

    def close(self):
        pass


class MySuite:
    name = "my-env"

    def __init__(self, greeting="hi"):
        self.greeting = greeting

    def tasks(self, split, n=None, start=0):
        return [Task(f"my-{split}-{i}", "greet", split) for i in range(n or 2)]

    def make(self, task):
        return MyEnv(task)
"""


def make_distribution(root: Path, name: str, entry_points: str, module: str = PLUGIN_ENV) -> Path:
    """A minimal installed distribution: ``<name>/env.py`` plus ``<name>-0.1.dist-info``."""
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text("")
    (root / name / "env.py").write_text(module)
    info = root / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))
    return root


@pytest.fixture
def plugin_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = make_distribution(tmp_path / "site", "mypkg", "[sdarflow.envs]\nmy-env = mypkg.env:MySuite\n")
    monkeypatch.syspath_prepend(str(root))  # also invalidates the import caches
    return root


def test_entry_point_suite_is_listed_and_built(plugin_path: Path, capsys) -> None:
    assert "my-env" in list_envs() and "tool-use" in list_envs()
    suite = get_suite("my-env", greeting="hello")
    assert type(suite).__module__ == "mypkg.env" and suite.greeting == "hello"
    env = suite.make(suite.tasks("train", 1)[0])
    assert env.reset().instruction == "say hi" and env.step(env.expert_action()).won
    assert main(["envs", "list"]) == 0
    assert "my-env" in capsys.readouterr().out.split()


def test_plugin_cannot_shadow_a_builtin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    root = make_distribution(
        tmp_path / "site", "evilpkg", "[sdarflow.envs]\ntool-use = evilpkg.env:MySuite\n"
    )
    monkeypatch.syspath_prepend(str(root))
    with caplog.at_level(logging.WARNING, logger="sdarflow.envs"):
        assert list_envs().count("tool-use") == 1
    assert type(get_suite("tool-use")).__module__ == "sdarflow.envs.tool_use"
    assert "is a built-in env" in caplog.text


def test_broken_plugin_fails_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = make_distribution(
        tmp_path / "site", "brokenpkg", "[sdarflow.envs]\nbroken = brokenpkg.env:Missing\n"
    )
    monkeypatch.syspath_prepend(str(root))
    with pytest.raises(EnvError, match=r"env 'broken' is registered as 'brokenpkg.env:Missing'.*fix"):
        get_suite("broken")


def test_not_installed_means_not_listed() -> None:
    assert "my-env" not in list_envs()
    with pytest.raises(EnvError, match="unknown env 'my-env'"):
        get_suite("my-env")


def test_a_plugin_without_solutions_cannot_teach_with_one(plugin_path: Path) -> None:
    from sdarflow.errors import ConfigError
    from sdarflow.teacher.solution import task_solutions

    row = {"env": "my-env", "split": "train", "task_id": "my-train-0"}
    with pytest.raises(
        ConfigError, match=r"env 'my-env' has no solution\(task_id, split\); fix: implement it"
    ):
        task_solutions([row])


def test_a_plugin_solution_without_actions_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sdarflow.errors import ConfigError
    from sdarflow.teacher.solution import task_solutions

    module = (
        PLUGIN_ENV
        + "\n\nclass EmptySuite(MySuite):\n    def solution(self, task_id, split):\n        return []\n"
    )
    entry = "[sdarflow.envs]\nempty-env = emptypkg.env:EmptySuite\n"
    monkeypatch.syspath_prepend(str(make_distribution(tmp_path / "site", "emptypkg", entry, module)))
    row = {"env": "empty-env", "split": "train", "task_id": "my-train-0"}
    with pytest.raises(ConfigError, match="env 'empty-env' gave no solution for task my-train-0; fix:"):
        task_solutions([row])
