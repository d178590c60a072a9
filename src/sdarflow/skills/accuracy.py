"""How right a skill library is, scored against what the env knows (``EnvSuite.skill_truth``): a check of the
extractor against the env, never an input to it (the verdicts: docs/skills.md).

Per skill, over the task types it covers (every type for the general skill): a direction rule is *right* when,
for every covered type, it names the direction's action and the type requires that preparation, *wrong* when that
holds for none, *recipe-blind* otherwise; an unconditional step that is a direction's action is *recipe-blind* when
some covered type requires that preparation, else *wrong*; a step that calls a tool is *right* when every task of
every covered type calls it in its gold plan, *wrong* when none does, *recipe-blind* otherwise. Other rules and
steps are not scored.
"""

from __future__ import annotations

import re
from typing import Any

from sdarflow.envs import SkillTruth
from sdarflow.skills.extract import directions
from sdarflow.skills.library import Skill, SkillLibrary

VERDICTS = ("right", "wrong", "recipe_blind")


def score_skill(skill: Skill, types: list[str], truth: SkillTruth) -> dict[str, list[str]]:
    """The skill's scored rules and steps by verdict (``"direction: action"`` for rules, the step for steps)."""
    out: dict[str, list[str]] = {v: [] for v in VERDICTS}
    for direction, action in directions(skill.text).items():
        if direction not in truth.actions:
            continue
        needs = truth.needs[direction]
        holds = [needs in truth.prepared_by[t] and action == truth.actions[direction] for t in types]
        verdict = "right" if all(holds) else "wrong" if not any(holds) else "recipe_blind"
        out[verdict].append(f"{direction}: {action}")
    by_action = {action: truth.needs[d] for d, action in truth.actions.items()}
    for step in skill.steps:
        if step in by_action:
            needed = any(by_action[step] in truth.prepared_by[t] for t in types)
            out["recipe_blind" if needed else "wrong"].append(step)
        call = re.search(truth.call_pattern, step) if truth.call_pattern else None
        if call:
            shares = [truth.calls.get(t, {}).get(call.group(1), 0.0) for t in types]
            always, never = all(x == 1.0 for x in shares), not any(x > 0 for x in shares)
            out["right" if always else "wrong" if never else "recipe_blind"].append(step)
    return out


def score_library(lib: SkillLibrary, truth: SkillTruth) -> dict[str, Any]:
    """Counts of right, wrong and recipe-blind rules over the library, and each skill's scored items."""
    skills = {}
    for name, skill in lib.skills.items():
        types = [t for t in skill.task_types if t in truth.task_types] or truth.task_types
        skills[name] = score_skill(skill, types, truth)
    return {**{v: sum(len(s[v]) for s in skills.values()) for v in VERDICTS}, "skills": skills}
