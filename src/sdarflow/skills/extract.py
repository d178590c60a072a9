"""Hindsight, rule-based skill extraction: from a round's episodes, per task type, the action pattern of the
successful episodes abstracted over object names, keeping only the steps that separate successes from failures.

An action is kept literally when it recurs across many different tasks (``prepare meal``, ``take knife``); other
actions keep their verb and tool and abstract the object (``slice yellow potato with knife`` ->
``slice <item> with knife``).
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from dataclasses import dataclass

from sdarflow.skills.library import GENERAL, Skill, SkillLibrary

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EpisodeActions:
    task_id: str
    task_type: str
    actions: tuple[str, ...]
    success: bool


def episodes_from_rows(rows: list[dict]) -> list[EpisodeActions]:
    """Group turn rows (``traj_id``, ``turn``, ``response_text``, ``format_ok``, ...) into episodes."""
    by_traj: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_traj[r["traj_id"]].append(r)
    out = []
    for traj_rows in by_traj.values():
        traj_rows.sort(key=lambda r: r["turn"])
        first = traj_rows[0]
        acts = tuple(" ".join(r["response_text"].lower().split()) for r in traj_rows if r["format_ok"])
        out.append(EpisodeActions(first["task_id"], first["task_type"], acts, bool(first["success"])))
    return out


def _literal_actions(episodes: list[EpisodeActions], min_share: float) -> set[str]:
    """Actions seen verbatim in successful episodes of at least ``min_share`` of the distinct solved tasks."""
    tasks_with: dict[str, set[str]] = defaultdict(set)
    solved = {e.task_id for e in episodes if e.success}
    for e in episodes:
        if e.success:
            for a in set(e.actions):
                tasks_with[a].add(e.task_id)
    need = max(2, int(min_share * len(solved) + 0.999))
    return {a for a, ts in tasks_with.items() if len(ts) >= need}


def abstract(action: str, literal: set[str]) -> str:
    if action in literal:
        return action
    words = action.split()
    if len(words) < 2:
        return action
    if " with " in action:
        tool = action.split(" with ", 1)[1]
        return f"{words[0]} <item> with {tool}"
    return f"{words[0]} <item>"


def _pattern(e: EpisodeActions, literal: set[str]) -> list[str]:
    steps: list[str] = []
    for a in e.actions:
        s = abstract(a, literal)
        if not steps or steps[-1] != s:
            steps.append(s)
    return steps


def _separating_steps(wins: list[list[str]], losses: list[list[str]], min_win_share: float) -> list[str]:
    """Steps in >= min_win_share of successes and more common in successes than failures, in their usual order."""
    win_count = Counter(s for p in wins for s in set(p))
    loss_count = Counter(s for p in losses for s in set(p))
    kept = []
    for step, n in win_count.items():
        win_share = n / len(wins)
        loss_share = loss_count[step] / len(losses) if losses else 0.0
        if win_share >= min_win_share and win_share > loss_share:
            kept.append(step)

    # Order by mean relative position in the successful episodes.
    def position(step: str) -> float:
        pos = [p.index(step) / max(1, len(p) - 1) for p in wins if step in p]
        return sum(pos) / len(pos)

    return sorted(kept, key=lambda s: (position(s), s))


def _render(title: str, steps: list[str], support: int, total: int) -> str:
    lines = [f"# {title}", ""]
    lines += [f"{i}. {s}" for i, s in enumerate(steps, 1)]
    lines += [
        "",
        "<item> is an object named in the goal.",
        f"Evidence: {support} of {total} episodes succeeded.",
    ]
    return "\n".join(lines) + "\n"


def extract_skills(
    episodes: list[EpisodeActions],
    min_support: int = 2,
    min_win_share: float = 0.5,
    literal_share: float = 0.3,
) -> SkillLibrary:
    """One skill per task type with at least ``min_support`` successful episodes, plus ``general_skills``."""
    literal = _literal_actions(episodes, literal_share)
    by_type: dict[str, list[EpisodeActions]] = defaultdict(list)
    for e in episodes:
        by_type[e.task_type].append(e)
    lib = SkillLibrary()
    all_wins = [_pattern(e, literal) for e in episodes if e.success]
    for task_type, eps in sorted(by_type.items()):
        wins = [_pattern(e, literal) for e in eps if e.success]
        losses = [_pattern(e, literal) for e in eps if not e.success]
        if len(wins) < min_support:
            log.info(
                "skills: task type %s has %d successes < min_support %d; skipped",
                task_type,
                len(wins),
                min_support,
            )
            continue
        steps = _separating_steps(wins, losses, min_win_share)
        if not steps:
            continue
        name = "skill_" + "".join(c if c.isalnum() else "_" for c in task_type)
        evidence = {
            "support": len(wins),
            "episodes": len(eps),
            "success_rate": round(len(wins) / len(eps), 4),
        }
        keywords = sorted({w for w in task_type.replace("+", " ").replace("_", " ").split() if w})
        text = _render(f"Skill for {task_type} tasks", steps, len(wins), len(eps))
        lib.skills[name] = Skill(name, text, [task_type], keywords, evidence)
    if len(all_wins) >= min_support:
        general = _separating_steps(all_wins, [], min_win_share=0.8)
        wins_total = len(all_wins)
        text = _render("General skills", general, wins_total, len(episodes))
        evidence = {
            "support": wins_total,
            "episodes": len(episodes),
            "success_rate": round(wins_total / len(episodes), 4),
        }
        lib.skills[GENERAL] = Skill(GENERAL, text, [], [], evidence)
    return lib


def merge(previous: SkillLibrary | None, new: SkillLibrary) -> SkillLibrary:
    """New skills replace old ones for the same task types unless the old one has more support."""
    if previous is None:
        return new
    merged = SkillLibrary(dict(previous.skills))
    for name, skill in new.skills.items():
        old = merged.skills.get(name)
        if old is None or skill.evidence.get("support", 0) >= old.evidence.get("support", 0):
            merged.skills[name] = skill
    return merged
