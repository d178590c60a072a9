"""Merging a round's skills into the previous library: evidence before replacement (docs/skills.md).

A skill's steps, or one of its direction rules, from the previous library is replaced only when this round's
evidence for the new one passes :func:`beats`, both sides measured on this round's episodes (:func:`reevaluate`);
every contested replacement, made or refused, is returned with both sides' evidence. A rule no episode tried has
no interval and stays; a direction the old skill has no rule for takes the new rule. Hand-written skills (no
``source`` in their evidence) are marked ``hand``; one not in the extractor's layout (steps, then ``Directions:``)
is only ever replaced whole. Rules keep their origin (source, round); their support and interval are re-measured.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace

from sdarflow.skills.extract import (
    DIRECTIONS_STEP,
    MIN_SUPPORT,
    EpisodeActions,
    directions,
    evidence,
    literal_actions,
    render,
    rule_evidence,
)
from sdarflow.skills.library import Skill, SkillLibrary

log = logging.getLogger(__name__)

HAND = "hand"  # the source of a skill with no recorded one: written by a person
# What a replacement record shows of each side's evidence.
_SHOWN = (
    "action",
    "steps",
    "source",
    "round",
    "support",
    "tasks",
    "followed",
    "tried",
    "success_rate",
    "interval",
)


def source(skill: Skill) -> str:
    return skill.evidence.get("source", HAND)


def _rules(skill: Skill) -> dict[str, dict]:
    """The skill's direction rules, each with its recorded evidence and the skill's source where it has none."""
    old = skill.evidence.get("rules", {})
    return {
        d: {"source": source(skill), **old.get(d, {}), "action": a} for d, a in directions(skill.text).items()
    }


def reevaluate(lib: SkillLibrary, episodes: list[EpisodeActions], follow_share: float = 0.5) -> SkillLibrary:
    """A copy of ``lib`` with each skill's evidence, and each of its direction rules', measured on this round's
    episodes of its task types (all episodes for the general skill); skills with no such episodes keep theirs."""
    literal = literal_actions(episodes)
    out = SkillLibrary(dict(lib.skills), dict(lib.task_keywords), lib.stats)
    for name, skill in lib.skills.items():
        eps = episodes if lib.is_general(skill) else [e for e in episodes if e.task_type in skill.task_types]
        if not eps or not skill.steps:
            continue
        ev = {**skill.evidence, **evidence(skill.steps, eps, literal, follow_share)}
        rules = _rules(skill)
        if rules:
            ev["rules"] = {d: {**r, **rule_evidence(d, r["action"], eps, literal)} for d, r in rules.items()}
        out.skills[name] = replace(skill, evidence=ev)
    return out


def beats(new: Mapping, old: Mapping, min_support: int = MIN_SUPPORT) -> bool:
    """The replacement test: ``new`` has successes on at least ``min_support`` tasks and the lower end of its
    success rate's interval is above the upper end of ``old``'s. An old side without an interval (not tried) is
    never beaten."""
    if new.get("tasks", 0) < min_support or not new.get("interval") or not old.get("interval"):
        return False
    return new["interval"][0] > old["interval"][1]


def _decide(
    decisions: list[dict], skill: str, rule: str, new: Mapping, old: Mapping, min_support: int
) -> bool:
    replaced = beats(new, old, min_support)
    decisions.append(
        {
            "skill": skill,
            "rule": rule,
            "replaced": replaced,
            "previous": {k: old[k] for k in _SHOWN if k in old},
            "new": {k: new[k] for k in _SHOWN if k in new},
        }
    )
    log.info("skills: %s %s: %s", skill, rule, "replaced" if replaced else "kept (new evidence not stronger)")
    return replaced


def _merged_rules(old: Skill, new: Skill, min_support: int, decisions: list[dict]) -> dict[str, dict]:
    """The old skill's direction rules, each replaced only where the new rule for its direction beats it, plus the
    new skill's rules for directions the old one has none for; each with its evidence and provenance."""
    new_ev, out = new.evidence.get("rules", {}), _rules(old)
    for d, action in directions(new.text).items():
        candidate = {**new_ev.get(d, {}), "action": action}
        if d not in out or (
            out[d]["action"] != action and _decide(decisions, old.name, d, candidate, out[d], min_support)
        ):
            out[d] = candidate
    return out


def _title(text: str) -> str:
    first = text.splitlines()[0] if text else ""
    return first.lstrip("#").strip()


def _merged_skill(old: Skill, new: Skill, min_support: int, decisions: list[dict]) -> Skill:
    """One skill from the previous library's and this round's of the same name (see the module doc)."""
    types = sorted(set(old.task_types) | set(new.task_types))
    new_side, old_side = {**new.evidence, "steps": new.steps}, {**old.evidence, "steps": old.steps}
    take_new = old.steps != new.steps and _decide(
        decisions, old.name, "steps", new_side, old_side, min_support
    )
    base = new if take_new else old
    if old.text != render(_title(old.text), old.steps, directions(old.text)):  # prose: not editable by rule
        return replace(base, task_types=types)
    rules = _merged_rules(old, new, min_support, decisions)
    steps = base.steps
    if rules and DIRECTIONS_STEP not in steps:  # the replacing steps had no room for the old rules
        other = new.steps if DIRECTIONS_STEP in new.steps else old.steps
        steps.insert(min(other.index(DIRECTIONS_STEP), len(steps)), DIRECTIONS_STEP)
    ev = {k: v for k, v in base.evidence.items() if k != "rules"} | ({"rules": rules} if rules else {})
    text = render(_title(base.text), steps, {d: r["action"] for d, r in rules.items()})
    return Skill(old.name, text, types, base.keywords, ev, old.file)


def _jaccard(a: list[str], b: list[str]) -> float:
    sa, sb = set(a), set(b)
    return len(sa & sb) / len(sa | sb) if sa | sb else 0.0


def merge(
    previous: SkillLibrary | None,
    new: SkillLibrary,
    min_support: int = MIN_SUPPORT,
    dedupe_threshold: float = 0.8,
) -> tuple[SkillLibrary, list[dict]]:
    """``new`` merged into ``previous`` (re-measured on the same episodes first, :func:`reevaluate`), and the
    contested replacements, made or refused.

    A skill of a name the previous library has is merged with it (module doc). A new skill whose steps overlap an
    existing skill of another name by >= ``dedupe_threshold`` (Jaccard) is not added: its task types are mapped to
    the existing skill instead. Task types never mapped keep their skills.
    """
    previous = previous or SkillLibrary()
    marked = {n: replace(s, evidence={**s.evidence, "source": source(s)}) for n, s in previous.skills.items()}
    merged = SkillLibrary(marked, dict(previous.task_keywords), previous.stats)
    decisions: list[dict] = []
    for name, skill in sorted(new.skills.items()):
        if name in merged.skills:
            merged.skills[name] = _merged_skill(merged.skills[name], skill, min_support, decisions)
            continue
        similar = (s for s in merged.task_specific() if _jaccard(s.steps, skill.steps) >= dedupe_threshold)
        dup = None if new.is_general(skill) else next(similar, None)
        if dup is None:
            merged.skills[name] = skill
            continue
        log.info(
            "skills: %s duplicates %s; task types %s mapped to %s", name, dup.name, skill.task_types, dup.name
        )
        for other in merged.task_specific():
            if other.name != dup.name and set(other.task_types) & set(skill.task_types):
                kept = [t for t in other.task_types if t not in skill.task_types]
                merged.skills[other.name] = replace(other, task_types=kept)
        types = sorted(set(dup.task_types) | set(skill.task_types))
        keywords = sorted(set(dup.keywords) | set(skill.keywords))
        merged.skills[dup.name] = replace(merged.skills[dup.name], task_types=types, keywords=keywords)
    for t, words in new.task_keywords.items():
        merged.task_keywords.setdefault(t, words)
    return merged, decisions
