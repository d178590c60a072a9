"""The rollout loop with scripted engines and misbehaving envs: failures stay in their episode, hung envs time out,
identical groups are flagged, the action format is the suite's, and prompts that cannot fit stop the run early."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from rollout_fakes import FakeSuite, JsonSuite, ScriptedEngine, run

from sdarflow.errors import ConfigError
from sdarflow.rollout.envhost import call_all
from sdarflow.rollout.episode import RolloutParams
from sdarflow.rollout.loop import FORMAT_ERROR_OBS, run_rollout
from sdarflow.rollout.prompt import build_messages, encode_prompt, parse_action


def test_clean_run_metrics() -> None:
    result, engine = run(FakeSuite())
    m = result.metrics()
    assert m["rollout/episodes"] == 6 and m["rollout/success"] == 1.0 and m["rollout/mean_turns"] == 3
    assert m["rollout/mean_return"] == 1.0  # each episode's one winning reward
    assert (
        m["rollout/env_steps"] == 18 and m["rollout/env_errors"] == 0 and m["rollout/identical_groups"] == 0
    )
    assert m["rollout/format_error_rate"] == 0 and m["rollout/tokens"] == 18 * 4
    assert m["rollout/tokens_per_s"] > 0 and m["rollout/env_steps_per_s"] > 0
    assert engine.calls == [6, 6, 6]  # one engine call per turn for all live episodes
    assert all(r["success"] and r["num_turns"] == 3 and r["env"] == "fake" for r in result.rows)


def test_raising_env_fails_its_episodes_and_the_run_continues(caplog) -> None:
    suite = FakeSuite(bad={1: {"fail_on": 2}, 2: {"fail_reset": True}})
    with caplog.at_level(logging.WARNING, logger="sdarflow.rollout.loop"):
        result, _ = run(suite)
    by_task = {}
    for ep in result.episodes:
        by_task.setdefault(ep.task.task_id, []).append(ep)
    assert all(e.won and e.error is None for e in by_task["fake-0"])
    assert all(not e.won and "RuntimeError: simulator crashed" in e.error for e in by_task["fake-1"])
    assert all(len(e.rows) == 2 and not e.rows[0]["success"] for e in by_task["fake-1"])
    assert all(e.error.startswith("reset: OSError") and not e.rows for e in by_task["fake-2"])
    assert result.metrics()["rollout/env_errors"] == 4
    # fake-0's two wins of six episodes
    assert result.metrics()["rollout/mean_return"] == pytest.approx(2 / 6)
    assert "simulator crashed" in caplog.text and "fake-2" in caplog.text
    assert all(env.closed for env in suite.envs)


def test_hung_env_times_out_and_is_abandoned() -> None:
    release = threading.Event()
    suite = FakeSuite(bad={0: {"hang": release}})
    start = time.perf_counter()
    try:
        result, _ = run(suite, step_timeout_s=0.3, env_workers=4)
    finally:
        release.set()  # let the abandoned threads end
    assert time.perf_counter() - start < 10
    hung = [e for e in result.episodes if e.task.task_id == "fake-0"]
    assert all("TimeoutError: no result within 0.3 s" in e.error and e.hung for e in hung)
    assert all(e.won for e in result.episodes if e.task.task_id != "fake-0")
    assert result.metrics()["rollout/env_errors"] == 2
    assert not any(env.closed for env in suite.envs if env.task.task_id == "fake-0")  # never touched again


def test_identical_groups_are_flagged_only_when_sampling(caplog) -> None:
    with caplog.at_level(logging.WARNING):
        broken, _ = run(FakeSuite(), ScriptedEngine(seeded=False))
    assert broken.metrics()["rollout/identical_groups"] == 3
    assert "token-identical at temperature 1" in caplog.text
    greedy, _ = run(FakeSuite(), ScriptedEngine(seeded=False), temperature=0.0)
    assert greedy.metrics()["rollout/identical_groups"] == 0  # greedy groups are identical by design
    seeded, _ = run(FakeSuite(), ScriptedEngine(reply=lambda s: f"go {s % 1000}"))
    assert seeded.metrics()["rollout/identical_groups"] == 0
    # a confident policy repeats itself: each episode's 12 tokens at log-prob -0.01 are 89% likely to come again
    sure, _ = run(FakeSuite(), ScriptedEngine(seeded=False, logprob=-0.01))
    assert sure.metrics()["rollout/identical_groups"] == 0
    # the same replies at -0.6 a token (0.07% likely to repeat) are the seeding bug again
    unsure, _ = run(FakeSuite(), ScriptedEngine(seeded=False, logprob=-0.6))
    assert unsure.metrics()["rollout/identical_groups"] == 3


def test_action_format_is_the_suites() -> None:
    json_reply = ScriptedEngine(reply=lambda s: '{"do": "go"}')
    result, _ = run(JsonSuite(), json_reply)
    assert result.metrics()["rollout/success"] == 1.0
    # The default parser (text games) rejects the same JSON; the suite's hint is shown after a bad action.
    assert parse_action('{"do": "go"}', True)[1] is False
    result, _ = run(JsonSuite(), ScriptedEngine(reply=lambda s: "go"), max_turns=2)
    assert result.metrics()["rollout/format_error_rate"] == 1.0
    assert "Observation: Reply with JSON." in result.rows[1]["prompt_messages"]
    result, _ = run(FakeSuite(), ScriptedEngine(reply=lambda s: '{"do": "go"}'), max_turns=2)
    assert result.metrics()["rollout/format_error_rate"] == 1.0
    assert FORMAT_ERROR_OBS in result.rows[1]["prompt_messages"]


def test_malformed_turns_count_against_the_envs_turn_limit() -> None:
    result, _ = run(FakeSuite(), ScriptedEngine(reply=lambda s: "{bad}"), max_turns=1000)
    assert all(
        len(e.rows) == 8 and e.format_errors == 8 and e.env_steps == 0 for e in result.episodes
    )  # 3 + 5


def test_concurrent_env_steps_give_the_same_rows() -> None:
    one, _ = run(FakeSuite(goal=4), env_workers=1, step_timeout_s=0)
    many, _ = run(FakeSuite(goal=4), env_workers=4)
    assert one.rows == many.rows


def test_suites_not_declaring_thread_safety_are_stepped_one_at_a_time(monkeypatch) -> None:
    import sdarflow.rollout.envhost as envhost

    seen = []
    real = envhost.call_all
    monkeypatch.setattr(envhost, "call_all", lambda calls, t, w=1: seen.append(w) or real(calls, t, w))
    suite = FakeSuite()
    suite.thread_safe = False
    run(suite, env_workers=4)
    assert set(seen) == {1}
    seen.clear()
    run(FakeSuite(), env_workers=4)
    assert 4 in seen


def test_prompt_too_long_stops_before_the_engine_runs() -> None:
    engine = ScriptedEngine()
    suite = FakeSuite(instruction_chars=500)
    with pytest.raises(ConfigError, match=r"task fake-0: the first prompt is \d+ tokens, over the 400"):
        run(suite, engine, max_prompt_tokens=400)
    assert engine.calls == [] and all(env.closed for env in suite.envs)


def test_prompt_outgrowing_the_context_ends_the_episode() -> None:
    engine = ScriptedEngine()
    first = len(encode_prompt(engine.tokenizer, build_messages("count to 10", [], "0")))
    suite = FakeSuite(goal=10, bad={0: {"obs_growth": 40}})  # task 0's observations grow 40 characters a step
    result, _ = run(suite, engine, max_prompt_tokens=first + 60, max_turns=10)
    grown = [e for e in result.episodes if e.task.task_id == "fake-0"]
    assert all(e.context_exceeded and not e.won and e.error is None and 1 <= len(e.rows) < 10 for e in grown)
    assert result.metrics()["rollout/context_exceeded"] == 2
    assert all(e.won for e in result.episodes if e.task.task_id != "fake-0")


def test_call_all_captures_errors_and_timeouts() -> None:
    gate = threading.Event()

    def boom():
        raise ValueError("bad")

    outs = call_all([lambda: 1, boom, lambda: gate.wait(5)], timeout_s=0.2, workers=3)
    gate.set()
    assert outs[0].value == 1 and outs[0].ok
    assert outs[1].error.startswith("ValueError: bad at test_loop.py:")
    assert outs[2].error.startswith("TimeoutError") and outs[2].timed_out
    assert not outs[1].timed_out  # an env that raises its own TimeoutError is a failure, not a hung call
    assert [o.value for o in call_all([lambda: 2, lambda: 3], timeout_s=0)] == [2, 3]


@pytest.mark.parametrize("env_process", [False, True])
def test_expert_labels_record_the_experts_action_at_each_turns_state(env_process) -> None:
    """On real search-qa questions an engine that always sends the expert's first search matches the expert on turn 0
    and not on turn 1, where the expert has moved on to the next hop; without labels the columns stay unset."""
    from sdarflow.envs import get_suite

    suite = get_suite("search-qa")
    for task in suite.tasks("train", 20):
        env = suite.make(task)
        env.reset()
        first = env.expert_action()
        env.close()
        if first.startswith("search["):
            break
    engine = ScriptedEngine(reply=lambda seed: first)
    labelled = run_rollout(
        engine, suite, [task], 2, RolloutParams(max_turns=2, expert_labels=True, env_process=env_process),
        engine.tokenizer, run_id="t", round_=0, policy_version="p",
    ).rows  # fmt: skip
    assert [(r["turn"], r["expert_action"] == first, r["expert_match"]) for r in labelled] == [
        (0, True, True), (1, False, False), (0, True, True), (1, False, False),
    ]  # fmt: skip
    assert all(r["expert_action"].startswith(("search[", "answer[")) for r in labelled)
    plain, _ = run(suite, ScriptedEngine(reply=lambda seed: first), n_tasks=1, max_turns=1)
    assert all("expert_action" not in r and "expert_match" not in r for r in plain.rows)


def test_expert_labels_by_hand() -> None:
    from sdarflow.rollout.loop import expert_labels

    assert expert_labels("take  Knife", "take knife") == {
        "expert_action": "take  Knife",
        "expert_match": True,
    }
    assert expert_labels("take knife", None)["expert_match"] is False  # a malformed reply matches nothing
    assert expert_labels(None, "take knife") == {"expert_action": None, "expert_match": None}
