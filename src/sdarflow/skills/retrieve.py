"""Skill retrieval strategies: which skills the teacher sees for a row, chosen by config name (docs/skills.md).

The reference is ``SkillProvider`` in ZJU-REAL/SDAR ``verl/trainer/ppo/rlsd_utils.py``; ``keyword`` and ``full``
reproduce its choice, order and joining exactly: ``keyword`` is ``get_privileged_info_from_prompt`` (or, for a
library without ``task_keywords``, the skill of the row's task type: the reference's gamefile / data_source path),
``full`` is ``_build_all_skills_text``. ``ucb`` is a bandit per task type (below) and ``random`` draws one
task-specific skill (seeded). Every strategy puts the general skill first, then the chosen skills, joined as
``_get_skill_text`` joins them.

A strategy is a callable ``(library, task_type, prompt_text) -> Retrieved``, ``prompt_text`` being the row's whole
rendered student prompt (``sdarflow.rollout.prompt.prompt_text``); ``ucb`` and ``random`` carry state, so
``get_strategy`` builds a fresh one per stage run.

The ``ucb`` strategy's statistics: a UCB1 bandit per task type whose arms are the library's task-specific skills,
kept in the library folder (``skill_stats.json``) so they carry across rounds.

Reward of one rescored row whose teacher context held skill ``k``, over the row's response tokens:

    r = sign * mean_t (teacher_logprob_t - old_logprob_t),   sign = +1 if the episode succeeded, else -1

positive when the skill makes the teacher more confident in successful episodes' actions and less in failed ones',
the direction the gated distillation loss pushes the student. Every non-general skill in the row's ``skill_ids`` is
credited once, under the row's task type. ``extract-skills --rescored`` updates the statistics; a skill whose text
changed starts afresh. Layout::

    {"reward": "<the definition above>", "updates": 3,
     "arms": {task_type: {skill: {"pulls": 12, "reward_sum": 0.84}}}, "text_sha": {skill: "ab12..."}}
"""

from __future__ import annotations

import copy
import logging
import math
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from sdarflow.names import NameRegistry
from sdarflow.skills.library import Skill, SkillLibrary

log = logging.getLogger(__name__)

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


def _result(lib: SkillLibrary, chosen: list[Skill], task_type: str) -> Retrieved:
    """General first, then ``chosen``; ``matched`` when a skill mapped to the row's own task type is chosen."""
    own = {s.name for s in lib.skills_for(task_type)}
    skills = ([lib.general] if lib.general else []) + chosen
    return Retrieved(skills, hit=bool(chosen), matched=any(s.name in own for s in chosen))


def keyword(lib: SkillLibrary, task_type: str, prompt_text: str) -> Retrieved:
    """The skills of every task type with any keyword a plain substring of the lower-cased ``prompt_text`` (as the
    reference: ``cut`` matches ``cutlery``, keywords as written), in ``task_keywords`` order, repeats kept; the row's
    task type's skill when the library has no keywords."""
    if not lib.task_keywords:
        return _result(lib, lib.skills_for(task_type), task_type)
    text = prompt_text.lower()
    words_of = lib.task_keywords.items()
    chosen = [s for t, words in words_of if any(w in text for w in words) for s in lib.skills_for(t)]
    return _result(lib, chosen, task_type)


def full(lib: SkillLibrary, task_type: str, prompt_text: str) -> Retrieved:
    """The whole library in ``skill_files`` order (the paper's 'full library' baseline)."""
    return _result(lib, lib.task_specific(), task_type)


class RandomRetrieval:
    """One task-specific skill drawn uniformly per row from a generator seeded once per stage run."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def __call__(self, lib: SkillLibrary, task_type: str, prompt_text: str) -> Retrieved:
        pool = lib.task_specific()
        chosen = [self.rng.choice(pool)] if pool else []
        return _result(lib, chosen, task_type)


class UCBRetrieval:
    """UCB1 per task type over the task-specific skills: prior pulls and mean rewards from ``lib.stats``, plus this
    run's pulls (so rows spread over untried skills); ties go to a skill mapped to the task type, then the earliest."""

    def __init__(self, c: float):
        self.c = c
        self.local: Counter[tuple[str, str]] = Counter()

    def __call__(self, lib: SkillLibrary, task_type: str, prompt_text: str) -> Retrieved:
        pool = lib.task_specific()
        if not pool:
            return _result(lib, [], task_type)
        own = {s.name for s in lib.skills_for(task_type)}
        arms = []
        for s in pool:
            pulls, mean = arm(lib.stats, task_type, s.name)
            arms.append((s, pulls + self.local[(task_type, s.name)], mean))
        total = sum(n for _, n, _ in arms)
        # max() keeps the first of equal keys and the pool is in library order: ties go to the earliest skill.
        best = max(arms, key=lambda a: (ucb_score(a[2], a[1], total, self.c), a[0].name in own))[0]
        self.local[(task_type, best.name)] += 1
        return _result(lib, [best], task_type)


STRATEGIES.register("keyword")(lambda **_: keyword)
STRATEGIES.register("ucb")(lambda *, ucb_c, **_: UCBRetrieval(ucb_c))
STRATEGIES.register("random")(lambda *, seed, **_: RandomRetrieval(seed))
STRATEGIES.register("full")(lambda **_: full)


REWARD = "sign(success) * mean_t(teacher_logprob - old_logprob) per rescored row, credited to its non-general skills"


def arm(stats: dict, task_type: str, skill: str) -> tuple[int, float]:
    """(pulls, mean reward) of a skill for a task type; (0, 0.0) when never observed."""
    entry = stats.get("arms", {}).get(task_type, {}).get(skill)
    if not entry or entry.get("pulls", 0) <= 0:
        return 0, 0.0
    return int(entry["pulls"]), float(entry["reward_sum"]) / int(entry["pulls"])


def ucb_score(mean: float, pulls: int, total: int, c: float) -> float:
    """UCB1: ``mean + c * sqrt(ln(total) / pulls)``; an arm never pulled scores +inf (tried first)."""
    if pulls <= 0:
        return math.inf
    return mean + c * math.sqrt(math.log(max(total, 1)) / pulls)


def update(lib: SkillLibrary, rows: list[dict]) -> dict:
    """New statistics: ``lib.stats`` plus the rewards of ``rows``, rescored rows scored with ``lib`` (each with
    ``task_type``, ``success``, ``skill_ids``, ``old_logprobs``, ``teacher_logprobs``)."""
    stats = copy.deepcopy(lib.stats) if lib.stats else {}
    stats["reward"] = REWARD
    arms = stats.setdefault("arms", {})
    general = lib.general.name if lib.general else None
    credited = 0
    for row in rows:
        old, teacher = row["old_logprobs"], row["teacher_logprobs"]
        if not old:  # no response tokens, no reward
            continue
        gap = sum(q - s for s, q in zip(old, teacher, strict=True)) / len(old)
        r = gap if row["success"] else -gap
        # Once per skill: keyword retrieval lists a skill twice when two matching task types map to it.
        for name in dict.fromkeys(row["skill_ids"]):
            if name == general or name not in lib.skills:
                continue
            entry = arms.setdefault(row["task_type"], {}).setdefault(name, {"pulls": 0, "reward_sum": 0.0})
            entry["pulls"] += 1
            entry["reward_sum"] = round(entry["reward_sum"] + r, 6)
            credited += 1
    stats["updates"] = int(stats.get("updates", 0)) + 1
    stats["text_sha"] = {n: s.text_sha for n, s in sorted(lib.skills.items())}
    log.info("skill stats: %d rows, %d skill credits", len(rows), credited)
    return stats


def carry_over(stats: dict, lib: SkillLibrary) -> dict:
    """``stats`` for the merged library ``lib``: arms of removed skills or skills whose text changed are dropped."""
    if not stats:
        return {}
    out = copy.deepcopy(stats)
    shas = out.get("text_sha", {})
    keep = {n for n, s in lib.skills.items() if shas.get(n) == s.text_sha}
    arms = out.get("arms", {})
    dropped = {name for per_type in arms.values() for name in per_type if name not in keep}
    out["arms"] = {t: kept for t, a in arms.items() if (kept := {n: v for n, v in a.items() if n in keep})}
    out["text_sha"] = {n: s.text_sha for n, s in sorted(lib.skills.items())}
    if dropped:
        log.info("skill stats: reset for changed or removed skill(s) %s", sorted(dropped))
    return out
