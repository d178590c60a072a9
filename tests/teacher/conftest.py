"""Trajectory datasets built by hand with the tiny model's real tokenizer and chat template (no env rollouts), so
rescoring tests run in seconds."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from sdarflow import storage
from sdarflow.cli import main
from sdarflow.models.policy import load_tokenizer
from sdarflow.rollout.prompt import build_messages, dumps, encode_prompt
from sdarflow.schema import TRAJECTORY_SCHEMA

GAMES = [
    ("cut", "Goal: slice the red apple, then prepare and eat the meal.", ["take red apple", "take knife"]),
    (
        "cook",
        "Goal: fry the yellow egg, then prepare and eat the meal.",
        ["take yellow egg", "cook yellow egg with stove"],
    ),
    (
        "cut",
        "Goal: dice the carrot, then prepare and eat the meal.",
        ["take carrot", "take knife", "dice carrot with knife"],
    ),
    ("cook", "Goal: roast the potato, then prepare and eat the meal.", ["take potato"]),
]
ACTIONS = ["take knife", "prepare meal", "eat meal", "look", "open fridge", "chop red apple with knife"]


def make_rows(tokenizer, task_types: list[str] | None = None) -> list[dict]:
    """Two episodes per game, one won and one lost, 1-3 turns each: mixed prompt and response lengths."""
    rows = []
    for g, (task_type, goal, history) in enumerate(GAMES):
        task_type = task_types[g] if task_types else task_type
        for e in range(2):
            traj = f"g{g}/e{e}"
            turns = 1 + (g + e) % 3
            for t in range(turns):
                msgs = build_messages(goal, history[: t + e], f"You are in the kitchen. Turn {t}.")
                action = ACTIONS[(g + e + t) % len(ACTIONS)]
                response = tokenizer(action, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
                rows.append(
                    {
                        "run_id": "test",
                        "round": 0,
                        "task_id": f"game-{g}",
                        "group_id": f"test/r0/game-{g}",
                        "traj_id": traj,
                        "turn": t,
                        "task_type": task_type,
                        "split": "train",
                        "prompt_token_ids": encode_prompt(tokenizer, msgs),
                        "response_token_ids": response,
                        "response_text": action,
                        "rollout_logprobs": [-1.0] * len(response),
                        "reward": float(e == 0 and t == turns - 1),
                        "episode_return": float(e == 0),
                        "success": e == 0,
                        "format_ok": True,
                        "policy_version": "base",
                        "prompt_messages": dumps(msgs),
                        "env": "textworld-cooking",
                        "num_turns": turns,
                    }
                )
    return rows


def write_trajectories(uri: str, rows: list[dict]) -> str:
    table = pa.Table.from_pylist(rows, schema=TRAJECTORY_SCHEMA)
    storage.write_table(
        table, uri, kind="trajectories", schema=TRAJECTORY_SCHEMA, config_hash="test", inputs=[]
    )
    return uri


@pytest.fixture(scope="session")
def tokenizer(tiny_model):
    return load_tokenizer(str(tiny_model))


@pytest.fixture
def rescore(capsys, tiny_model):
    """Run ``sdarflow rescore`` through the CLI; returns (exit code, result JSON or the one error line)."""

    def run(traj: str, skills: str, out: str, *flags: str) -> tuple[int, dict | str]:
        argv = ["rescore", "--input", traj, "--skills", skills, "--model", str(tiny_model), "--output", out]
        code = main([*argv, *flags])
        captured = capsys.readouterr()
        if code == 0:
            return code, json.loads(captured.out)
        return code, captured.err.strip().splitlines()[-1]

    return run


@pytest.fixture
def student_rows(tokenizer) -> list[dict]:
    """The hand-built trajectory rows as dicts (for tests that call the rescoring functions directly)."""
    return make_rows(tokenizer)


@pytest.fixture
def write_dataset(tmp_path):
    """Write trajectory rows as a dataset named ``name`` under tmp_path; returns its URI."""
    return lambda name, rows: write_trajectories(str(tmp_path / name), rows)


@pytest.fixture
def dataset(tmp_path, tokenizer):
    """Write a hand-built trajectory dataset; ``task_types`` overrides the four games' types."""

    def make(name: str = "traj", task_types: list[str] | None = None) -> str:
        return write_trajectories(str(tmp_path / name), make_rows(tokenizer, task_types))

    return make


@pytest.fixture(scope="session")
def published_adapter(tiny_model, tmp_path_factory) -> str:
    """A LoRA adapter on the tiny model whose B weights are random (PEFT starts them at zero, a no-op adapter), so
    the adapted policy differs from the base model."""
    import torch

    from sdarflow.models.policy import load_policy, new_lora

    model = new_lora(load_policy(str(tiny_model)).model, rank=4, alpha=8, targets=["q_proj", "v_proj"])
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.05)
    staged = tmp_path_factory.mktemp("adapter-staged")
    model.save_pretrained(str(staged))
    out = tmp_path_factory.mktemp("adapter") / "published"
    storage.publish_dir(staged, str(out), kind="adapter")  # as the train stage publishes its adapters
    return str(out)


@pytest.fixture
def reference_library(tmp_path) -> str:
    """The reference-layout library, published as a stage's output is (a hand-made folder needs
    --allow-unpublished)."""
    out = str(tmp_path / "reference_library")
    storage.publish_dir(
        Path(__file__).parents[1] / "skills" / "data" / "reference_library", out, kind="skills"
    )
    return out
