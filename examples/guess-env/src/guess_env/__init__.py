"""An env suite for sdarflow, as small as one can be and complete: guess a secret whole number from "too low" /
"too high" feedback. Copy it to bring your own task (a tool API, a simulator, a test harness).

What a suite gives sdarflow (``sdarflow.envs.base``):

- ``name`` and ``tasks(split, n, start)``: deterministic tasks per split. ``train`` is what RL plays, ``test``
  held-out tasks of the same kinds, ``ood`` a kind never trained on. Each ``Task`` has a ``task_type``: the
  teacher's privileged context is the skill library's entry for that type, so give tasks that share know-how the
  same type (here the range size).
- ``make(task)``: one ``Env`` per episode (``reset``, ``step``, ``expert_action`` for SFT warm starts, ``close``,
  and ``max_turns``).
- The action format (optional): ``parse_action(text, finished) -> (action, ok)`` turns a sampled response into
  an action, ``format_hint`` is what the agent is told after a malformed one, ``max_action_tokens`` the budget.
- ``thread_safe = True`` when episodes share no mutable state, so the rollout loop steps them concurrently.
"""

from __future__ import annotations

import math
import random
import re

from sdarflow.envs import EnvError, Reset, Step, Task
from sdarflow.envs.base import task_indices

# split -> (task types as (name, largest number), first seed); disjoint seeds, so test tasks are unseen
SPLITS = {
    "train": ((("small", 16), ("large", 64)), 0),
    "test": ((("small", 16), ("large", 64)), 100_000),
    "valid": ((("small", 16), ("large", 64)), 300_000),
    "ood": ((("huge", 256),), 200_000),
}
SPLIT_SIZE = 1000
_GUESS = re.compile(r"guess\s+(\d{1,6})\b")


class GuessEnv:
    def __init__(self, task: Task) -> None:
        self.task = task
        self.top, self.secret = (int(x) for x in task.payload.split(":"))
        self.max_turns = math.ceil(math.log2(self.top)) + 2  # binary search needs ceil(log2(top)); 2 spare
        self.lo, self.hi = 1, self.top  # what the feedback so far allows

    def reset(self) -> Reset:
        self.lo, self.hi = 1, self.top
        return Reset(
            instruction=f"Find the secret whole number between 1 and {self.top}. Reply with: guess N",
            observation="No guesses yet.",
        )

    def step(self, action: str) -> Step:
        n = int(action.split()[1])
        if n == self.secret:
            return Step(f"{n} is right.", reward=1.0, done=True, won=True)
        if n < self.secret:
            self.lo = max(self.lo, n + 1)
            return Step(f"{n} is too low.", reward=0.0, done=False, won=False)
        self.hi = min(self.hi, n - 1)
        return Step(f"{n} is too high.", reward=0.0, done=False, won=False)

    def expert_action(self) -> str:
        return f"guess {(self.lo + self.hi) // 2}"

    def close(self) -> None:
        pass


class GuessSuite:
    name = "guess"
    thread_safe = True
    format_hint = "Reply with: guess N (a whole number)."
    max_action_tokens = 8

    def __init__(self, **settings: object) -> None:
        if settings:
            raise EnvError(f"guess takes no settings, got {sorted(settings)}; fix: drop them")

    def tasks(self, split: str, n: int | None = None, start: int = 0) -> list[Task]:
        if split not in SPLITS:
            raise EnvError(f"unknown split {split!r} for guess; allowed: {', '.join(SPLITS)}")
        types, first_seed = SPLITS[split]
        out = []
        for i in task_indices(split, SPLIT_SIZE, n, start):
            kind, top = types[i % len(types)]
            secret = random.Random(first_seed + i).randint(1, top)
            out.append(Task(f"guess-{split}-{i}", kind, split, payload=f"{top}:{secret}"))
        return out

    def make(self, task: Task) -> GuessEnv:
        return GuessEnv(task)

    def parse_action(self, text: str, finished: bool) -> tuple[str, bool]:
        match = _GUESS.search(text.lower())
        return (f"guess {int(match.group(1))}", True) if match else (text.strip(), False)
