"""Skill retrieval strategies: which skills the teacher sees for a row. Chosen by config name."""

from __future__ import annotations

from dataclasses import dataclass

from sdarflow.errors import ConfigError
from sdarflow.skills.library import Skill, SkillLibrary


@dataclass(frozen=True)
class Retrieved:
    skills: list[Skill]
    hit: bool  # a task-specific skill was found (not only general skills)

    @property
    def ids(self) -> list[str]:
        return [s.name for s in self.skills]

    @property
    def text(self) -> str:
        return "\n".join(s.text.strip() for s in self.skills)


def keyword(lib: SkillLibrary, task_type: str, instruction: str) -> Retrieved:
    """The skill mapped to the task type; else one whose keywords all occur in the goal text; plus general."""
    skill = lib.for_task_type(task_type)
    if skill is None:
        text = instruction.lower()
        skill = next(
            (s for s in lib.task_specific() if s.keywords and all(k in text for k in s.keywords)), None
        )
    chosen = ([skill] if skill else []) + ([lib.general] if lib.general else [])
    return Retrieved(chosen, hit=skill is not None)


def full(lib: SkillLibrary, task_type: str, instruction: str) -> Retrieved:
    """The whole library (the paper's 'full library' baseline)."""
    specific = lib.task_specific()
    chosen = specific + ([lib.general] if lib.general else [])
    return Retrieved(chosen, hit=bool(specific))


STRATEGIES = {"keyword": keyword, "full": full}


def get_strategy(name: str):
    if name not in STRATEGIES:
        raise ConfigError(f"unknown retrieval strategy '{name}'; available: {', '.join(STRATEGIES)}")
    return STRATEGIES[name]
