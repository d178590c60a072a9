"""The reference prompt format: the prompt as the SDAR reference shapes it, its reply parsed as the reference's
``alfworld_projection`` reads it, admissible actions from the envs, and the format chosen per model."""

from __future__ import annotations

import pytest
from rollout_fakes import FakeSuite, JsonSuite, ScriptedEngine, run

from sdarflow.envs import get_suite
from sdarflow.rollout.engine import REASONING_TOKENS, action_tokens, prompt_format
from sdarflow.rollout.loop import action_parser
from sdarflow.rollout.prompt import (
    build_messages,
    format_of,
    format_response,
    goal_of,
    insert_skills,
    parse_reference,
)


def test_the_prompt_lists_the_task_history_observation_and_admissible_actions():
    goal = "Prepare the meal.\nRecipe: slice the apple"
    [msg] = build_messages(
        goal, ["open fridge", "take apple"], "You see a knife.", 1, "reference", ("slice apple", "eat apple")
    )
    assert msg["role"] == "user"
    text = msg["content"]
    assert text.startswith(
        f"You are an expert agent operating in a text environment. Your task is to: {goal}\n"
    )
    assert "already taken 2 step(s). Below are the most recent 1 actions you took: take apple\n" in text
    assert "You are now at step 3 and your current observation is: You see a knife.\n" in text
    assert "Your admissible actions of the current situation are: ['slice apple'\n 'eat apple'].\n" in text
    assert "enclosed within <think> </think> tags" in text and "within <action> </action> tags" in text
    assert goal_of([msg]) == goal and format_of([msg]) == "reference"
    first = build_messages(goal, [], "A kitchen.", 4, "reference")[0]["content"]
    assert "admissible" not in first.split("Now it's")[0] and "most recent 0 actions you took: none" in first
    command = build_messages(goal, [], "A kitchen.")
    assert goal_of(command) == goal and format_of(command) == "command"


@pytest.mark.parametrize(
    "reply, expected",
    [
        ("<think>the knife is here</think>\n<action>Slice Apple</action>", ("slice apple", True)),
        ("<THINK>x</THINK><ACTION> take  knife </ACTION> trailing", ("take knife", True)),
        ("<think></think><action>look</action>", ("look", True)),
        ("<action>look</action>", ("", False)),  # no reasoning tags
        ("<think>x</think> look", ("", False)),  # no action tag
        ("<think>x</think><action>look", ("", False)),  # unclosed: cut at the token limit
        ("<think>x</think></action>look<action>", ("", False)),  # tags out of order
        ("<think>看</think><action>look</action>", ("", False)),  # Chinese characters
        ("<think>x</think><action>take the red apple from the kitchen counter now</action>", ("take the red apple from the kitchen counter now", False)),  # the command parser's word limit
    ],
)  # fmt: skip
def test_replies_are_read_as_the_reference_projection_reads_them(reply, expected):
    assert parse_reference(reply, finished=False) == expected


def test_the_action_inside_the_tag_goes_through_the_envs_own_parser():
    search = get_suite("search-qa")
    parse = action_parser(search, "reference")
    assert parse("<think>look it up</think><action>Search[ Foo  Bar ]</action>", True) == (
        "search[foo bar]",
        True,
    )
    assert parse("<think>hm</think><action>foo bar</action>", True)[1] is False  # not a search or answer
    assert action_parser(search, "command") == search.parse_action
    reply = format_response("search[foo]", "reference", "why")
    assert reply == "<think>why</think>\n<action>search[foo]</action>" and parse(reply, True) == (
        "search[foo]",
        True,
    )
    assert format_response("go", "command") == "go"


def test_skills_go_into_a_system_message_the_reference_prompt_does_not_have():
    msgs = build_messages("goal", [], "obs", 4, "reference")
    system = insert_skills(msgs, "- wash first", "system")
    assert [m["role"] for m in system] == ["system", "user"] and system[0][
        "content"
    ] == "Skills:\n- wash first"
    assert insert_skills(msgs, "- wash first", "user")[0]["content"].startswith(
        "Skills:\n- wash first\nYou are"
    )


def test_the_budget_adds_the_reasoning_and_auto_picks_by_the_models_chat_template(tiny_model):
    from transformers import AutoTokenizer

    tool_use = get_suite("tool-use")
    assert (
        action_tokens(tool_use, 0) == 64 and action_tokens(tool_use, 0, "reference") == 64 + REASONING_TOKENS
    )
    assert action_tokens(tool_use, 40, "reference") == 40  # asked for: as asked
    tiny = AutoTokenizer.from_pretrained(tiny_model)
    assert prompt_format("auto", tiny) == "command" and prompt_format("reference", tiny) == "reference"
    tiny.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"  # any other model's template
    assert prompt_format("auto", tiny) == "reference"


def _reply(seed: int) -> str:
    return "<think>one more</think>\n<action>go</action>" if seed % 3 else "go"  # a third answer without tags


def test_a_rollout_in_the_reference_format_counts_untagged_replies_as_format_errors():
    result, _ = run(FakeSuite(), ScriptedEngine(_reply), n_tasks=2, prompt_format="reference", max_turns=8)
    rows = result.rows
    assert all(r["format_ok"] == ("<action>" in r["response_text"]) for r in rows)
    assert any(not r["format_ok"] for r in rows) and all(e.won for e in result.episodes)
    assert all("Your task is to: count to 3" in r["prompt_messages"] for r in rows)


def test_a_suite_parser_refuses_what_its_format_refuses_inside_the_tag():
    result, _ = run(JsonSuite(), ScriptedEngine(lambda s: '<think>x</think><action>{"do": "go"}</action>'),
                    prompt_format="reference")  # fmt: skip
    assert all(r["format_ok"] for r in result.rows) and all(e.won for e in result.episodes)
    result, _ = run(
        JsonSuite(),
        ScriptedEngine(lambda s: "<think>x</think><action>go</action>"),
        prompt_format="reference",
    )
    assert not any(r["format_ok"] for r in result.rows)


@pytest.mark.parametrize("env_process", [False, True])
def test_textworld_admissible_actions_reach_the_prompt_each_turn(env_process):
    suite = get_suite("textworld-cooking")
    replies = iter(["<think>read it</think><action>examine cookbook</action>"] * 100)
    engine = ScriptedEngine(lambda s: next(replies))
    result, _ = run(suite, engine, n_tasks=1, group_size=2, max_turns=2, prompt_format="reference",
                    env_process=env_process, step_timeout_s=60.0)  # fmt: skip
    for row in result.rows:
        assert "Your admissible actions of the current situation are: [" in row["prompt_messages"]
        assert "'examine cookbook'" in row["prompt_messages"] and row["format_ok"]
    assert [r["turn"] for r in result.rows] == [0, 1, 0, 1]


def test_skills_read_the_action_inside_the_tag():
    from sdarflow.rollout.prompt import action_of, dumps
    from sdarflow.skills.extract import episodes_from_rows

    reference = build_messages("Cook it.", [], "A kitchen.", 4, "reference")
    assert action_of("<think>hm</think>\n<action> Slice  Apple </action>", reference) == "slice apple"
    assert action_of(" Slice  Apple ", build_messages("Cook it.", [], "A kitchen.")) == "slice apple"
    rows = [
        {"traj_id": "t", "turn": i, "task_id": "a", "task_type": "x", "success": True, "format_ok": ok,
         "response_text": text, "prompt_messages": dumps(reference)}
        for i, (text, ok) in enumerate([("<think></think><action>open fridge</action>", True), ("prose", False)])
    ]  # fmt: skip
    [episode] = episodes_from_rows(rows)
    assert episode.actions == ("open fridge",) and episode.goal == "Cook it."
