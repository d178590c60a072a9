"""Repair of malformed actions (what --format-guard repair teaches back): the one-token slips a collapsing policy
makes are repaired to the canonical action, and anything that is not nearly an action is left alone."""

from __future__ import annotations

import pytest

from sdarflow.envs import get_suite

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
    assert suite.repair_action(text) == READ
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
    assert get_suite("tool-use").repair_action(text) is None


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
    assert get_suite("search-qa").repair_action(text) == repaired
