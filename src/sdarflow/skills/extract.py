"""Hindsight, rule-based skill extraction and skill evidence (merging: ``sdarflow.skills.merge``; the method and
its measured settings: docs/skills.md).

Extraction: per task type, the action pattern of the successful episodes abstracted over the objects the goal
names, keeping only the steps that separate successes from failures; an action bound to one goal direction becomes
one :data:`DIRECTIONS_STEP` and a direction rule (``fry the <item>: cook <item> with stove``). A step the successes
disagree on is a direction rule or nothing. A task type, and a direction, needs :data:`MIN_SUPPORT` successes.

Evidence: an episode *followed* a skill when its abstracted actions contain at least ``follow_share`` of the
skill's steps. ``support`` counts the successful followers, ``success_rate`` is their share of all followers (with
its Wilson ``interval``) and ``lift`` is the followers' success rate minus the non-followers' (None when there is
no failure to compare against). A mined skill is kept only when ``lift > min_lift``, or when its task type had no
failures at all.
"""

from __future__ import annotations

import logging
import re
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from sdarflow.intervals import wilson_interval
from sdarflow.skills.library import GENERAL, Skill, SkillLibrary, normalize_step

log = logging.getLogger(__name__)


# Successful episodes a task type, or a goal direction, needs before it gets a skill or a rule: measured by
# ``python -m bench.skill_support`` (docs/skills.md), where fewer successes let wrong and recipe-blind rules in.
MIN_SUPPORT = 5
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
    from sdarflow.rollout.prompt import action_of, goal_of, loads

    by_traj: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_traj[r["traj_id"]].append(r)
    out = []
    for traj_rows in by_traj.values():
        traj_rows.sort(key=lambda r: r["turn"])
        first = traj_rows[0]
        messages = loads(first["prompt_messages"]) if first.get("prompt_messages") else []
        acts = tuple(action_of(r["response_text"], messages) for r in traj_rows if r["format_ok"])
        goal = goal_of(messages)
        out.append(EpisodeActions(first["task_id"], first["task_type"], acts, bool(first["success"]), goal))
    return out


def literal_actions(episodes: list[EpisodeActions], min_share: float = 0.3) -> set[str]:
    """Actions seen verbatim in successful episodes of at least ``min_share`` of the distinct solved tasks."""
    wins = [e for e in episodes if e.success]
    tasks_with: dict[str, set[str]] = defaultdict(set)
    for e in wins:
        for a in e.actions:
            tasks_with[a].add(e.task_id)
    need = max(2, int(min_share * len({e.task_id for e in wins}) + 0.999))
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
    if not obj or (not goal and action in literal):
        return action
    if not goal:
        return f"{verb} <item>" + (tail if tail.startswith(" with ") else "")
    named = action not in literal and re.search(rf"\b{re.escape(obj)}\b", goal)
    return f"{verb} {'<item>' if named else obj}{' from <place>' if tail.startswith(' from ') else tail}"


def episode_directions(e: EpisodeActions) -> dict[str, str]:
    """The goal's direction clauses on objects the episode acted on, abstracted, with their object: ``fry the red
    apple`` -> ``{"fry the <item>": "red apple"}``."""
    objects, out = {_parts(a)[1] for a in e.actions}, {}
    for clause in _CLAUSE_SPLIT.split(e.goal):
        words = clause.split()
        if len(words) >= 3 and words[1] == "the" and " ".join(words[2:]) in objects:
            out[f"{words[0]} the <item>"] = " ".join(words[2:])
    return out


def direction_rules(
    wins: list[EpisodeActions], literal: set[str], min_support: int = MIN_SUPPORT
) -> dict[str, str]:
    """Per goal direction (``fry the <item>``), the abstract action that goes with it: among the successful
    episodes (one per task, :func:`one_per_task`, so ``min_support`` counts tasks), the action on the direction's
    object whose share in those whose goal has the direction most exceeds its share in those whose goal does not,
    kept only when at least ``min_support`` tasks have the direction and the two shares' Wilson 95% intervals do
    not overlap. An action goes to the one direction it separates best (largest gap between the intervals); a
    direction in every episode has nothing to contrast with, and gets no rule."""
    wins = one_per_task(wins)
    with_d: Counter = Counter()
    on_object: dict[str, Counter] = defaultdict(Counter)  # episodes with d doing a on d's object
    in_episode: dict[str, Counter] = defaultdict(Counter)  # episodes with d doing a at all
    acts_all: Counter = Counter()  # episodes doing a
    for e in wins:
        acts = {abstract(a, literal, e.goal) for a in e.actions}
        acts_all.update(acts)
        for d, obj in episode_directions(e).items():
            with_d[d] += 1
            in_episode[d].update(acts)
            on_object[d].update({abstract(a, literal, e.goal) for a in e.actions if _parts(a)[1] == obj})
    best: dict[str, tuple[float, str]] = {}  # direction -> (margin, its action)
    for d, n_d in sorted(with_d.items()):
        n_rest = len(wins) - n_d
        if not n_rest or n_d < min_support:
            continue

        def rest(a: str, d: str = d) -> int:
            return acts_all[a] - in_episode[d][a]

        action = max(sorted(on_object[d]), key=lambda a: on_object[d][a] / n_d - rest(a) / n_rest)
        margin = wilson_interval(on_object[d][action], n_d)[0] - wilson_interval(rest(action), n_rest)[1]
        if margin > 0:
            best[d] = (margin, action)
    # two directions that always come together tie, and neither gets the action
    rules: dict[str, str] = {}
    for action in sorted({a for _, a in best.values()}):
        margins = sorted(((m, d) for d, (m, a) in best.items() if a == action), reverse=True)
        if len(margins) == 1 or margins[0][0] - margins[1][0] > 1e-9:
            rules[margins[0][1]] = action
    return dict(sorted(rules.items()))


def one_per_task(episodes: list[EpisodeActions]) -> list[EpisodeActions]:
    """The shortest episode of each task (the cleanest demonstration): a group's samples of one task share its
    recipe, so they are one piece of evidence about it, not several."""
    best: dict[str, EpisodeActions] = {}
    for e in sorted(episodes, key=lambda e: (len(e.actions), e.actions)):
        best.setdefault(e.task_id, e)
    return [best[t] for t in sorted(best)]


def rule_evidence(direction: str, action: str, episodes: list[EpisodeActions], literal: set[str]) -> dict:
    """How the episodes whose goal has ``direction`` fared when they did ``action`` on its object: ``tried``
    (how many did), ``support`` (of those, successes), ``success_rate`` and its Wilson 95% ``interval`` (None
    when none tried)."""
    tried = [
        e
        for e in episodes
        if (obj := episode_directions(e).get(direction)) is not None
        and any(_parts(a)[1] == obj and abstract(a, literal, e.goal) == action for a in e.actions)
    ]
    return _rate(tried)


def _rate(tried: list[EpisodeActions]) -> dict:
    """Successes among these episodes (``support``), the distinct tasks they solved (``tasks``, what
    ``min_support`` counts), their number, success rate and its Wilson 95% interval."""
    support = sum(e.success for e in tried)
    interval = [round(x, 4) for x in wilson_interval(support, len(tried))] if tried else None
    return {
        "support": support,
        "tasks": len({e.task_id for e in tried if e.success}),
        "tried": len(tried),
        "success_rate": round(support / len(tried), 4) if tried else 0.0,
        "interval": interval,
    }


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


def variants(a: str, b: str) -> bool:
    """Two steps on the goal's object that differ in the verb alone or the tool alone (``cook <item> with oven`` /
    ``cook <item> with stove``, ``chop <item> with knife`` / ``dice <item> with knife``): which one is right
    depends on the goal's wording."""
    (va, oa, ta), (vb, ob, tb) = _parts(a), _parts(b)
    return oa == ob == "<item>" and (va == vb) != (ta == tb)


def unconditional(
    steps: list[str], wins: list[EpisodeActions], literal: set[str], bound: frozenset[str] = frozenset()
) -> list[str]:
    """``steps`` less those that hold for some goals only (direction rules or nothing): a step with a
    :func:`variants` in some success, and a step on the goal's object whose successes all share a goal direction."""
    patterns = [(pattern(e, literal, bound), e) for e in wins]
    seen = {s for p, _ in patterns for s in p}

    def goal_bound(step: str) -> bool:
        goals = [set(episode_directions(e)) for p, e in patterns if step in p]
        return "<item>" in step and bool(goals) and bool(set.intersection(*goals))

    return [s for s in steps if not goal_bound(s) and not any(variants(s, o) for o in seen)]


def _separating_steps(wins: list[list[str]], losses: list[list[str]], min_win_share: float) -> list[str]:
    """Steps in >= min_win_share of successes and more common in successes than failures (the directions step:
    in successes only), in their usual order."""
    win_count = Counter(s for p in wins for s in set(p))
    loss_count = Counter(s for p in losses for s in set(p))
    kept = []
    for step, n in win_count.items():
        win_share = n / len(wins)
        loss_share = loss_count[step] / len(losses) if losses else 0.0
        # failures do direction actions too, often the wrong one for their goal: the directions step is kept on
        # the successes' share alone (its rules carry the contrast)
        if win_share >= min_win_share and (win_share > loss_share or step == DIRECTIONS_STEP):
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
    """Support (successful followers, and the ``tasks`` they solved), followers, success rate with its interval,
    and lift of a skill with these steps on these episodes (the directions step is not counted: it stands for
    actions that differ between tasks)."""
    wanted = {abstract(normalize_step(s), literal) for s in steps} - {DIRECTIONS_STEP}
    fol: list[EpisodeActions] = []
    rest: list[EpisodeActions] = []
    for e in episodes:
        follows = bool(wanted) and len(wanted & set(pattern(e, literal))) >= follow_share * len(wanted)
        (fol if follows else rest).append(e)
    rate = _rate(fol)
    lift = None
    if any(not e.success for e in episodes) and fol:
        rest_rate = sum(e.success for e in rest) / len(rest) if rest else 0.0
        lift = round(rate["success_rate"] - rest_rate, 4)
    followers = {k: v for k, v in rate.items() if k != "tried"}
    return {**followers, "followed": len(fol), "episodes": len(episodes), "lift": lift}


def _skill(
    name: str,
    title: str,
    task_types: list[str],
    eps: list[EpisodeActions],
    literal: set[str],
    settings: dict,
    origin: Mapping,
) -> Skill | None:
    """The skill these episodes support, or None (too few successes, no separating step, no lift)."""
    won, need = [e for e in eps if e.success], settings["min_support"]
    rules = direction_rules(won, literal, need)
    bound = frozenset(rules.values())
    wins = [pattern(e, literal, bound) for e in won]
    losses = [pattern(e, literal, bound) for e in eps if not e.success]
    if (solved := len({e.task_id for e in won})) < need:
        log.info("skills: %s has %d solved tasks < min_support %d; skipped", name, solved, need)
        return None
    # the general skill (no task types): steps in 80% of all successes, with no failures to separate from
    share = settings["min_win_share"] if task_types else 0.8
    steps = unconditional(_separating_steps(wins, losses if task_types else [], share), won, literal, bound)
    if not steps:
        return None
    ev = {**evidence(steps, eps, literal, settings["follow_share"]), **origin}
    lift, bar = ev["lift"], settings["min_lift"]
    if task_types and lift is not None and lift <= bar:
        log.info("skills: %s does not separate successes (lift %s <= %s); skipped", name, lift, bar)
        return None
    if DIRECTIONS_STEP in steps:
        # each rule's provenance: its action, its evidence on these episodes and ``origin`` (source, round)
        ev["rules"] = {
            d: {"action": a, **rule_evidence(d, a, eps, literal), **origin} for d, a in rules.items()
        }
    return Skill(name, render(title, steps, rules), task_types, evidence=ev)


def extract_skills(
    episodes: list[EpisodeActions],
    min_support: int = MIN_SUPPORT,
    min_win_share: float = 0.5,
    min_lift: float = 0.0,
    follow_share: float = 0.5,
    origin: Mapping | None = None,
) -> SkillLibrary:
    """One skill per task type with at least ``min_support`` successful episodes, plus ``general_skills`` (steps in
    80% of all successes); ``origin`` (``source``: rule or seed, ``round``) is stamped on each skill and rule.

    No ``task_keywords``: a task type's name is the only word known for it, and the reference's substring rule reads
    those wrongly (``cook`` is in ``cookbook``), so keyword retrieval maps the row's task type to its skill instead.
    """
    origin = origin or {"source": "rule"}
    literal = literal_actions(episodes)
    settings = dict(
        min_support=min_support, min_win_share=min_win_share, min_lift=min_lift, follow_share=follow_share
    )
    by_type: dict[str, list[EpisodeActions]] = defaultdict(list)
    for e in episodes:
        by_type[e.task_type].append(e)
    lib = SkillLibrary()
    for task_type, eps in sorted(by_type.items()):
        name = skill_name(task_type)
        skill = _skill(name, f"Skill for {task_type} tasks", [task_type], eps, literal, settings, origin)
        if skill is not None:
            lib.skills[name] = skill
    general = _skill(GENERAL, "General skills", [], episodes, literal, settings, origin)
    if general is not None:
        lib.skills[GENERAL] = general
    return lib
