"""Offline generation of TextWorld "tw-cooking" games: the per-split settings (:data:`SPLIT_SPECS`, the one place
they are defined), generation through TextWorld's Python API into a cache keyed by a settings hash (in child
interpreters when several games are missing), and task typing from the expert walkthrough.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import textworld
from textworld.challenges.tw_cooking import cooking

from sdarflow import storage
from sdarflow.config import content_hash
from sdarflow.envs.base import EnvError
from sdarflow.errors import StorageError

log = logging.getLogger(__name__)

# Bump when anything below changes the generated games, so stale caches are never reused.
GENERATOR_VERSION = 1

# (cut, cook) skill flags, cycled over seeds. TextWorld's --cut/--cook mean "every ingredient must be cut/cooked"
# (without them the food starts prepared), so fixed flags give a single task type; cycling balances all four.
SKILL_MIX: tuple[tuple[bool, bool], ...] = ((False, False), (True, False), (False, True), (True, True))
TASK_TYPES: tuple[str, ...] = ("plain", "cut", "cook", "cut+cook")  # indexed by cut + 2 * cook
_CUT_VERBS = ("slice ", "dice ", "chop ")
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


def _fetch_shared(shared: str, seeds: Sequence[int], game_dir: Path) -> set[int]:
    """The seeds among ``seeds`` whose games are in ``shared``, copied into ``game_dir`` (``storage.write_bytes``
    renames each file into place, so a local z8 is always a whole game)."""
    there = set(storage.children(shared))
    fetched = [seed for seed in seeds if _game_files(seed)[1] in there]
    for seed in fetched:
        for name in _game_files(seed):
            storage.write_bytes(str(game_dir / name), storage.read_bytes(storage.join(shared, name)))
    return set(fetched)


def ensure_games(
    spec: SplitSpec, seeds: Sequence[int], game_dir: Path, workers: int = 2, shared: str = ""
) -> list[Path]:
    """Paths of the games for ``seeds``: cached, else copied from ``shared`` (a storage URI other machines
    generated them into; '' = none), else generated (in ``workers`` processes if several) and shared. The shared
    store only saves time: when it cannot be read or written, a warning, and the games are made here."""
    paths = [game_dir / f"{seed}.z8" for seed in seeds]
    missing = [seed for seed, path in zip(seeds, paths) if not path.exists()]
    if shared and missing:
        try:
            fetched = _fetch_shared(shared, missing, game_dir)
        except (StorageError, OSError) as err:
            log.warning(
                "tw-cooking games: cannot read %s (%s); generating them", shared, str(err).splitlines()[0]
            )
            fetched = set()
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


if __name__ == "__main__":  # the child of _generate_in_subprocess
    _args = json.loads(sys.argv[1])
    _args["spec"]["skill_mix"] = tuple(map(tuple, _args["spec"]["skill_mix"]))  # JSON made the tuples lists
    for _seed in _args["seeds"]:
        generate_game(SplitSpec(**_args["spec"]), _seed, _args["game_dir"])
