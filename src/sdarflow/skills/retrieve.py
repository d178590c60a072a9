"""Skill retrieval strategies: which skills the teacher sees for a row, chosen by config name (docs/skills.md).

The reference is ``SkillProvider`` in ZJU-REAL/SDAR ``verl/trainer/ppo/rlsd_utils.py``; ``keyword`` and ``full``
reproduce its choice, order and joining exactly: ``keyword`` is ``get_privileged_info_from_prompt`` (or, for a
library without ``task_keywords``, the skill of the row's task type: the reference's gamefile / data_source path),
``full`` is ``_build_all_skills_text``. ``ucb`` is a bandit per task type (``sdarflow.extensions.skill_bandit``) and
``random`` draws one task-specific skill (seeded). Every strategy puts the general skill first, then the chosen skills, joined as
``_get_skill_text`` joins them.

A strategy is a callable ``(library, task_type, prompt_text) -> Retrieved``, ``prompt_text`` being the row's whole
rendered student prompt (``sdarflow.rollout.prompt.prompt_text``); ``ucb`` and ``random`` carry state, so
``get_strategy`` builds a fresh one per stage run.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from sdarflow.names import NameRegistry
from sdarflow.skills.library import Skill, SkillLibrary

SKILL_SEPARATOR = "\n\n"  # the reference joins skill texts with a blank line


@dataclass(frozen=True)
class Retrieved:
    skills: list[Skill]  # the general skill (if the library has one) first, then the chosen ones in order
    hit: bool  # a task-specific skill was found (not only general skills)
    matched: bool = False  # the skill that belongs to the row's task type is among them

    @property
    def ids(self) -> list[str]:
        return [s.name for s in self.skills]

    @property
    def text(self) -> str:
        """Stripped skill texts joined by a blank line. Empty texts are skipped, so a library without a general
        skill starts with its first task skill (the reference would start with an empty general and a blank line)."""
        return SKILL_SEPARATOR.join(t for t in (s.text.strip() for s in self.skills) if t)


Strategy = Callable[[SkillLibrary, str, str], Retrieved]
# name -> factory(seed=, ucb_c=) -> Strategy
STRATEGIES: NameRegistry[Callable[..., Strategy]] = NameRegistry("retrieval strategy")


def get_strategy(name: str, *, seed: int = 0, ucb_c: float = 0.5) -> Strategy:
    return STRATEGIES.get(name)(seed=seed, ucb_c=ucb_c)


def retrieved(lib: SkillLibrary, chosen: list[Skill], task_type: str) -> Retrieved:
    """General first, then ``chosen``; ``matched`` when a skill mapped to the row's own task type is chosen."""
    own = {s.name for s in lib.skills_for(task_type)}
    skills = ([lib.general] if lib.general else []) + chosen
    return Retrieved(skills, hit=bool(chosen), matched=any(s.name in own for s in chosen))


def keyword(lib: SkillLibrary, task_type: str, prompt_text: str) -> Retrieved:
    """The skills of every task type with any keyword a plain substring of the lower-cased ``prompt_text`` (as the
    reference: ``cut`` matches ``cutlery``, keywords as written), in ``task_keywords`` order, repeats kept; the row's
    task type's skill when the library has no keywords."""
    if not lib.task_keywords:
        return retrieved(lib, lib.skills_for(task_type), task_type)
    text = prompt_text.lower()
    words_of = lib.task_keywords.items()
    chosen = [s for t, words in words_of if any(w in text for w in words) for s in lib.skills_for(t)]
    return retrieved(lib, chosen, task_type)


def full(lib: SkillLibrary, task_type: str, prompt_text: str) -> Retrieved:
    """The whole library in ``skill_files`` order (the paper's 'full library' baseline)."""
    return retrieved(lib, lib.task_specific(), task_type)


class RandomRetrieval:
    """One task-specific skill drawn uniformly per row from a generator seeded once per stage run."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def __call__(self, lib: SkillLibrary, task_type: str, prompt_text: str) -> Retrieved:
        pool = lib.task_specific()
        chosen = [self.rng.choice(pool)] if pool else []
        return retrieved(lib, chosen, task_type)


STRATEGIES.register("keyword")(lambda **_: keyword)
STRATEGIES.add_lazy("ucb", "sdarflow.extensions.skill_bandit:ucb_strategy")
STRATEGIES.register("random")(lambda *, seed, **_: RandomRetrieval(seed))
STRATEGIES.register("full")(lambda **_: full)
