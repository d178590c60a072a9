"""The environment protocol every agent task implements, and the errors envs raise.

An *env suite* (one registered name, e.g. ``textworld-cooking``) owns a set of tasks per split and makes one
:class:`Env` per episode. Episodes are independent objects so the rollout loop can step many of them together.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

from sdarflow.errors import SdarflowError

Split = Literal["train", "test", "ood"]
SPLITS: tuple[str, ...] = ("train", "test", "ood")


class EnvError(SdarflowError, ValueError):
    """A user-fixable problem with an environment request (unknown env, bad split, ...)."""


@dataclass(frozen=True)
class Task:
    """One task (game) of a suite. ``payload`` is suite-specific (e.g. the game file path)."""

    task_id: str
    task_type: str
    split: str
    payload: str = ""


@dataclass(frozen=True)
class Reset:
    """What the agent sees at the start: the goal/instructions (kept in context every turn) and the first view."""

    instruction: str
    observation: str


@dataclass(frozen=True)
class Step:
    """Outcome of one action. ``reward`` is the turn reward; ``won`` marks a solved episode."""

    observation: str
    reward: float
    done: bool
    won: bool
    info: dict = field(default_factory=dict)


class Env(Protocol):
    """One episode of one task."""

    def reset(self) -> Reset: ...

    def step(self, action: str) -> Step: ...

    def expert_action(self) -> str | None:
        """The next action of an expert walkthrough from the current state (None if unknown); used for SFT."""
        ...

    def close(self) -> None: ...


class EnvSuite(Protocol):
    """A named family of tasks with ``train``/``test``/``ood`` splits."""

    name: str

    def tasks(self, split: str, n: int | None = None) -> list[Task]:
        """The first ``n`` tasks of ``split`` (all if None), deterministic for a given suite configuration."""
        ...

    def make(self, task: Task) -> Env: ...
