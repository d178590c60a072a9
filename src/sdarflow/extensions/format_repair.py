"""The format guard's remedy (``train --format-guard repair``): each malformed turn of a round whose env can tell the
well-formed action it meant becomes an SFT pair, prompt -> repaired action, trained besides the RL update. An env's
repair is registered here by its name (:data:`REPAIRS`), or is its suite's own ``repair_action(text) -> action or
None`` (a plug-in env's); an env with neither repairs nothing.

``tool-use`` (:func:`repair_call`): RL collapse on tool-using agents starts with one wrong token in the call wrapper (a
misspelled key, a missing brace, single quotes, a code fence). It keeps the JSON object the response contains,
closes unbalanced braces, maps each key and tool name to the closest declared one (``difflib``, cutoff
:data:`CUTOFF`) and returns the canonical call only when :func:`parse_call` accepts it: it never invents a tool or an
argument value.

``search-qa`` (:func:`repair_qa`): ``search[...]``/``answer[...]`` a malformed response meant: another bracket, a near
verb (``serch``, ``Answer:``), a missing closing bracket; None when it is not nearly an action.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable

from sdarflow.envs.search_qa import normalize, parse_qa_action
from sdarflow.envs.tool_api import TOOLS, ToolCallError, canonical, parse_call

CUTOFF = 0.6  # difflib similarity a misspelled key, tool name or verb needs to be taken for the declared one


def _closest(name: object, choices) -> str | None:
    if not isinstance(name, str):
        return None
    found = difflib.get_close_matches(name, list(choices), n=1, cutoff=CUTOFF)
    return found[0] if found else None


def _load(text: str) -> object:
    """The JSON object in ``text``: from its first '{' to its last '}', braces closed, single quotes tried."""
    start = text.find("{")
    if start < 0:
        return None
    body = text[start : text.rfind("}") + 1 if "}" in text[start:] else len(text)]
    body += "}" * max(0, body.count("{") - body.count("}"))
    for candidate in (body, body.replace("'", '"')):
        try:
            return json.loads(candidate)
        except json.JSONDecodeError:
            continue
    return None


def repair_call(text: str) -> str | None:
    """The canonical call ``text`` was meant to be, or None when it cannot be told."""
    obj = _load(text)
    if not isinstance(obj, dict) or len(obj) != 2:
        return None
    keys = {_closest(k, ("tool", "args")): v for k, v in obj.items()}
    tool = _closest(keys.get("tool"), TOOLS)
    args = keys.get("args")
    if tool is None or not isinstance(args, dict):
        return None
    named = {_closest(k, TOOLS[tool]): v for k, v in args.items()}
    if len(named) != len(args) or set(named) != set(TOOLS[tool]):
        return None
    try:
        return canonical(*parse_call(canonical(tool, named)))
    except ToolCallError:
        return None


# a verb, then a bracketed argument
_QA_LOOSE = re.compile(r"^(\w+)\s*[:\[({]\s*([^\[\](){}]{1,80}?)\s*[\])}]?$")


def repair_qa(text: str) -> str | None:
    """The ``search[...]``/``answer[...]`` action ``text`` was meant to be, or None."""
    match = _QA_LOOSE.match(normalize(text))
    if not match:
        return None
    verb = difflib.get_close_matches(match[1], ("search", "answer"), n=1, cutoff=CUTOFF)
    repaired = f"{verb[0]}[{match[2].strip()}]" if verb else ""
    return repaired if parse_qa_action(repaired) else None


REPAIRS: dict[str, Callable[[str], str | None]] = {"tool-use": repair_call, "search-qa": repair_qa}


def suites_of(rows: list[dict]) -> dict[str, object]:
    """The env suite of each env the rows come from, built once per env (a suite may build an index)."""
    from sdarflow.envs import get_suite

    return {env: get_suite(env) for env in sorted({r["env"] for r in rows})}


def repair_pairs(rows: list[dict], tokenizer, eos_id: int) -> tuple[list, dict[str, float]]:
    """(SFT pairs prompt -> repaired call + eos for the malformed turns the env can repair, metrics).

    A repair is taught in the turn's prompt format (``reference``: inside the reply's tags, its reasoning kept when
    it closed) and counts only when the rollout's parser accepts it."""
    from sdarflow.rollout.loop import action_parser
    from sdarflow.rollout.prompt import format_of, format_response, loads
    from sdarflow.train.sft import SFTPair

    malformed = [r for r in rows if not r["format_ok"] and r["response_token_ids"]]
    suites = suites_of(malformed)
    pairs = []
    for r in malformed:
        suite = suites[r["env"]]
        repair = REPAIRS.get(r["env"]) or getattr(suite, "repair_action", None)
        repaired = repair(r["response_text"]) if repair else None
        fmt = format_of(loads(r["prompt_messages"]))
        thought = r["response_text"].partition("<think>")[2].partition("</think>")
        reply = None if repaired is None else format_response(repaired, fmt, thought[0] if thought[1] else "")
        if reply is None or not action_parser(suite, fmt)(reply, True)[1]:
            continue
        target = tokenizer(reply, add_special_tokens=False)["input_ids"] + [eos_id]
        pairs.append(SFTPair(list(r["prompt_token_ids"]), target))
    metrics = {"format/malformed_turns": float(len(malformed)), "format/repaired_turns": float(len(pairs))}
    return pairs, metrics
