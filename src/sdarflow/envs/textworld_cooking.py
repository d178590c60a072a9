"""TextWorld "tw-cooking" games as the ``textworld-cooking`` env suite: :class:`TextWorldCookingEnv`, one episode
with cleaned, short observations for a tiny policy, and the suite that hands out each split's games (generated
and cached by :mod:`sdarflow.envs.textworld_games`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from itertools import pairwise
from pathlib import Path

import textworld

from sdarflow import config, storage
from sdarflow.envs.base import (
    EnvError,
    Reset,
    SkillTruth,
    Step,
    Task,
    check_max_turns,
    check_step,
    split_spec,
    task_indices,
)
from sdarflow.envs.textworld_games import (
    DIRECTION_ACTIONS,
    SPLIT_SPECS,
    TASK_TYPES,
    SplitSpec,
    ensure_games,
    game_metadata,
    quiet_jericho,
    task_type_of,
)

_PROMPT_LINE = re.compile(r"^\s*>.*$", re.MULTILINE)  # the interpreter's prompt plus its status bar
_GAME_OVER = re.compile(r"\*\*\* .+? \*\*\*")
_RECIPE = re.compile(
    r"Ingredients:\s*\n(?P<ingredients>.*?)\n\s*\nDirections:\s*\n(?P<directions>.*)", re.DOTALL
)
_ROOM_HEADER = re.compile(r"^-= .+ =-$")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def clean_text(text: str, drop: str = "", entities: Sequence[str] = ()) -> str:
    """Concise game text: no ASCII-art banner, prompt/status bar, restart question, blank lines or ``drop`` (the
    objective, already in the instruction). With ``entities`` (the game's object, room and direction names), a room
    description keeps only the sentences that name one: TextWorld pads them with random flavor ("What a waste of a
    day!"), a third of the prompt and noise to a small policy."""
    over = _GAME_OVER.search(text)
    if over:  # what follows is the score summary and a RESTART/QUIT question
        text = text[: over.end()]
    if drop:
        text = text.replace(drop, "")
    names = re.compile(
        r"\b(?:" + "|".join(re.escape(e) for e in sorted(entities, key=len, reverse=True)) + r")\b"
    )
    out, in_room = [], False
    for raw in text.splitlines():
        if _PROMPT_LINE.match(raw):  # the interpreter's prompt ends one command's output
            in_room = False
            continue
        line = " ".join(raw.split())
        if _ROOM_HEADER.match(line):
            in_room = bool(entities)
        elif in_room:
            line = " ".join(s for s in _SENTENCE_END.split(line) if names.search(s.lower()))
        # Banner lines are drawn only with $ \ | _ / etc.; no real line lacks a letter or digit.
        if any(c.isalnum() for c in line):
            out.append(line)
    return "\n".join(out)


def recipe_summary(text: str) -> str | None:
    """``Ingredients: a, b`` / ``Directions: x; y; prepare meal`` from cookbook text, or None if absent."""
    match = _RECIPE.search(text)
    if not match:
        return None

    def items(block: str) -> list[str]:
        return [" ".join(line.split()) for line in block.splitlines() if line.strip()]

    ingredients = ", ".join(items(match["ingredients"]))
    directions = "; ".join(items(match["directions"].split("\n\n")[0]))
    return f"Ingredients: {ingredients}\nDirections: {directions}"


class TextWorldCookingEnv:
    """One episode of one tw-cooking game. Reward 1.0 on the winning turn, else 0.0."""

    GOAL = "Prepare the meal following the recipe, then eat it."

    def __init__(self, task: Task, max_turns: int) -> None:
        self.task = task
        self.max_turns = max_turns
        self._env = None
        self._state = None  # last textworld GameState
        self._entities: list[str] = []  # object, room and direction names: what room descriptions keep
        self._turns = 0
        self._done = False
        self._tracking = False  # TextWorld's state tracker is on (admissible and expert commands)
        self._commands: list[str] = []  # sent since the last reset, to replay when tracking starts

    def _start(self, tracking: bool) -> None:
        infos = textworld.EnvInfos(
            admissible_commands=tracking, policy_commands=tracking, won=True, lost=True, score=True,
            max_score=True, objective=True, entities=True, extras=["recipe"],
        )  # fmt: skip
        with quiet_jericho():
            self._env = textworld.start(self.task.payload, request_infos=infos)
        self._tracking = tracking

    def _tracked_state(self):
        """The current state with admissible and expert commands. The state tracker triples a reset's cost and a
        policy's rollout never asks for it: the first call that needs it restarts the game with tracking and
        replays this episode's commands (the games are deterministic)."""
        if not self._tracking:
            self._env.close()
            self._start(tracking=True)
            self._env.reset()
            for command in self._commands:
                self._state, _, _ = self._env.step(command)
        return self._state

    def reset(self) -> Reset:
        """(Re)start the game, read the cookbook silently, return the instruction and first observation."""
        if self._env is None:
            self._start(tracking=False)
        first = self._env.reset()
        # The expert walkthrough never reads the cookbook, so the recipe must be in the instruction. Reading it
        # fails when the player starts outside the kitchen (go > 1): then use the recipe TextWorld stored.
        self._commands = ["examine cookbook"]
        self._state, _, _ = self._env.step("examine cookbook")
        recipe = recipe_summary(self._state.feedback) or recipe_summary(first["extra.recipe"] or "")
        self._turns, self._done = 0, False
        instruction = f"{self.GOAL}\n{recipe}" if recipe else self.GOAL
        self._entities = [e.lower() for e in first["entities"] or ()]
        observation = clean_text(first.feedback, drop=first["objective"], entities=self._entities)
        return Reset(instruction=instruction, observation=observation)

    def step(self, action: str) -> Step:
        """Play ``action``; done when won, lost or after ``max_turns`` (then ``info["truncated"]``)."""
        check_step(self.task, self._env is not None and self._state is not None, self._done)
        # A newline would make the interpreter run two commands and desync every later observation.
        command = " ".join(action.split())
        self._commands.append(command)
        self._state, _, game_over = self._env.step(command)
        self._turns += 1
        won, lost = bool(self._state["won"]), bool(self._state["lost"])
        truncated = not (won or lost or game_over) and self._turns >= self.max_turns
        self._done = won or lost or game_over or truncated
        info = {"score": self._state["score"], "max_score": self._state["max_score"], "turn": self._turns}
        info.update(lost=lost, truncated=truncated)
        observation = clean_text(self._state.feedback, entities=self._entities)
        return Step(observation, 1.0 if won else 0.0, self._done, won, info)

    def expert_action(self) -> str | None:
        """The expert's next command from the current state, None before reset or once the game is over."""
        if self._env is None or self._state is None or self._done:
            return None
        commands = self._tracked_state()["policy_commands"] or []
        return commands[0] if commands else None

    def admissible_commands(self) -> list[str]:
        """Commands TextWorld accepts in the current state (diagnostics; the policy is not restricted to them)."""
        if self._env is None or self._state is None:
            return []
        return list(self._tracked_state()["admissible_commands"] or [])

    def close(self) -> None:
        """Close the interpreter; safe to call twice."""
        if self._env is not None:
            self._env.close()
            self._env = None


class TextWorldCookingSuite:
    """The ``textworld-cooking`` suite: tasks per split from cached generated games, one env per episode.

    cache_dir: game cache root (default ``$SDARFLOW_CACHE``), games in ``<cache_dir>/games/<settings-hash>/``.
    shared: a storage URI machines share their games in (default ``$SDARFLOW_SHARED_CACHE``, '' = none).
    max_turns: overrides every split's default. workers: processes generating missing games. splits: replace
    :data:`SPLIT_SPECS`.
    """

    name = "textworld-cooking"
    # TextWorld parses game state with one shared parser: concurrent resets fail inside it ("pop from empty list").
    thread_safe = False

    def __init__(
        self,
        cache_dir: str | Path | None = None,
        max_turns: int | None = None,
        workers: int = 2,
        splits: Mapping[str, SplitSpec] | None = None,
        shared: str | None = None,
    ) -> None:
        check_max_turns(max_turns)
        # Absolute, so task payloads stay valid for workers started in another directory.
        self.cache_dir = Path(cache_dir or config.cache_dir()).expanduser().resolve()
        self.max_turns, self.workers = max_turns, workers
        self.shared = config.shared_cache() if shared is None else shared
        self.splits = dict(splits or SPLIT_SPECS)
        ranges = sorted((s.seed_base, s.seed_base + s.size, name) for name, s in self.splits.items())
        for (_, end, a), (start, _, b) in pairwise(ranges):
            if start < end:
                raise EnvError(f"seed ranges of splits {a!r} and {b!r} overlap; fix: disjoint seed_base/size")

    def spec(self, split: str) -> SplitSpec:
        """The generation settings of ``split``; EnvError naming the allowed splits if unknown."""
        return split_spec(self.splits, split, self.name)

    def game_dir(self, split: str) -> Path:
        """Cache folder holding the games of ``split``'s settings."""
        return self.cache_dir / "games" / self.spec(split).settings_hash()

    def tasks(self, split: str, n: int | None = None, start: int = 0) -> list[Task]:
        """``n`` tasks of ``split`` from ``start`` (``task_indices``), generating games not yet cached."""
        spec = self.spec(split)
        seeds = [spec.seed_base + i for i in task_indices(split, spec.size, n, start)]
        shared = storage.join(self.shared, "games", spec.settings_hash()) if self.shared else ""
        paths = ensure_games(spec, seeds, self.game_dir(split), self.workers, shared)
        types = [task_type_of(game_metadata(path)["walkthrough"]) for path in paths]
        return [
            Task(f"tw-cooking-{split}-{seed}", t, split, str(path))
            for seed, path, t in zip(seeds, paths, types)
        ]

    def skill_truth(self) -> SkillTruth:
        """Each direction's command, and per task type the preparations it requires (``cut+cook``: both)."""
        return SkillTruth(
            actions={d: action for d, (action, _) in DIRECTION_ACTIONS.items()},
            needs={d: need for d, (_, need) in DIRECTION_ACTIONS.items()},
            prepared_by={t: frozenset(t.split("+")) - {"plain"} for t in TASK_TYPES},
        )

    def make(self, task: Task) -> TextWorldCookingEnv:
        """A fresh episode of ``task``; call ``reset()`` on it first."""
        if not Path(task.payload).is_file():
            raise EnvError(f"game {task.payload!r} of {task.task_id} not found; fix: get tasks from tasks()")
        max_turns = self.max_turns or self.spec(task.split).max_turns
        return TextWorldCookingEnv(task, max_turns)
