"""Repair of a malformed tool call: the well-formed call a response most likely meant, for the format guard.

RL collapse on tool-using agents starts with one wrong token in the call wrapper (a misspelled key, a missing brace,
single quotes, a code fence around the JSON). The repair undoes exactly those: it keeps the JSON object the
response contains, closes unbalanced braces, maps each key and tool name to the closest one the format declares
(``difflib``, cutoff :data:`CUTOFF`), and returns the canonical call only when :func:`parse_call` accepts it. It
never invents a tool or an argument value, so a response that is not nearly a call gets no repair.
"""

from __future__ import annotations

import difflib
import json

from sdarflow.envs.tool_api import TOOLS, ToolCallError, canonical, parse_call

CUTOFF = 0.6  # difflib similarity a misspelled key or tool name needs to be taken for the declared one


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
