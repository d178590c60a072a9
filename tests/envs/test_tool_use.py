"""The ``tool-use`` suite: deterministic tasks, a strict JSON call format, reward from the final state."""

from __future__ import annotations

import json

import pytest

from sdarflow.envs import EnvError, get_suite
from sdarflow.envs.tool_api import ToolAPI, ToolCallError, World, canonical, parse_call
from sdarflow.envs.tool_use import TOOL_SPLITS, ToolUseSuite


@pytest.fixture(scope="module")
def suite() -> ToolUseSuite:
    return get_suite("tool-use")


def play_expert(suite, task):
    env = suite.make(task)
    env.reset()
    steps = []
    while (action := env.expert_action()) is not None:
        steps.append(env.step(action))
    return env, steps


def test_tasks_are_deterministic_typed_and_split(suite) -> None:
    train = suite.tasks("train", 20)
    assert train == suite.tasks("train", 20) and [t.task_id for t in train][:2] == [
        "tool-use-train-1000",
        "tool-use-train-1001",
    ]
    types = {split: {t.task_type for t in suite.tasks(split, 10)} for split in ("train", "test", "ood")}
    assert types["train"] == types["test"] == {"write-note", "schedule", "invite", "cancel", "cleanup"}
    assert types["ood"] == {"agenda", "multi-invite"} and not types["ood"] & types["train"]
    assert {t.payload for t in train}.isdisjoint(t.payload for t in suite.tasks("test", 20))
    # `start` picks up where a previous round stopped and wraps at the split's size
    assert suite.tasks("train", 5, start=15) == train[15:]
    size = TOOL_SPLITS["train"].size
    assert [t.task_id for t in suite.tasks("train", 2, start=size - 1)] == [
        f"tool-use-train-{1000 + size - 1}",
        "tool-use-train-1000",
    ]
    with pytest.raises(EnvError, match=r"start=-1 .*fix: start >= 0"):
        suite.tasks("train", 1, start=-1)


@pytest.mark.parametrize("split", ["train", "test", "ood"])
def test_expert_plan_wins_and_parses_as_a_well_formed_action(suite, split) -> None:
    longest = 0
    for task in suite.tasks(split, 25):
        env, steps = play_expert(suite, task)
        assert steps[-1].done and steps[-1].won and steps[-1].reward == 1.0, task.task_id
        assert all(not s.done and s.reward == 0.0 for s in steps[:-1])
        assert steps[-1].info["malformed_calls"] == 0 and steps[-1].info["tool_errors"] == 0
        longest = max(longest, len(steps))
        for call in json.loads(task.payload)["plan"]:
            assert suite.parse_action(call, True) == (call, True)
    # OOD holds the longer tasks.
    assert longest >= (6 if split == "ood" else 3)


def test_malformed_calls_are_counted_and_change_nothing(suite) -> None:
    task = suite.tasks("train", 1)[0]  # write-note
    env = suite.make(task)
    env.reset()
    for bad in ('{"tool": "nope", "args": {}}', "write a note", '{"tool": "finish"}'):
        step = env.step(bad)
        assert "malformed call" in json.loads(step.observation)["error"] and not step.done
    assert step.info["malformed_calls"] == 3 and step.info["tool_errors"] == 0
    assert env.expert_action() == json.loads(task.payload)["plan"][0]  # state untouched


def test_format_is_strict_and_canonical(suite) -> None:
    messy = '  {"args": {"time": "09:00", "date": "2025-01-02", "title": "x"}, "tool": "create_event"} '
    action, ok = suite.parse_action(messy, True)
    assert ok and action == canonical("create_event", {"title": "x", "date": "2025-01-02", "time": "09:00"})
    assert suite.parse_action(messy, False)[1] is False  # cut at the token limit
    for bad in (
        '{"tool": "read_file", "args": {"path": "a.txt", "x": "1"}}',  # extra argument
        '{"tool": "read_file", "args": {"path": 3}}',  # not a string
        '{"tool": "read_file", "args": {"path": "a.txt"}, "note": 1}',  # extra key
        '[{"tool": "finish", "args": {}}]',
        "read_file(a.txt)",
    ):
        assert suite.parse_action(bad, True)[1] is False, bad
        with pytest.raises(ToolCallError):
            parse_call(bad)


def test_reward_checks_the_final_state_not_the_call_sequence(suite) -> None:
    task = next(t for t in suite.tasks("train", 20) if t.task_type == "cleanup")
    plan = json.loads(task.payload)["plan"]
    deletes = [c for c in plan if "delete_file" in c]
    env = suite.make(task)
    env.reset()
    for call in reversed(deletes):  # another order, no list_files: same final state
        assert not env.step(call).done
    assert env.step(canonical("finish")).won
    env.reset()  # now an extra write: the state differs from the goal
    for call in deletes + [canonical("write_file", {"path": "x/y.txt", "content": "z"}), canonical("finish")]:
        last = env.step(call)
    assert last.done and not last.won and last.reward == 0.0


def test_tool_errors_and_truncation() -> None:
    suite = ToolUseSuite(max_turns=2)
    env = suite.make(suite.tasks("train", 1)[0])
    env.reset()
    first = env.step(canonical("read_file", {"path": "nope.txt"}))
    assert (
        json.loads(first.observation) == {"error": "no such file: nope.txt"}
        and first.info["tool_errors"] == 1
    )
    last = env.step(canonical("list_files", {"folder": ""}))
    assert last.done and not last.won and last.info["truncated"]
    with pytest.raises(EnvError, match="ended"):
        env.step(canonical("finish"))
    assert env.expert_action() is None


def test_api_is_deterministic_and_validates() -> None:
    api = ToolAPI(World())
    assert api.call("create_event", {"title": "a", "date": "2025-01-02", "time": "09:00"}) == {"ok": True}
    assert (
        "exists" in api.call("create_event", {"title": "a", "date": "2025-01-03", "time": "10:00"})["error"]
    )
    assert (
        "bad date" in api.call("create_event", {"title": "b", "date": "tomorrow", "time": "10:00"})["error"]
    )
    assert "bad path" in api.call("write_file", {"path": "../etc/passwd", "content": ""})["error"]
    assert api.call("list_events", {"date": "2025-01-02"}) == {"events": [{"time": "09:00", "title": "a"}]}


def test_bad_requests() -> None:
    with pytest.raises(EnvError, match="unknown split 'dev'"):
        ToolUseSuite().tasks("dev", 1)
    with pytest.raises(EnvError, match="n=5000"):
        ToolUseSuite().tasks("train", TOOL_SPLITS["train"].size * 5)
    with pytest.raises(EnvError, match="max_turns"):
        ToolUseSuite(max_turns=0)
