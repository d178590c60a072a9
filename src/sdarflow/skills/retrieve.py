"""Skill retrieval strategies: which skills the teacher sees for a row. Chosen by config name.

``keyword``  the skill mapped to the row's task type (``task_to_skill``), else the task type whose keywords best
             match the goal text; plus the general skill.
``ucb``      a UCB1 bandit per task type over the task-specific skills, rewarded by the skill's measured benefit
             from previous rounds (``sdarflow.skills.bandit``); one skill plus the general skill.
``random``   one task-specific skill drawn uniformly (seeded); plus the general skill.
``full``     the whole library (the paper's "full library" baseline).

A strategy is a callable ``(library, task_type, instruction) -> Retrieved``; ``ucb`` and ``random`` carry state
(pull counts, a random generator), so ``get_strategy`` builds a fresh one per stage run.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from sdarflow.errors import ConfigError
from sdarflow.skills import bandit
from sdarflow.skills.library import Skill, SkillLibrary


@dataclass(frozen=True)
class Retrieved:
    skills: list[Skill]
    hit: bool  # a task-specific skill was found (not only general skills)
    matched: bool = False  # the skill that belongs to the row's task type is among them

    @property
    def ids(self) -> list[str]:
        return [s.name for s in self.skills]

    @property
    def text(self) -> str:
        return "\n".join(s.text.strip() for s in self.skills)


Strategy = Callable[[SkillLibrary, str, str], Retrieved]
STRATEGIES: dict[str, Callable[..., Strategy]] = {}


def register(name: str) -> Callable:
    """Bind a strategy factory to a config name; binding a name twice is a programming error."""

    def wrap(factory: Callable[..., Strategy]) -> Callable[..., Strategy]:
        if name in STRATEGIES:
            raise ValueError(f"retrieval strategy '{name}' is registered twice")
        STRATEGIES[name] = factory
        return factory

    return wrap


def get_strategy(name: str, *, seed: int = 0, ucb_c: float = 0.5) -> Strategy:
    if name not in STRATEGIES:
        raise ConfigError(
            f"unknown retrieval strategy '{name}'; available: {', '.join(STRATEGIES)}; fix: pick one of those"
        )
    return STRATEGIES[name](seed=seed, ucb_c=ucb_c)


def _has_word(text: str, keyword: str) -> bool:
    return re.search(r"(?<![a-z0-9])" + re.escape(keyword) + r"(?![a-z0-9])", text) is not None


def matching_skill(lib: SkillLibrary, task_type: str, instruction: str) -> Skill | None:
    """The skill mapped to ``task_type``; else that of the task type whose keywords cover most of the goal text
    (share of its keywords found, then number found, then name)."""
    skill = lib.for_task_type(task_type)
    if skill is not None:
        return skill
    text = instruction.lower()
    best: tuple[float, int, str] | None = None
    for other, words in sorted(lib.task_keywords.items()):
        found = sum(_has_word(text, w) for w in words)
        if found and lib.for_task_type(other) is not None:
            key = (found / len(words), found, other)
            if best is None or key[:2] > best[:2]:
                best = key
    if best is None:  # libraries without task_keywords: the keywords stored on the skills
        for s in lib.task_specific():
            if s.keywords and all(_has_word(text, k) for k in s.keywords):
                return s
        return None
    return lib.for_task_type(best[2])


def _result(lib: SkillLibrary, chosen: list[Skill], task_type: str, instruction: str) -> Retrieved:
    match = matching_skill(lib, task_type, instruction)
    skills = chosen + ([lib.general] if lib.general else [])
    matched = match is not None and match.name in {s.name for s in chosen}
    return Retrieved(skills, hit=bool(chosen), matched=matched)


def keyword(lib: SkillLibrary, task_type: str, instruction: str) -> Retrieved:
    """The skill mapped to the task type, else the best keyword match in the goal text; plus general."""
    skill = matching_skill(lib, task_type, instruction)
    return _result(lib, [skill] if skill else [], task_type, instruction)


def full(lib: SkillLibrary, task_type: str, instruction: str) -> Retrieved:
    """The whole library (the paper's 'full library' baseline)."""
    return _result(lib, lib.task_specific(), task_type, instruction)


class RandomRetrieval:
    """One task-specific skill drawn uniformly per row from a generator seeded once per stage run."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def __call__(self, lib: SkillLibrary, task_type: str, instruction: str) -> Retrieved:
        pool = lib.task_specific()
        chosen = [self.rng.choice(pool)] if pool else []
        return _result(lib, chosen, task_type, instruction)


class UCBRetrieval:
    """UCB1 per task type over the task-specific skills.

    Prior pulls and mean rewards come from ``lib.stats`` (previous rounds); pulls made during this run count too,
    so rows of one task type spread over untried skills instead of all taking the same one. Ties (e.g. all
    untried) go to the skill that matches the task type, then by name.
    """

    def __init__(self, c: float):
        self.c = c
        self.local: Counter[tuple[str, str]] = Counter()

    def __call__(self, lib: SkillLibrary, task_type: str, instruction: str) -> Retrieved:
        pool = lib.task_specific()
        if not pool:
            return _result(lib, [], task_type, instruction)
        match = matching_skill(lib, task_type, instruction)
        arms = []
        for s in pool:
            pulls, mean = bandit.arm(lib.stats, task_type, s.name)
            arms.append((s, pulls + self.local[(task_type, s.name)], mean))
        total = sum(n for _, n, _ in arms)
        # max() keeps the first of equal keys and the pool is sorted by name: ties go to the earliest name.
        best = max(arms, key=lambda a: (bandit.ucb_score(a[2], a[1], total, self.c), a[0] is match))[0]
        self.local[(task_type, best.name)] += 1
        return _result(lib, [best], task_type, instruction)


register("keyword")(lambda **_: keyword)
register("ucb")(lambda *, ucb_c, **_: UCBRetrieval(ucb_c))
register("random")(lambda *, seed, **_: RandomRetrieval(seed))
register("full")(lambda **_: full)
