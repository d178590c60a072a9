"""TextWorld "tw-cooking" games as the ``textworld-cooking`` env suite: the per-split settings
(:data:`SPLIT_SPECS`, the one place they are defined), offline generation through TextWorld's Python API into a
cache keyed by a settings hash (in child interpreters when several games are missing), task typing from the expert
walkthrough, :class:`TextWorldCookingEnv` (one episode with cleaned, short observations for a tiny policy) and the
suite that hands out each split's games.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import textworld
from textworld.challenges.tw_cooking import cooking

from sdarflow import config, storage
from sdarflow.config import content_hash
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
    task_number,
)
from sdarflow.errors import StorageError

log = logging.getLogger(__name__)

# Bump when anything below changes the generated games, so stale caches are never reused.
GENERATOR_VERSION = 1

# (cut, cook) skill flags, cycled over seeds. TextWorld's --cut/--cook mean "every ingredient must be cut/cooked"
# (without them the food starts prepared), so fixed flags give a single task type; cycling balances all four.
SKILL_MIX: tuple[tuple[bool, bool], ...] = ((False, False), (True, False), (False, True), (True, True))
TASK_TYPES: tuple[str, ...] = ("plain", "cut", "cook", "cut+cook")  # indexed by cut + 2 * cook
_CUT_VERBS = ("slice ", "dice ", "chop ")
COOKBOOK = "examine cookbook"  # reset reads it silently: the recipe goes in the instruction
# Each recipe direction's command in TextWorld's cooking games (tw-cooking: fried on the stove, roasted in the oven,
# grilled on the BBQ; cut with the knife), spelled as skills abstract it, and the preparation it stands for.
DIRECTION_ACTIONS: dict[str, tuple[str, str]] = {
    "fry the <item>": ("cook <item> with stove", "cook"),
    "roast the <item>": ("cook <item> with oven", "cook"),
    "grill the <item>": ("cook <item> with bbq", "cook"),
    "chop the <item>": ("chop <item> with knife", "cut"),
    "dice the <item>": ("dice <item> with knife", "cut"),
    "slice the <item>": ("slice <item> with knife", "cut"),
}


@dataclass(frozen=True)
class SplitSpec:
    """How the games of one split are generated (tw-cooking settings) and played.

    tw_split: TextWorld ``--split``: ``train`` foods/preparations, or ``valid`` / ``test`` (two disjoint unseen sets).
    recipe: ingredients in the recipe (1-5). take: how many must be fetched (>= 1: TextWorld re-samples the recipe
    per ``--recipe-seed`` only when something must be taken). go: rooms (1, 6, 9 or 12). open: doors/containers
    start closed. drop: limited inventory (TextWorld then has no walkthrough). seed_base, size: task i uses game
    seed (= recipe seed) ``seed_base + i``. max_turns: about 3x the split's longest expert walkthrough. skill_mix:
    (cut, cook) flags cycled by seed.
    """

    tw_split: str
    recipe: int = 1
    take: int = 1
    go: int = 1
    open: bool = False
    drop: bool = False
    seed_base: int = 1000
    size: int = 1000
    max_turns: int = 20
    skill_mix: tuple[tuple[bool, bool], ...] = SKILL_MIX

    def __post_init__(self) -> None:
        if not 1 <= self.take <= self.recipe <= 5:
            raise EnvError(
                f"tw-cooking take={self.take}, recipe={self.recipe}; fix: 1 <= take <= recipe <= 5"
            )
        if self.go not in (1, 6, 9, 12):
            raise EnvError(f"tw-cooking go={self.go} not in (1, 6, 9, 12); fix: use one of those room counts")
        if self.drop:
            raise EnvError("tw-cooking drop=True has no expert walkthrough in TextWorld; fix: drop=False")

    def game_settings(self, seed: int) -> dict:
        """The settings dict TextWorld's ``cooking.make`` reads for the game of ``seed``."""
        cut, cook = self.skill_mix[seed % len(self.skill_mix)]
        return {
            "recipe": self.recipe,
            "take": self.take,
            "go": self.go,
            "open": self.open,
            "cook": cook,
            "cut": cut,
            "drop": self.drop,
            "recipe_seed": seed,  # TextWorld's default 0 would give every game the same recipe
            "split": self.tw_split,
        }

    def settings_hash(self) -> str:
        """Hash of everything that shapes a game besides its seed (seed range, size, max_turns do not)."""
        content = {
            k: v for k, v in dataclasses.asdict(self).items() if k not in ("seed_base", "size", "max_turns")
        }
        content.update(textworld=textworld.__version__, generator=GENERATOR_VERSION)
        return content_hash(content)


SPLIT_SPECS: dict[str, SplitSpec] = {
    "train": SplitSpec(tw_split="train", seed_base=1000, max_turns=20),
    "test": SplitSpec(tw_split="test", seed_base=2000, max_turns=20),
    # TextWorld's own validation foods and preparations: unseen in train, and not those of test
    "valid": SplitSpec(tw_split="valid", seed_base=4000, max_turns=20),
    # Never trained on: two-ingredient recipes (one ingredient already carried), unseen foods/preparations. Harder
    # shifts (6 rooms: navigation; two to fetch) are out of a one-room, one-ingredient SFT's reach: pass@1 0 there.
    "ood": SplitSpec(tw_split="test", recipe=2, take=1, seed_base=3000, max_turns=30),
}


@contextlib.contextmanager
def quiet_jericho() -> Iterator[None]:
    """Silence Jericho's per-game "not fully supported" warning: TextWorld tracks score and moves itself."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is not fully supported")
        yield


def build_game(spec: SplitSpec, seed: int, options: textworld.GameOptions | None = None) -> textworld.Game:
    """Generate (not compile) the tw-cooking game of ``seed``: deterministic in (spec, seed)."""
    options = options or textworld.GameOptions()
    options.seeds = seed
    with quiet_jericho():  # make() plays the walkthrough in Jericho to check it
        return cooking.make(spec.game_settings(seed), options)


def generate_game(spec: SplitSpec, seed: int, game_dir: str) -> str:
    """Generate and compile one game into ``game_dir/<seed>.z8`` (+ ``.json``) atomically; returns the z8 path.
    Compiled in a private temp dir, then renamed (json first, z8 last: the z8 marks a complete entry), so
    concurrent generators of one game only swap in an equivalent file (same walkthrough and play)."""
    start = time.perf_counter()
    os.makedirs(game_dir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".tmp-{seed}-", dir=game_dir)
    try:
        options = textworld.GameOptions()
        options.path, options.file_ext = os.path.join(tmp, f"{seed}.z8"), ".z8"
        textworld.generator.compile_game(build_game(spec, seed, options), options)
        for ext in (".json", ".z8"):
            os.replace(os.path.join(tmp, f"{seed}{ext}"), os.path.join(game_dir, f"{seed}{ext}"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # also drops the Inform 7 source TextWorld leaves behind
    log.info("generated tw-cooking game %s/%d in %.1f s", game_dir, seed, time.perf_counter() - start)
    return os.path.join(game_dir, f"{seed}.z8")


def _generate_in_subprocess(spec: SplitSpec, seeds: Sequence[int], game_dir: Path) -> None:
    """:func:`generate_game` for ``seeds`` in one fresh interpreter (pays TextWorld's ~3 s start once): unlike a
    process pool, no fork of a parent holding torch threads, and no ``__main__`` guard demanded of the caller."""
    path = os.pathsep.join(
        filter(None, [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH")])
    )
    args = json.dumps({"spec": dataclasses.asdict(spec), "seeds": list(seeds), "game_dir": str(game_dir)})
    env = {**os.environ, "PYTHONPATH": path}  # so the child imports this same sdarflow
    cmd = [sys.executable, "-m", __name__, args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]
        raise EnvError(
            f"generating tw-cooking games {list(seeds)} failed (exit {proc.returncode}): {last}; fix: check that "
            f"textworld imports and the game cache {game_dir} is writable (SDARFLOW_CACHE moves it)"
        )


def _game_files(seed: int) -> tuple[str, str]:
    return f"{seed}.json", f"{seed}.z8"  # in the order they are written: the z8 marks a complete game


def ensure_games(
    spec: SplitSpec, seeds: Sequence[int], game_dir: Path, workers: int = 2, shared: str = ""
) -> list[Path]:
    """Paths of the games for ``seeds``: cached, else copied from ``shared`` (a storage URI other machines
    generated them into; '' = none), else generated (in ``workers`` processes if several) and shared. The shared
    store only saves time: when it cannot be read or written, a warning, and the games are made here."""
    paths = [game_dir / f"{seed}.z8" for seed in seeds]
    missing = [seed for seed, path in zip(seeds, paths) if not path.exists()]
    if shared and missing:
        try:  # storage.write_bytes renames each file into place, so a local z8 is always a whole game
            there = set(storage.children(shared))
            fetched = [seed for seed in missing if _game_files(seed)[1] in there]
            for seed in fetched:
                for name in _game_files(seed):
                    storage.write_bytes(str(game_dir / name), storage.read_bytes(storage.join(shared, name)))
        except (StorageError, OSError) as err:
            log.warning(
                "tw-cooking games: cannot read %s (%s); generating them", shared, str(err).splitlines()[0]
            )
            fetched = []
        if fetched:
            log.info("tw-cooking games: %d from %s", len(fetched), shared)
        missing = [seed for seed in missing if seed not in fetched]
    if len(missing) > 1 and workers > 1:
        log.info("generating %d tw-cooking games with %d workers", len(missing), workers)
        # Threads only wait on child interpreters; list() re-raises the first failure.
        chunks = [missing[i::workers] for i in range(min(workers, len(missing)))]
        with ThreadPoolExecutor(max_workers=len(chunks)) as pool:
            list(pool.map(lambda seeds: _generate_in_subprocess(spec, seeds, game_dir), chunks))
    else:
        for seed in missing:
            generate_game(spec, seed, str(game_dir))
    if shared and missing:
        try:
            for seed in missing:
                for name in _game_files(seed):
                    storage.write_bytes(storage.join(shared, name), (game_dir / name).read_bytes())
        except (StorageError, OSError) as err:
            log.warning("tw-cooking games: cannot share them in %s (%s)", shared, str(err).splitlines()[0])
    return paths


def game_metadata(game_path: Path | str) -> dict:
    """The metadata TextWorld stores next to a compiled game (recipe, ingredients, walkthrough, settings)."""
    with open(Path(game_path).with_suffix(".json"), encoding="utf-8") as f:
        return json.load(f)["metadata"]


def task_type_of(walkthrough: Sequence[str]) -> str:
    """``plain``/``cut``/``cook``/``cut+cook`` from the preparation commands the walkthrough must issue."""
    cut = any(cmd.startswith(_CUT_VERBS) for cmd in walkthrough)
    cook = any(cmd.startswith("cook ") for cmd in walkthrough)
    return TASK_TYPES[int(cut) + 2 * int(cook)]


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
    """One episode of one tw-cooking game. Reward ``win``: 1.0 on the winning turn, else 0.0; ``score``: the points
    the turn gained (TextWorld's own reward: one per ingredient taken, per preparation, for the meal prepared and
    eaten) over the game's maximum, so a won episode's rewards sum to 1 and a failed one's to the share of the
    recipe it got through."""

    GOAL = "Prepare the meal following the recipe, then eat it."

    def __init__(self, task: Task, max_turns: int, reward: str = "win") -> None:
        if reward not in ("win", "score"):
            raise EnvError(f"unknown reward {reward!r}; fix: win or score")
        self.task, self.max_turns, self.reward = task, max_turns, reward
        self._score = 0  # points at the last step (reset: after the cookbook read, which TextWorld scores 0)
        self._env = None
        self._state = None  # last textworld GameState
        self._entities: list[str] = []  # object, room and direction names: what room descriptions keep
        self._turns, self._done = 0, False
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
        self._commands = [COOKBOOK]
        self._state, _, _ = self._env.step(COOKBOOK)
        recipe = recipe_summary(self._state.feedback) or recipe_summary(first["extra.recipe"] or "")
        self._turns, self._done, self._score = 0, False, self._state["score"]
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
        if self.reward == "score":
            reward = (self._state["score"] - self._score) / self._state["max_score"]
            self._score = self._state["score"]
        else:
            reward = 1.0 if won else 0.0
        return Step(observation, reward, self._done, won, info)

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
    reward = "win"  # TextWorldCookingEnv's reward
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

    def tasks(self, split: str, n: int | None = None, start: int = 0) -> list[Task]:
        """``n`` tasks of ``split`` from ``start`` (``task_indices``), generating games not yet cached."""
        spec = self.spec(split)
        seeds = [spec.seed_base + i for i in task_indices(split, spec.size, n, start)]
        key = spec.settings_hash()
        shared = storage.join(self.shared, "games", key) if self.shared else ""
        paths = ensure_games(spec, seeds, self.cache_dir / "games" / key, self.workers, shared)
        types = [task_type_of(game_metadata(path)["walkthrough"]) for path in paths]
        return [
            Task(f"tw-cooking-{split}-{seed}", t, split, str(path))
            for seed, path, t in zip(seeds, paths, types)
        ]

    def solution(self, task_id: str, split: str) -> list[str]:
        """The game's walkthrough as TextWorld stores it (``Solutions``), less the cookbook read that ``reset``
        plays itself."""
        spec = self.spec(split)
        i = task_number(task_id, "tw-cooking", split, spec.size, spec.seed_base)
        walkthrough = game_metadata(self.tasks(split, n=1, start=i)[0].payload)["walkthrough"]
        return [command for command in walkthrough if command != COOKBOOK]

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
        return TextWorldCookingEnv(task, max_turns, self.reward)


class TextWorldCookingScoreSuite(TextWorldCookingSuite):
    """``textworld-cooking-score``: the same games and tasks, rewarded with the game's score (partial credit per
    recipe step, a win sums to 1) instead of the win alone, so a group whose episodes all fail still ranks them
    by how far they got. Success (pass@k) is still the win."""

    name = "textworld-cooking-score"
    reward = "score"


if __name__ == "__main__":  # the child of _generate_in_subprocess
    _args = json.loads(sys.argv[1])
    _args["spec"]["skill_mix"] = tuple(map(tuple, _args["spec"]["skill_mix"]))  # JSON made the tuples lists
    for _seed in _args["seeds"]:
        generate_game(SplitSpec(**_args["spec"]), _seed, _args["game_dir"])
