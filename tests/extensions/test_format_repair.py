"""Repair of malformed actions (what --format-guard repair teaches back): the one-token slips a collapsing policy
makes are repaired to the canonical action, anything that is not nearly an action is left alone, and the SFT pairs
target the repaired action in the turn's prompt format."""

from __future__ import annotations

import pytest

from sdarflow.envs import get_suite
from sdarflow.extensions.format_repair import repair_call, repair_pairs, repair_qa

READ = '{"tool": "read_file", "args": {"path": "notes/a.txt"}}'


@pytest.mark.parametrize(
    "text",
    [
        '{"tol": "read_file", "args": {"path": "notes/a.txt"}}',  # a misspelled key
        "{'tool': 'read_file', 'args': {'path': 'notes/a.txt'}}",  # single quotes
        '{"tool": "read_file", "args": {"path": "notes/a.txt"}',  # a missing brace
        '```json\n{"tool": "read_fle", "args": {"pth": "notes/a.txt"}}\n```',  # a fence, two near names
        'Call: {"args": {"path": "notes/a.txt"}, "tool": "read_file"} done',  # text around it, keys reordered
    ],
)
def test_tool_call_slips_are_repaired_to_the_canonical_call(text):
    suite = get_suite("tool-use")
    assert suite.parse_action(text, True)[1] is False
    assert repair_call(text) == READ
    assert suite.parse_action(READ, True) == (READ, True)


@pytest.mark.parametrize(
    "text",
    [
        "read the file",  # no call at all
        '{"tool": "launch_rocket", "args": {}}',  # a tool the API does not have: never guessed
        '{"tool": "read_file", "args": {"path": 3}}',  # a value of the wrong type: not invented
        '{"tool": "read_file", "args": {"path": "a.txt", "mode": "r"}}',  # an extra argument
        '{"tool": "write_file", "args": {"path": "a.txt"}}',  # a missing argument
    ],
)
def test_what_is_not_nearly_a_call_gets_no_repair(text):
    assert repair_call(text) is None


@pytest.mark.parametrize(
    ("text", "repaired"),
    [
        ("serch[acme corp]", "search[acme corp]"),
        ("Answer: Paris", "answer[paris]"),
        ("search(bob smith)", "search[bob smith]"),
        ("answer[paris", "answer[paris]"),
        ("look[x]", None),
        ("the answer is paris", None),
    ],
)
def test_search_qa_actions_are_repaired(text, repaired):
    assert repair_qa(text) == repaired


def test_repair_pairs_target_the_repaired_call_and_skip_what_cannot_be_repaired(tiny_model):
    from sdarflow.models import load_policy
    from sdarflow.rollout.prompt import build_messages, dumps

    policy = load_policy(str(tiny_model))
    call = '{"tool": "list_files", "args": {"folder": "notes"}}'
    command, reference = (
        dumps(build_messages("list notes", [], "Ready.", 4, f)) for f in ("command", "reference")
    )
    rows = [
        {"env": "tool-use", "format_ok": False, "prompt_token_ids": [5, 6], "response_token_ids": [9],
         "response_text": call.replace('"tool"', '"tol"'), "prompt_messages": command},
        {"env": "tool-use", "format_ok": False, "prompt_token_ids": [7], "response_token_ids": [9],
         "response_text": "list the files", "prompt_messages": command},  # no call in it
        {"env": "tool-use", "format_ok": True, "prompt_token_ids": [8], "response_token_ids": [9],
         "response_text": call, "prompt_messages": command},  # well formed: not a repair target
        # the reference format: the repair goes inside the tags, the reply's closed reasoning is kept
        {"env": "tool-use", "format_ok": False, "prompt_token_ids": [3], "response_token_ids": [9],
         "response_text": f"<think>list them</think> {call.replace('tool', 'tol')}", "prompt_messages": reference},
    ]  # fmt: skip
    pairs, metrics = repair_pairs(rows, policy.tokenizer, policy.eos_id)
    assert metrics == {"format/malformed_turns": 3.0, "format/repaired_turns": 2.0}
    assert [p.prompt for p in pairs] == [[5, 6], [3]]
    assert pairs[0].response[-1] == policy.eos_id
    assert policy.tokenizer.decode(pairs[0].response[:-1]) == call
    assert (
        policy.tokenizer.decode(pairs[1].response[:-1])
        == f"<think>list them</think>\n<action>{call}</action>"
    )


def test_a_suite_without_a_registered_repair_is_repaired_by_its_own_repair_action(tiny_model, monkeypatch):
    from sdarflow.envs.textworld_cooking import TextWorldCookingSuite
    from sdarflow.models import load_policy
    from sdarflow.rollout.prompt import build_messages, dumps

    policy = load_policy(str(tiny_model))
    row = {"env": "textworld-cooking", "format_ok": False, "prompt_token_ids": [5], "response_token_ids": [9],
           "response_text": "I will LOOK around", "prompt_messages": dumps(build_messages("cook", [], "Ready.", 4))}  # fmt: skip
    assert repair_pairs([row], policy.tokenizer, policy.eos_id)[0] == []  # no repair: nothing to train on
    # a plug-in env's suite brings its own repair
    monkeypatch.setattr(TextWorldCookingSuite, "repair_action", lambda self, text: "look", raising=False)
    pairs, metrics = repair_pairs([row], policy.tokenizer, policy.eos_id)
    assert metrics == {"format/malformed_turns": 1.0, "format/repaired_turns": 1.0}
    assert policy.tokenizer.decode(pairs[0].response[:-1]) == "look"
