"""Hindsight, rule-based skill extraction, skill evidence, and merging a round's skills into the previous library.

Extraction: from a round's episodes, per task type, the action pattern of the successful episodes abstracted over
object names, keeping only the steps that separate successes from failures. An action is kept literally when it
recurs across many different tasks (``prepare meal``); other actions keep their verb and tool and abstract the
object (``slice yellow potato with knife`` -> ``slice <item> with knife``). When the episode's goal text is known,
only objects the goal names become ``<item>`` (``take knife from table`` -> ``take knife from <place>``), and an
action that goes with one goal direction (``fry the <item>``: on its object in the successes whose goal has it,
rare in those whose goal does not) is bound to it: the pattern gets one :data:`DIRECTIONS_STEP`, and the skill
lists each direction's action (``fry the <item>: cook <item> with stove``), which is what varies between tasks of
one type and what a teacher most needs to know.

Evidence: an episode *followed* a skill when its abstracted actions contain at least ``follow_share`` of the
skill's steps. ``support`` counts the successful followers, ``success_rate`` is their share of all followers and
``lift`` is the followers' success rate minus the non-followers' (None when there is no failure to compare
against). A mined skill is kept only when ``lift > min_lift``, or when its task type had no failures at all.
"""

from __future__ import annotations

import logging
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, replace

from sdarflow.skills.library import GENERAL, Skill, SkillLibrary, normalize_step

log = logging.getLogger(__name__)


# The step a goal-bound action becomes in a pattern; the skill then lists the directions' actions (see module doc).
DIRECTIONS_STEP = "do each direction of the recipe as listed below"
_PLACEHOLDERS = ("<item>", "<place>")
_CLAUSE_SPLIT = re.compile(r"[;:\n]")  # "Directions: chop the carrot; fry the carrot"


@dataclass(frozen=True)
class EpisodeActions:
    task_id: str
    task_type: str
    actions: tuple[str, ...]
    success: bool
    goal: str = ""  # the task's instruction; empty when unknown (then every object is abstracted)


def episodes_from_rows(rows: list[dict]) -> list[EpisodeActions]:
    """Group turn rows (``traj_id``, ``turn``, ``response_text``, ``format_ok``, optional ``prompt_messages``)
    into episodes; the goal is read from the first turn's messages."""
    from sdarflow.rollout.prompt import goal_of, loads

    by_traj: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_traj[r["traj_id"]].append(r)
    out = []
    for traj_rows in by_traj.values():
        traj_rows.sort(key=lambda r: r["turn"])
        first = traj_rows[0]
        acts = tuple(" ".join(r["response_text"].lower().split()) for r in traj_rows if r["format_ok"])
        goal = goal_of(loads(first["prompt_messages"])) if first.get("prompt_messages") else ""
        out.append(EpisodeActions(first["task_id"], first["task_type"], acts, bool(first["success"]), goal))
    return out


def literal_actions(episodes: list[EpisodeActions], min_share: float = 0.3) -> set[str]:
    """Actions seen verbatim in successful episodes of at least ``min_share`` of the distinct solved tasks."""
    tasks_with: dict[str, set[str]] = defaultdict(set)
    solved = {e.task_id for e in episodes if e.success}
    for e in episodes:
        if e.success:
            for a in set(e.actions):
                tasks_with[a].add(e.task_id)
    need = max(2, int(min_share * len(solved) + 0.999))
    return {a for a, ts in tasks_with.items() if len(ts) >= need}


def _parts(action: str) -> tuple[str, str, str]:
    """(verb, object, tail): ``slice red apple with knife`` -> (``slice``, ``red apple``, `` with knife``)."""
    verb, _, rest = action.partition(" ")
    for sep in (" with ", " from "):
        if sep in rest:
            obj, _, tool = rest.partition(sep)
            return verb, obj, sep + tool
    return verb, rest, ""


def abstract(action: str, literal: set[str], goal: str = "") -> str:
    """The action with its object abstracted: every object without ``goal``; with it, only goal-named objects of
    actions not in ``literal``, and the place after ``from``. Already abstract steps come back unchanged."""
    if action == DIRECTIONS_STEP or any(p in action for p in _PLACEHOLDERS):
        return action
    verb, obj, tail = _parts(action)
    if not goal:
        if action in literal or not obj:
            return action
        return f"{verb} <item>" + (tail if tail.startswith(" with ") else "")
    if not obj:
        return action
    named = action not in literal and re.search(rf"\b{re.escape(obj)}\b", goal)
    return f"{verb} {'<item>' if named else obj}{' from <place>' if tail.startswith(' from ') else tail}"


def goal_directions(goal: str, objects: set[str]) -> dict[str, str]:
    """The goal's direction clauses on these objects, abstracted, with their object:
    ``fry the red apple`` -> ``{"fry the <item>": "red apple"}``."""
    out = {}
    for clause in _CLAUSE_SPLIT.split(goal):
        words = clause.split()
        if len(words) >= 3 and words[1] == "the" and " ".join(words[2:]) in objects:
            out[f"{words[0]} the <item>"] = " ".join(words[2:])
    return out


def direction_rules(wins: list[EpisodeActions], literal: set[str], min_share: float = 0.8) -> dict[str, str]:
    """Per goal direction (``fry the <item>``), the abstract action that goes with it: an action on the direction's
    object in at least ``min_share`` of the successful episodes whose goal has the direction, and in at most
    ``1 - min_share`` of those whose goal does not (``take <item> from <place>`` is in all of them, so it belongs
    to no direction). A direction in every episode has nothing to contrast with, and gets no rule."""
    with_d: Counter = Counter()
    on_object: dict[str, Counter] = defaultdict(Counter)  # episodes with d doing a on d's object
    in_episode: dict[str, Counter] = defaultdict(Counter)  # episodes with d doing a at all
    acts_all: Counter = Counter()  # episodes doing a
    for e in wins:
        acts = {abstract(a, literal, e.goal) for a in e.actions}
        acts_all.update(acts)
        for d, obj in goal_directions(e.goal, {_parts(a)[1] for a in e.actions}).items():
            with_d[d] += 1
            in_episode[d].update(acts)
            on_object[d].update({abstract(a, literal, e.goal) for a in e.actions if _parts(a)[1] == obj})
    rules = {}
    for d, n_d in sorted(with_d.items()):
        n_rest = len(wins) - n_d
        if not n_rest:
            continue

        def rest_share(a: str, d: str = d, n_rest: int = n_rest) -> float:
            return (acts_all[a] - in_episode[d][a]) / n_rest

        action = max(sorted(on_object[d]), key=lambda a: on_object[d][a] / n_d - rest_share(a))
        if on_object[d][action] >= min_share * n_d and rest_share(action) <= 1 - min_share:
            rules[d] = action
    return rules


def pattern(e: EpisodeActions, literal: set[str], bound: frozenset[str] = frozenset()) -> list[str]:
    """The episode's abstract steps, consecutive repeats merged; actions in ``bound`` (those a direction rule
    covers) become :data:`DIRECTIONS_STEP`."""
    steps: list[str] = []
    for a in e.actions:
        s = abstract(a, literal, e.goal)
        s = DIRECTIONS_STEP if s in bound else s
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


def render(title: str, steps: list[str], rules: dict[str, str] | None = None) -> str:
    """The Markdown the teacher sees. Evidence stays in the mapping, so counts changing do not change the text.
    Direction rules are prose lines, not list items, so they are not steps."""
    lines = [f"# {title}", ""] + [f"{i}. {s}" for i, s in enumerate(steps, 1)]
    if rules and DIRECTIONS_STEP in steps:
        lines += ["", "Directions:"] + [f"{direction}: {action}" for direction, action in rules.items()]
    if any("<item>" in s for s in steps):
        lines += ["", "<item> is an object named in the goal."]
    if any("<place>" in s for s in steps):
        lines += ["<place> is where the observation shows it."]
    return "\n".join(lines) + "\n"


def directions(text: str) -> dict[str, str]:
    """The direction rules a skill's text lists (what :func:`render` writes under ``Directions:``), normalized:
    ``{"fry the <item>": "cook <item> with stove"}``."""
    _, found, block = text.partition("\nDirections:\n")
    rules = {}
    for line in block.splitlines() if found else []:
        direction, sep, action = line.partition(":")
        if not sep or not action.strip():
            break  # the rules end at the first line that is not "direction: action"
        rules[normalize_step(direction)] = normalize_step(action)
    return rules


def skill_name(task_type: str) -> str:
    return "skill_" + "".join(c if c.isalnum() else "_" for c in task_type)


def evidence(
    steps: list[str], episodes: list[EpisodeActions], literal: set[str], follow_share: float = 0.5
) -> dict:
    """Support, followers, success rate and lift of a skill with these steps on these episodes (the directions
    step is not counted: it stands for actions that differ between tasks)."""
    wanted = {abstract(normalize_step(s), literal) for s in steps} - {DIRECTIONS_STEP}
    followed: list[bool] = []
    for e in episodes:
        have = set(pattern(e, literal))
        followed.append(bool(wanted) and len(wanted & have) >= follow_share * len(wanted))
    fol = [e for e, f in zip(episodes, followed, strict=True) if f]
    rest = [e for e, f in zip(episodes, followed, strict=True) if not f]
    support = sum(e.success for e in fol)
    rate = support / len(fol) if fol else 0.0
    has_failures = any(not e.success for e in episodes)
    lift = None
    if has_failures and fol:
        rest_rate = sum(e.success for e in rest) / len(rest) if rest else 0.0
        lift = round(rate - rest_rate, 4)
    return {
        "support": support,
        "followed": len(fol),
        "episodes": len(episodes),
        "success_rate": round(rate, 4),
        "lift": lift,
    }


def extract_skills(
    episodes: list[EpisodeActions],
    min_support: int = 2,
    min_win_share: float = 0.5,
    literal_share: float = 0.3,
    min_lift: float = 0.0,
    follow_share: float = 0.5,
) -> SkillLibrary:
    """One skill per task type with at least ``min_support`` successful episodes, plus ``general_skills``.

    The library has no ``task_keywords``: the only words known for a task type are its name's, and the reference's
    keyword rule (any keyword a substring of the rendered prompt) reads them wrongly (``cook`` is in ``cookbook``,
    ``plain`` is in no prompt). Without keywords, keyword retrieval maps the row's task type to its skill.
    """
    literal = literal_actions(episodes, literal_share)
    by_type: dict[str, list[EpisodeActions]] = defaultdict(list)
    for e in episodes:
        by_type[e.task_type].append(e)
    lib = SkillLibrary()
    for task_type, eps in sorted(by_type.items()):
        rules = direction_rules([e for e in eps if e.success], literal)
        bound = frozenset(rules.values())
        wins = [pattern(e, literal, bound) for e in eps if e.success]
        losses = [pattern(e, literal, bound) for e in eps if not e.success]
        if len(wins) < min_support:
            log.info(
                "skills: %s has %d successes < min_support %d; skipped", task_type, len(wins), min_support
            )
            continue
        steps = _separating_steps(wins, losses, min_win_share)
        if not steps:
            continue
        ev = {**evidence(steps, eps, literal, follow_share), "source": "rule"}
        if ev["lift"] is not None and ev["lift"] <= min_lift:
            log.info(
                "skills: %s pattern does not separate successes (lift %s <= %s); skipped",
                task_type,
                ev["lift"],
                min_lift,
            )
            continue
        name = skill_name(task_type)
        lib.skills[name] = Skill(
            name, render(f"Skill for {task_type} tasks", steps, rules), [task_type], evidence=ev
        )
    rules = direction_rules([e for e in episodes if e.success], literal)
    all_wins = [pattern(e, literal, frozenset(rules.values())) for e in episodes if e.success]
    if len(all_wins) >= min_support:
        general = _separating_steps(all_wins, [], min_win_share=0.8)
        if general:
            ev = {**evidence(general, episodes, literal, follow_share), "source": "rule"}
            lib.skills[GENERAL] = Skill(GENERAL, render("General skills", general, rules), [], [], ev)
    return lib


def reevaluate(
    lib: SkillLibrary, episodes: list[EpisodeActions], literal_share: float = 0.3, follow_share: float = 0.5
) -> SkillLibrary:
    """A copy of ``lib`` with each skill's evidence measured on this round's episodes of its task types (all
    episodes for the general skill); skills with no such episodes keep their evidence."""
    literal = literal_actions(episodes, literal_share)
    out = SkillLibrary(dict(lib.skills), dict(lib.task_keywords), lib.stats)
    for name, skill in lib.skills.items():
        eps = episodes if lib.is_general(skill) else [e for e in episodes if e.task_type in skill.task_types]
        if eps and skill.steps:
            measured = evidence(skill.steps, eps, literal, follow_share)
            out.skills[name] = replace(skill, evidence={**skill.evidence, **measured})
    return out


def _strength(skill: Skill) -> tuple[float, int]:
    ev = skill.evidence
    return (ev.get("lift") if ev.get("lift") is not None else 0.0, int(ev.get("support", 0)))


def _jaccard(a: list[str], b: list[str]) -> float:
    sa, sb = set(a), set(b)
    return len(sa & sb) / len(sa | sb) if sa | sb else 0.0


def merge(previous: SkillLibrary | None, new: SkillLibrary, dedupe_threshold: float = 0.8) -> SkillLibrary:
    """``new`` merged into ``previous``.

    A new skill replaces the one of the same name unless the old one is stronger (higher lift, then support). A
    new skill whose steps overlap an existing skill of another name by >= ``dedupe_threshold`` (Jaccard) is not
    added: its task types are mapped to the existing skill instead. Task types never mapped keep their skills.
    """
    merged = SkillLibrary(
        dict(previous.skills) if previous else {},
        dict(previous.task_keywords) if previous else {},
        previous.stats if previous else {},
    )
    for name, skill in sorted(new.skills.items()):
        old = merged.skills.get(name)
        if old is not None:
            if _strength(skill) >= _strength(old):
                # keep task types an earlier dedupe mapped to the old skill
                merged.skills[name] = replace(
                    skill, task_types=sorted(set(old.task_types) | set(skill.task_types))
                )
            continue
        dup = next(
            (
                s
                for s in merged.task_specific()
                if not new.is_general(skill) and _jaccard(s.steps, skill.steps) >= dedupe_threshold
            ),
            None,
        )
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
    return merged
