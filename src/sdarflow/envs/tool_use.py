"""The ``tool-use`` env suite: multi-turn function calling against the files + calendar API of ``tool_api``.

Each task is generated from its seed (no files on disk): a starting :class:`~sdarflow.envs.tool_api.World`, an
instruction, and the gold call sequence. The goal state is the world after the gold calls, and the reward is 1.0
when the final state equals it (checked when the agent calls ``finish`` or the turn limit ends the episode), so
any sequence of calls that reaches the same state wins. The action is the JSON call text; the observation is the
tool's result. ``train``/``test`` share task types on disjoint seeds; ``ood`` holds an unseen tool combination
(calendar -> file) and longer tasks (several invitations).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass

from sdarflow.envs import tool_api
from sdarflow.envs.base import (
    Reset,
    SkillTruth,
    Step,
    Task,
    check_max_turns,
    check_step,
    split_spec,
    task_indices,
    task_number,
)
from sdarflow.envs.tool_api import FINISH, TOOLS, ToolAPI, ToolCallError, World, canonical, parse_call

_TOPICS = ("budget", "garden", "recipes", "travel", "books", "music", "fitness", "taxes", "repairs", "movies")
_VERBS = ("buy", "call", "fix", "pay", "plan", "send", "check", "book")
_NOUNS = ("milk", "rent", "the bike", "flights", "the plumber", "invoices", "tickets", "the car", "a gift")
_DAYS = ("monday", "tuesday", "friday", "the weekend", "tomorrow", "next week")
_TITLES = (
    "team sync", "dentist", "yoga class", "design review", "lunch with ana", "code review", "piano lesson",
    "budget meeting", "car service", "book club", "standup", "retro", "doctor", "interview", "haircut",
)  # fmt: skip
_PEOPLE = ("ana", "bo", "cai", "dev", "eli", "fay", "gus", "hal", "ivy", "jon")

TOOLS_LINE = "Tools: " + " ".join(f"{name}({', '.join(args)})" for name, args in TOOLS.items())
FORMAT_LINE = 'Reply with one JSON call: {"tool": NAME, "args": {...}}. Call finish when done.'


def _date(rng: random.Random) -> str:
    return f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def _time(rng: random.Random) -> str:
    return f"{rng.randint(8, 18):02d}:{rng.choice((0, 15, 30, 45)):02d}"


def _note(rng: random.Random) -> str:
    return f"{rng.choice(_VERBS)} {rng.choice(_NOUNS)} {rng.choice(_DAYS)}"


def _other_files(rng: random.Random, n: int) -> dict[str, str]:
    return {f"docs/{t}.txt": _note(rng) for t in rng.sample(_TOPICS, n)}


def _events(rng: random.Random, titles: list[str], date: str | None = None) -> dict[str, tuple[str, str]]:
    """Events with distinct times (so "time order" is well defined), on ``date`` or random days."""
    times = sorted(rng.sample([f"{h:02d}:{m:02d}" for h in range(8, 19) for m in (0, 30)], len(titles)))
    return {title: (date or _date(rng), t) for title, t in zip(titles, times)}


def _invitation(title: str, date: str, time: str) -> str:
    return f"title: {title}\ndate: {date}\ntime: {time}"


# Each generator returns (task_type, instruction, world, gold plan).
Generated = tuple[str, str, World, list[str]]


def _write_note(rng: random.Random) -> Generated:
    topic, text = rng.choice(_TOPICS), _note(rng)
    world = World(files=_other_files(rng, 2))
    path = f"notes/{topic}.txt"
    plan = [canonical("write_file", {"path": path, "content": text}), canonical(FINISH)]
    return "write-note", f"Save a note at {path} containing exactly: {text}", world, plan


def _schedule(rng: random.Random) -> Generated:
    title, *others = rng.sample(_TITLES, 3)
    date, time = _date(rng), _time(rng)
    world = World(events=_events(rng, others))
    plan = [canonical("create_event", {"title": title, "date": date, "time": time}), canonical(FINISH)]
    return "schedule", f"Add the event '{title}' on {date} at {time}.", world, plan


def _invite(rng: random.Random) -> Generated:
    title, *others = rng.sample(_TITLES, 3)
    date, time, sender = _date(rng), _time(rng), rng.choice(_PEOPLE)
    path = f"inbox/{sender}.txt"
    world = World(
        files={path: _invitation(title, date, time), **_other_files(rng, 1)}, events=_events(rng, others)
    )
    plan = [
        canonical("read_file", {"path": path}),
        canonical("create_event", {"title": title, "date": date, "time": time}),
        canonical(FINISH),
    ]
    text = f"Put the invitation in {path} on the calendar with its title, date and time."
    return "invite", text, world, plan


def _cancel(rng: random.Random) -> Generated:
    date = _date(rng)
    titles = rng.sample(_TITLES, rng.randint(3, 4))
    k = rng.randint(1, 2)
    world = World(events={**_events(rng, titles[k:]), **_events(rng, titles[:k], date)})
    day = sorted((t, title) for title, (d, t) in world.events.items() if d == date)
    plan = [canonical("list_events", {"date": date})]
    plan += [canonical("delete_event", {"title": title}) for _, title in day] + [canonical(FINISH)]
    return "cancel", f"Cancel every event on {date}.", world, plan


def _cleanup(rng: random.Random) -> Generated:
    k = rng.randint(1, 3)
    tmp = {f"tmp/{name}.txt": _note(rng) for name in rng.sample(_TOPICS, k)}
    world = World(files={**tmp, **_other_files(rng, 2)})
    plan = [canonical("list_files", {"folder": "tmp"})]
    plan += [canonical("delete_file", {"path": p}) for p in sorted(tmp)] + [canonical(FINISH)]
    return "cleanup", "Delete every file in the folder tmp.", world, plan


def _agenda(rng: random.Random) -> Generated:
    """OOD: the calendar -> file combination never appears in train."""
    date = _date(rng)
    titles = rng.sample(_TITLES, rng.randint(3, 4))
    world = World(events={**_events(rng, titles[2:]), **_events(rng, titles[:2], date)})
    # a random one may fall on that date too
    day = sorted((t, title) for title, (d, t) in world.events.items() if d == date)
    ordered = ", ".join(title for _, title in day)
    path = f"agenda/{date}.txt"
    plan = [
        canonical("list_events", {"date": date}),
        canonical("write_file", {"path": path, "content": ordered}),
        canonical(FINISH),
    ]
    text = f"Write the titles of the events on {date}, in time order separated by ', ', to {path}."
    return "agenda", text, world, plan


def _multi_invite(rng: random.Random) -> Generated:
    """OOD: longer than any train task (list, then read + create for each of three invitations)."""
    titles = rng.sample(_TITLES, 3)
    senders = sorted(rng.sample(_PEOPLE, 3))
    invites = {f"inbox/{s}.txt": (title, _date(rng), _time(rng)) for s, title in zip(senders, titles)}
    world = World(files={p: _invitation(*inv) for p, inv in invites.items()})
    plan = [canonical("list_files", {"folder": "inbox"})]
    for path, (title, date, time) in invites.items():
        plan.append(canonical("read_file", {"path": path}))
        plan.append(canonical("create_event", {"title": title, "date": date, "time": time}))
    plan.append(canonical(FINISH))
    return "multi-invite", "Put every invitation in the folder inbox on the calendar.", world, plan


@dataclass(frozen=True)
class ToolSplit:
    """Task generators cycled by seed, the seed range (``seed_base + i`` for i < size) and the turn limit."""

    generators: tuple[Callable[[random.Random], Generated], ...]
    seed_base: int
    size: int = 1000
    max_turns: int = 8


TOOL_SPLITS: dict[str, ToolSplit] = {
    "train": ToolSplit((_write_note, _schedule, _invite, _cancel, _cleanup), seed_base=1000),
    "test": ToolSplit((_write_note, _schedule, _invite, _cancel, _cleanup), seed_base=2000),
    "valid": ToolSplit((_write_note, _schedule, _invite, _cancel, _cleanup), seed_base=4000),
    "ood": ToolSplit((_agenda, _multi_invite), seed_base=3000, max_turns=12),
}


def make_task(split: str, seed: int) -> Task:
    """The task of ``seed`` in ``split``: deterministic; the payload is JSON (instruction, world, plan)."""
    spec = TOOL_SPLITS[split]
    gen = spec.generators[seed % len(spec.generators)]
    task_type, instruction, world, plan = gen(random.Random(seed))
    payload = json.dumps({"instruction": instruction, "world": world.to_json(), "plan": plan}, sort_keys=True)
    return Task(task_id=f"tool-use-{split}-{seed}", task_type=task_type, split=split, payload=payload)


class ToolUseEnv:
    """One episode. Reward 1.0 on the last turn when the final state equals the goal state, else 0.0."""

    def __init__(self, task: Task, max_turns: int) -> None:
        spec = json.loads(task.payload)
        self.task, self.max_turns = task, max_turns
        self.instruction = f"{spec['instruction']}\n{TOOLS_LINE}\n{FORMAT_LINE}"
        self.start = World.from_json(spec["world"])
        self.plan: list[str] = spec["plan"]
        self.goal = tool_api.run_plan(self.start, self.plan).to_json()
        self.api: ToolAPI | None = None

    def new_api(self) -> ToolAPI:
        """The episode's tools, at the task's starting state (in-process here; over HTTP in ``tool_server``)."""
        return ToolAPI(self.start)

    def reset(self) -> Reset:
        self.api = self.new_api()
        self.turns = self.malformed = self.tool_errors = 0
        self.executed: set[str] = set()
        self.done = False
        return Reset(instruction=self.instruction, observation="Ready.")

    def step(self, action: str) -> Step:
        """Execute one call; a malformed one is counted (``info["malformed_calls"]``) and changes nothing."""
        check_step(self.task, self.api is not None, self.done)
        self.turns += 1
        try:
            tool, args = parse_call(action)
        except ToolCallError as err:
            self.malformed += 1
            result, tool = {"error": f"malformed call: {err}"}, None
        else:
            result = self.api.call(tool, args)
            if "error" in result:
                self.tool_errors += 1
            else:
                self.executed.add(canonical(tool, args))
        truncated = not self.api.finished and self.turns >= self.max_turns
        self.done = self.api.finished or truncated
        won = self.done and self.api.world.to_json() == self.goal
        info = {"turn": self.turns, "tool": tool, "malformed_calls": self.malformed}
        info.update(tool_errors=self.tool_errors, truncated=truncated)
        return Step(tool_api.result_text(result), 1.0 if won else 0.0, self.done, won, info)

    def expert_action(self) -> str | None:
        """The first gold call not yet done successfully (``finish`` last); None before reset or once done."""
        if self.api is None or self.done:
            return None
        return next(call for call in self.plan if call not in self.executed or call == self.plan[-1])

    def close(self) -> None:
        self.api = None


class ToolUseSuite:
    """The ``tool-use`` suite. max_turns: overrides every split's default (train/test 8, ood 12)."""

    name = "tool-use"
    format_hint = 'Invalid tool call. Reply with one JSON object: {"tool": NAME, "args": {...}}.'
    max_action_tokens = 64  # a create_event call is ~40 tokens with a small BPE vocabulary
    thread_safe = True  # episodes share only read-only data

    def __init__(self, max_turns: int | None = None) -> None:
        check_max_turns(max_turns)
        self.max_turns = max_turns

    def _spec(self, split: str) -> ToolSplit:
        return split_spec(TOOL_SPLITS, split, self.name)

    def tasks(self, split: str, n: int | None = None, start: int = 0) -> list[Task]:
        spec = self._spec(split)
        return [make_task(split, spec.seed_base + i) for i in task_indices(split, spec.size, n, start)]

    def solution(self, task_id: str, split: str) -> list[str]:
        """The task's gold plan: every call in order, ``finish`` last (``Solutions``)."""
        spec = self._spec(split)
        i = task_number(task_id, "tool-use", split, spec.size, spec.seed_base)
        return json.loads(make_task(split, spec.seed_base + i).payload)["plan"]

    def make(self, task: Task) -> ToolUseEnv:
        return ToolUseEnv(task, self.max_turns or self._spec(task.split).max_turns)

    def skill_truth(self, per_split: int = 200) -> SkillTruth:
        """Per task type, the share of its tasks (the first ``per_split`` of every split) whose gold plan calls each
        tool; a step calls the tool its JSON names."""
        plans: dict[str, list[set[str]]] = {}
        for split in TOOL_SPLITS:
            for task in self.tasks(split, per_split):
                tools = {json.loads(call)["tool"] for call in json.loads(task.payload)["plan"]}
                plans.setdefault(task.task_type, []).append(tools)
        calls = {
            t: {tool: sum(tool in p for p in ps) / len(ps) for tool in TOOLS}
            for t, ps in sorted(plans.items())
        }
        return SkillTruth(calls=calls, call_pattern=r'"tool": "([a-z_]+)"')

    def parse_action(self, text: str, finished: bool) -> tuple[str, bool]:
        """(canonical call, ok): ok needs a strict JSON call that ended on its own (not cut at the token limit)."""
        try:
            tool, args = parse_call(text)
        except ToolCallError:
            return " ".join(text.split()), False
        return canonical(tool, args), finished
