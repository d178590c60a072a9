"""The example env package (``examples/guess-env``), installed as a user would (``pip install`` into an environment
that has sdarflow), is found by name and played by the real rollout loop: the template a user copies works."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from sdarflow import storage
from sdarflow.schema import TRAJECTORY_SCHEMA

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "guess-env"


@pytest.fixture(scope="module")
def user_env(tmp_path_factory, pip_install_into_a_user_env) -> Path:
    """A user's environment with sdarflow (this checkout's source) and the example pip-installed into it."""
    venv = tmp_path_factory.mktemp("user") / "venv"
    return pip_install_into_a_user_env(venv, str(EXAMPLE), extra_paths=(str(ROOT / "src"),))


def _python(venv: Path, code: str) -> str:
    done = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_the_installed_example_is_an_env_an_expert_solves(user_env):
    code = """
import json
from sdarflow.envs import get_suite, list_envs
suite = get_suite("guess")
out = {"listed": "guess" in list_envs(), "types": {}, "solved": 0, "turns": [], "parse": []}
for split in ("train", "test", "ood"):
    tasks = suite.tasks(split, 6)
    out["types"][split] = sorted({t.task_type for t in tasks})
    for task in tasks:
        env = suite.make(task)
        env.reset()
        for turn in range(env.max_turns):
            step = env.step(env.expert_action())
            if step.done:
                break
        out["solved"] += step.won
        out["turns"].append(turn + 1)
out["parse"] = [suite.parse_action(t, True) for t in ("Guess 12", "I think guess 7.", "twelve")]
out["feedback"] = [suite.make(suite.tasks("train", 1)[0]).step(a).observation for a in ("guess 1", "guess 16")]
print(json.dumps(out))
"""
    out = json.loads(_python(user_env, code))
    assert out["listed"]
    assert out["types"] == {"train": ["large", "small"], "test": ["large", "small"], "ood": ["huge"]}
    assert out["solved"] == 18  # binary search: within ceil(log2(top)) guesses, under max_turns
    assert max(out["turns"]) <= 8  # log2(256) = 8 for the ood range
    assert out["parse"] == [["guess 12", True], ["guess 7", True], ["twelve", False]]
    # train task 0: range 1..16, secret random.Random(0).randint(1, 16) = 13
    assert out["feedback"] == ["1 is too low.", "16 is too high."]


@pytest.mark.slow
def test_generate_plays_the_example_through_the_cli(user_env, tiny_model, tmp_path):
    out = tmp_path / "gen"
    argv = ["generate", "--model", str(tiny_model), "--env", "guess", "--split", "train", "--tasks", "2",
            "--group-size", "2", "--output", str(out)]  # fmt: skip
    cli = [str(user_env / "bin" / "python"), "-m", "sdarflow.cli"]
    done = subprocess.run([*cli, *argv], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = storage.read_table(str(out), kind="trajectories", schema=TRAJECTORY_SCHEMA).to_pylist()
    assert rows and {r["env"] for r in rows} == {"guess"}
    assert {r["task_type"] for r in rows} <= {"small", "large"} and len({r["traj_id"] for r in rows}) == 4
