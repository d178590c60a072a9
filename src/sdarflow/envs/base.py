"""The environment protocol every agent task implements (how to add one: docs/environments.md), and the errors
envs raise.

An *env suite* (one registered name) owns a set of tasks per split and makes one :class:`Env` per episode. The
rollout loop calls envs from worker threads (a per-call watchdog), concurrently only for suites that set
``thread_safe = True`` (episodes share no mutable state). A suite without ``parse_action`` (:class:`ActionFormat`)
gets the short lower-case command parser of ``sdarflow.rollout.prompt``. An env may define
``admissible_commands() -> list[str]`` (the actions it accepts now): the reference prompt format lists them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from sdarflow.errors import SdarflowError

_NUMBER = re.compile(r"0|[1-9][0-9]*")  # as tasks() spell a task's number: no sign, no leading zero
# valid: held out like test, disjoint from every other split; settings are chosen on it, results reported on test
SPLITS: tuple[str, ...] = ("train", "valid", "test", "ood")
S = TypeVar("S")  # a suite's per-split settings


class EnvError(SdarflowError, ValueError):
    """A user-fixable problem with an environment request (unknown env, bad split, ...)."""


def check_max_turns(max_turns: int | None) -> None:
    """A suite's turn limit: None (each split's own) or at least 1."""
    if max_turns is not None and max_turns < 1:
        raise EnvError(f"max_turns must be >= 1, got {max_turns}; fix: pass a positive turn limit")


def split_spec(specs: Mapping[str, S], split: str, suite: str) -> S:
    """``specs[split]``; EnvError naming the suite's splits if it has no such split."""
    if split not in specs:
        raise EnvError(
            f"unknown split {split!r} for {suite}; allowed: {', '.join(specs)}; fix: use one of {', '.join(SPLITS)}"
        )
    return specs[split]


def check_step(task: Task, started: bool, done: bool) -> None:
    """What every env's ``step`` checks first: that ``reset`` came before and the episode has not ended."""
    if not started:
        raise EnvError(f"step() before reset() on {task.task_id}; fix: call reset() first")
    if done:
        raise EnvError(f"step() after the episode of {task.task_id} ended; fix: check done, or reset()")


def task_number(task_id: str, prefix: str, split: str, size: int, seed_base: int = 0) -> int:
    """The index (``n - seed_base``) of a task id spelled ``<prefix>-<split>-<n>``; EnvError when ``task_id`` is not
    one of the split's ``size`` tasks."""
    head = f"{prefix}-{split}-"
    tail = task_id[len(head) :] if task_id.startswith(head) else ""
    if not _NUMBER.fullmatch(tail) or not 0 <= int(tail) - seed_base < size:
        raise EnvError(
            f"task {task_id!r} is not one of the {size} tasks of split {split!r} ({head}N); fix: pass a task id "
            f"this suite's tasks() made, with its split"
        )
    return int(tail) - seed_base


def task_indices(split: str, size: int, n: int | None, start: int) -> list[int]:
    """Indices ``start .. start + n - 1`` modulo ``size`` (all ``size`` if ``n`` is None): a run that plays the next
    ``n`` tasks each round cycles through the split. EnvError when ``n`` is outside ``[0, size]`` or start < 0."""
    n = size if n is None else n
    if not 0 <= n <= size:
        raise EnvError(f"n={n} tasks asked of split {split!r} of size {size}; fix: 0 <= n <= size")
    if start < 0:
        raise EnvError(f"start={start} for split {split!r} is negative; fix: start >= 0")
    return [(start + i) % size for i in range(n)]


@dataclass(frozen=True)
class Task:
    """One task (game) of a suite. ``payload`` is suite-specific (e.g. the game file path)."""

    task_id: str
    task_type: str
    split: str
    payload: str = ""


@dataclass(frozen=True)
class SkillTruth:
    """What an env knows is right for a skill library to say, to score extracted skills against
    (``skills.accuracy``; never an input to the extractor).

    Recipe envs: ``actions``: each goal direction's required action as skills spell it (``fry the <item>`` ->
    ``cook <item> with stove``); ``needs``: the preparation each direction stands for (``cook``); ``prepared_by``:
    per task type, the preparations its tasks require (others come prepared: their direction needs no action).
    Tool-calling envs: ``calls``: per task type, the share of its tasks whose gold plan calls each tool;
    ``call_pattern``: a regular expression whose one group reads the tool a skill step calls."""

    actions: dict[str, str] = field(default_factory=dict)
    needs: dict[str, str] = field(default_factory=dict)
    prepared_by: dict[str, frozenset[str]] = field(default_factory=dict)
    calls: dict[str, dict[str, float]] = field(default_factory=dict)
    call_pattern: str = ""

    @property
    def task_types(self) -> list[str]:
        return sorted(set(self.prepared_by) | set(self.calls))


@dataclass(frozen=True)
class Reset:
    """What the agent sees at the start: the goal/instructions (kept in context every turn) and the first view;
    ``admissible``: filled by the rollout host from ``admissible_commands()`` when the prompt lists them;
    ``expert``: the expert's next action (``expert_action()``), filled when the rollout records expert labels."""

    instruction: str
    observation: str
    admissible: tuple[str, ...] | None = None
    expert: str | None = None


@dataclass(frozen=True)
class Step:
    """Outcome of one action. ``reward`` is the turn reward; ``won`` marks a solved episode."""

    observation: str
    reward: float
    done: bool
    won: bool
    info: dict = field(default_factory=dict)
    admissible: tuple[str, ...] | None = None  # as Reset's
    expert: str | None = None  # as Reset's


class Env(Protocol):
    """One episode of one task. Optional attribute ``max_turns``: the episode's turn limit, which the rollout loop
    also applies to turns whose response was malformed (those never reach ``step``). ``expert_action``: the expert
    walkthrough's next action (None: unknown), for SFT."""

    def reset(self) -> Reset: ...

    def step(self, action: str) -> Step: ...

    def expert_action(self) -> str | None: ...

    def close(self) -> None: ...


class ActionFormat(Protocol):
    """Optional suite members that define how a sampled response becomes an action."""

    format_hint: str
    max_action_tokens: int

    def parse_action(self, text: str, finished: bool) -> tuple[str, bool]:
        """(action, format_ok), ``finished``: generation ended on its own, not at the token limit. Pure and fast."""
        ...

    def reference_continuation(self, task_id: str) -> str | None:
        """The action that completes the task, or None: what rescore's ``--ppl-delta`` measures progress towards."""
        ...


class Solutions(Protocol):
    """An optional suite member: the gold solution a privileged teacher reads (``rescore --teacher-context
    solution``), never an input to a rollout."""

    def solution(self, task_id: str, split: str) -> list[str]:
        """The expert's actions that solve ``task_id`` of ``split`` from its start, in order, spelled as the env
        accepts them; EnvError for a task id that is not the split's."""
        ...


class EnvSuite(Protocol):
    """A named family of tasks with ``train``/``valid``/``test``/``ood`` splits (settings are chosen on valid)."""

    name: str

    def tasks(self, split: str, n: int | None = None, start: int = 0) -> list[Task]:
        """``n`` tasks of ``split`` from index ``start`` (all if None), wrapping (``task_indices``); deterministic."""
        ...

    def make(self, task: Task) -> Env: ...
