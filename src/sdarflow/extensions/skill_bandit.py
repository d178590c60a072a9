"""The ``ucb`` skill retrieval strategy (``rescore --retrieval ucb``): a UCB1 bandit per task type whose arms are
the library's task-specific skills, with statistics kept in the library folder (``skill_stats.json``) so they carry
across rounds.

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
from collections import Counter

from sdarflow import storage
from sdarflow.errors import ConfigError
from sdarflow.schema import RESCORED_SCHEMA
from sdarflow.skills.library import SkillLibrary
from sdarflow.skills.retrieve import Retrieved, retrieved

log = logging.getLogger(__name__)


def ucb_strategy(*, ucb_c: float, **_) -> UCBRetrieval:
    return UCBRetrieval(ucb_c)


class UCBRetrieval:
    """UCB1 per task type over the task-specific skills: prior pulls and mean rewards from ``lib.stats``, plus this
    run's pulls (so rows spread over untried skills); ties go to a skill mapped to the task type, then the earliest."""

    def __init__(self, c: float):
        self.c = c
        self.local: Counter[tuple[str, str]] = Counter()

    def __call__(self, lib: SkillLibrary, task_type: str, prompt_text: str) -> Retrieved:
        pool = lib.task_specific()
        if not pool:
            return retrieved(lib, [], task_type)
        own = {s.name for s in lib.skills_for(task_type)}
        arms = []
        for s in pool:
            pulls, mean = arm(lib.stats, task_type, s.name)
            arms.append((s, pulls + self.local[(task_type, s.name)], mean))
        total = sum(n for _, n, _ in arms)
        # max() keeps the first of equal keys and the pool is in library order: ties go to the earliest skill.
        best = max(arms, key=lambda a: (ucb_score(a[2], a[1], total, self.c), a[0].name in own))[0]
        self.local[(task_type, best.name)] += 1
        return retrieved(lib, [best], task_type)


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


def updated_stats(rescored: list[str], previous: SkillLibrary | None) -> dict:
    """The previous library's bandit statistics plus the rewards measured in the previous round's rescored rows."""
    if not rescored:
        return previous.stats if previous else {}
    if previous is None:
        raise ConfigError(
            "extract-skills: --rescored needs --previous (the library those rows were scored with); fix: pass "
            "--previous with the skill library the rescore used"
        )
    for uri in rescored:
        used = storage.read_manifest(uri, "rescored").get("skill_library")
        if used != previous.version:
            raise ConfigError(
                f"extract-skills: rescored dataset '{uri}' was scored with skill library {used}, but --previous "
                f"is library {previous.version}; fix: pass the previous round's library and its rescored dataset"
            )
    cols = ["task_type", "success", "skill_ids", "old_logprobs", "teacher_logprobs"]
    rows = storage.read_table(rescored, kind="rescored", schema=RESCORED_SCHEMA).select(cols).to_pylist()
    return update(previous, rows)
