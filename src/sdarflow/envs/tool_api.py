"""The deterministic in-process API behind the ``tool-use`` env (files + calendar) and its strict call format.

A call is one JSON object ``{"tool": NAME, "args": {...}}`` whose ``args`` hold exactly the string arguments the
tool declares in :data:`TOOLS`. :func:`parse_call` is the whole format contract: the suite's ``parse_action`` (what
the agent is graded on) and the env's ``step`` (what the API executes) both call it, so the two cannot drift.
Results are small JSON objects (the agent's next observation); tool errors are results, never exceptions.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field

# Tool name -> its argument names, in the order the canonical form writes them.
TOOLS: dict[str, tuple[str, ...]] = {
    "list_files": ("folder",),
    "read_file": ("path",),
    "write_file": ("path", "content"),
    "delete_file": ("path",),
    "list_events": ("date",),
    "create_event": ("title", "date", "time"),
    "delete_event": ("title",),
    "finish": (),
}
FINISH = "finish"
MAX_CALL_CHARS = 400  # a response this long is a rambling model, not a call

_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_TIME = re.compile(r"^\d{2}:\d{2}$")
_PATH = re.compile(r"^[a-z0-9_\-]+(/[a-z0-9_\-]+)*\.txt$")


class ToolCallError(ValueError):
    """A response that is not a well-formed tool call (a format error, not a tool error)."""


def parse_call(text: str) -> tuple[str, dict[str, str]]:
    """(tool, args) of a strict JSON call; ToolCallError saying what is wrong otherwise."""
    text = text.strip()
    if not text or len(text) > MAX_CALL_CHARS:
        raise ToolCallError(f"a call is one JSON object of at most {MAX_CALL_CHARS} characters")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as err:
        raise ToolCallError(f"not JSON ({err.msg})") from err
    if not isinstance(obj, dict) or set(obj) != {"tool", "args"}:
        raise ToolCallError('expected exactly the keys "tool" and "args"')
    tool, args = obj["tool"], obj["args"]
    if tool not in TOOLS:
        raise ToolCallError(f"unknown tool {tool!r}")
    if not isinstance(args, dict) or set(args) != set(TOOLS[tool]):
        raise ToolCallError(f"{tool} takes exactly the args {list(TOOLS[tool])}")
    if not all(isinstance(v, str) for v in args.values()):
        raise ToolCallError(f"{tool}: every argument is a string")
    return tool, {name: args[name] for name in TOOLS[tool]}


def canonical(tool: str, args: dict[str, str] | None = None) -> str:
    """The one spelling of a call (key order fixed), used for actions in history and expert walkthroughs."""
    args = args or {}
    return json.dumps({"tool": tool, "args": {name: args[name] for name in TOOLS[tool]}}, ensure_ascii=False)


def result_text(result: dict) -> str:
    """A result as the observation string the agent reads."""
    return json.dumps(result, ensure_ascii=False, sort_keys=True)


@dataclass
class World:
    """The API's whole state: files by path, and calendar events by title as (date, time)."""

    files: dict[str, str] = field(default_factory=dict)
    events: dict[str, tuple[str, str]] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"files": dict(self.files), "events": {k: list(v) for k, v in self.events.items()}}

    @classmethod
    def from_json(cls, data: dict) -> World:
        return cls(dict(data.get("files", {})), {k: (v[0], v[1]) for k, v in data.get("events", {}).items()})


class ToolAPI:
    """Executes calls against a private copy of a :class:`World`. Deterministic: same calls, same results."""

    def __init__(self, world: World) -> None:
        self.world = copy.deepcopy(world)
        self.finished = False

    def call(self, tool: str, args: dict[str, str]) -> dict:
        """Run one parsed call; a result dict with ``error`` when the call cannot be done (state unchanged)."""
        return getattr(self, f"_{tool}")(**args)

    def _list_files(self, folder: str) -> dict:
        prefix = folder.strip("/") + "/" if folder.strip("/") else ""
        return {"files": sorted(p for p in self.world.files if p.startswith(prefix))}

    def _read_file(self, path: str) -> dict:
        if path not in self.world.files:
            return {"error": f"no such file: {path}"}
        return {"content": self.world.files[path]}

    def _write_file(self, path: str, content: str) -> dict:
        if not _PATH.match(path):
            return {"error": f"bad path {path!r}: use lower-case folder/name.txt"}
        self.world.files[path] = content
        return {"ok": True}

    def _delete_file(self, path: str) -> dict:
        if self.world.files.pop(path, None) is None:
            return {"error": f"no such file: {path}"}
        return {"ok": True}

    def _list_events(self, date: str) -> dict:
        if not _DATE.match(date):
            return {"error": f"bad date {date!r}: use YYYY-MM-DD"}
        day = sorted((t, title) for title, (d, t) in self.world.events.items() if d == date)
        return {"events": [{"time": t, "title": title} for t, title in day]}

    def _create_event(self, title: str, date: str, time: str) -> dict:
        if not _DATE.match(date) or not _TIME.match(time):
            return {"error": f"bad date/time {date!r} {time!r}: use YYYY-MM-DD and HH:MM"}
        if title in self.world.events:
            return {"error": f"an event titled {title!r} exists"}
        self.world.events[title] = (date, time)
        return {"ok": True}

    def _delete_event(self, title: str) -> dict:
        if self.world.events.pop(title, None) is None:
            return {"error": f"no event titled {title!r}"}
        return {"ok": True}

    def _finish(self) -> dict:
        self.finished = True
        return {"ok": True, "finished": True}


def run_plan(world: World, plan: list[str]) -> World:
    """The world after executing ``plan`` (canonical calls): how a task's goal state is defined."""
    api = ToolAPI(world)
    for call in plan:
        result = api.call(*parse_call(call))
        if "error" in result:
            raise ValueError(f"gold plan step {call} failed: {result['error']}")  # a generator bug
    return api.world
