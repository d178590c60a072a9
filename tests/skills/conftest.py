"""A trajectory dataset written by hand for extraction tests: only the columns extraction reads carry meaning."""

from __future__ import annotations

import pyarrow as pa
import pytest

from sdarflow import storage
from sdarflow.schema import TRAJECTORY_SCHEMA

EPISODES = [
    ("cut", True, ["take carrot", "take knife", "slice carrot with knife", "prepare meal", "eat meal"]),
    ("cut", True, ["take knife", "take apple", "chop apple with knife", "prepare meal", "eat meal"]),
    ("cut", False, ["take carrot", "eat carrot"]),
    ("cook", True, ["take egg", "cook egg with stove", "prepare meal", "eat meal"]),
    ("cook", False, ["take egg", "look", "prepare meal"]),
]


def rows() -> list[dict]:
    out = []
    for e, (task_type, won, actions) in enumerate(EPISODES):
        for t, action in enumerate(actions):
            out.append(
                {
                    "run_id": "test",
                    "round": 0,
                    "task_id": f"game-{e}",
                    "group_id": f"test/r0/game-{e}",
                    "traj_id": f"game-{e}/g0",
                    "turn": t,
                    "task_type": task_type,
                    "split": "train",
                    "prompt_token_ids": [1, 2, 3],
                    "response_token_ids": [4, 5],
                    "response_text": action,
                    "rollout_logprobs": [-1.0, -1.0],
                    "reward": float(won and t == len(actions) - 1),
                    "episode_return": float(won),
                    "success": won,
                    "format_ok": True,
                    "policy_version": "base",
                    "prompt_messages": "[]",
                    "env": "textworld-cooking",
                    "num_turns": len(actions),
                }
            )
    return out


@pytest.fixture
def episodes_dataset(tmp_path) -> str:
    uri = str(tmp_path / "traj")
    table = pa.Table.from_pylist(rows(), schema=TRAJECTORY_SCHEMA)
    storage.write_table(table, uri, kind="trajectories", schema=TRAJECTORY_SCHEMA, config_hash="t", inputs=[])
    return uri
