"""Skill extraction (hindsight, rule-based), evidence, merging with dedupe, the library format, and keyword
retrieval."""

from __future__ import annotations

from sdarflow.rollout.prompt import build_messages, dumps, goal_of
from sdarflow.skills.extract import (
    DIRECTIONS_STEP,
    EpisodeActions,
    abstract,
    direction_rules,
    episodes_from_rows,
    evidence,
    extract_skills,
)
from sdarflow.skills.library import GENERAL, Skill, SkillLibrary
from sdarflow.skills.merge import merge, reevaluate
from sdarflow.skills.retrieve import full, keyword


def ep(task: str, acts: list[str], win: bool, task_type: str = "cut") -> EpisodeActions:
    return EpisodeActions(task, task_type, tuple(acts), win)


def episodes() -> list[EpisodeActions]:
    wins = [
        ep(
            "t1",
            ["take red apple", "take knife", "slice red apple with knife", "prepare meal", "eat meal"],
            True,
        ),
        ep("t2", ["take carrot", "take knife", "slice carrot with knife", "prepare meal", "eat meal"], True),
        ep("t3", ["take knife", "take tuna", "dice tuna with knife", "prepare meal", "eat meal"], True),
    ]
    losses = [
        ep("t1", ["take red apple", "eat red apple"], False),
        ep("t2", ["take carrot", "prepare meal", "look"], False),
    ]
    return wins + losses


def test_abstraction_keeps_tools_and_recurring_actions():
    literal = {"take knife", "prepare meal"}
    assert abstract("slice yellow potato with knife", literal) == "slice <item> with knife"
    assert abstract("take knife", literal) == "take knife"
    assert abstract("take red apple", literal) == "take <item>"
    assert abstract("look", literal) == "look"


def test_extraction_keeps_steps_that_separate_success_from_failure():
    lib = extract_skills(episodes(), min_support=2)
    skill = lib.for_task_type("cut")
    assert {"take knife", "eat meal"} <= set(skill.steps)
    # "take <item>" is in every failure as often as in successes: it does not separate them
    assert "take <item>" not in skill.steps
    # two successes sliced and one diced: the cut verb depends on the task, so neither is a step for all
    assert not {"slice <item> with knife", "dice <item> with knife"} & set(skill.steps)
    # every success followed the skill, no failure did: success rate 1 (Wilson 3 of 3: 0.4385..1), lift 1 - 0
    assert skill.evidence == {
        "support": 3,
        "tasks": 3,
        "followed": 3,
        "episodes": 5,
        "success_rate": 1.0,
        "interval": [0.4385, 1.0],
        "lift": 1.0,
        "source": "rule",
    }
    assert lib.general is not None and "prepare meal" in lib.general.steps
    assert "Evidence" not in skill.text  # counts live in the mapping, not in the teacher's context


def test_a_pattern_that_does_not_separate_is_not_kept():
    same = ["take knife", "slice carrot with knife", "prepare meal", "eat meal"]
    eps = [ep(f"t{i}", same, i % 2 == 0) for i in range(6)]  # identical actions, half succeed
    lib = extract_skills(eps, min_support=2)
    assert lib.for_task_type("cut") is None


def test_evidence_counts_followers_and_lift():
    steps = ["take knife", "slice <item> with knife"]
    eps = [
        ep("a", ["take knife", "slice carrot with knife"], True),
        ep("b", ["take knife", "slice apple with knife"], False),
        ep("c", ["look"], False),
        ep("d", ["look", "take knife"], True),  # half the steps: follows at follow_share 0.5
    ]
    got = evidence(steps, eps, {"take knife"}, follow_share=0.5)
    # Wilson 2 of 3 at z 1.96: (0.2077, 0.9385)
    assert got == {
        "support": 2,
        "tasks": 2,
        "followed": 3,
        "episodes": 4,
        "success_rate": 0.6667,
        "interval": [0.2077, 0.9385],
        "lift": 0.6667,
    }
    assert evidence(steps, eps, {"take knife"}, follow_share=1.0)["followed"] == 2
    # no failures: nothing to compare against
    assert evidence(steps, [eps[0]], set())["lift"] is None


def test_min_support_skips_rare_task_types():
    lib = extract_skills(
        episodes() + [ep("t9", ["take egg", "fry egg with stove", "eat meal"], True, "cook")], min_support=2
    )
    assert lib.for_task_type("cook") is None and lib.for_task_type("cut") is not None
    # support counts solved tasks: one task solved three times is one piece of evidence
    same = [ep("t1", ["take knife", "prepare meal", "eat meal"], True) for _ in range(3)]
    assert extract_skills(same, min_support=2).for_task_type("cut") is None


def test_library_round_trip_and_content_version(tmp_path):
    lib = extract_skills(episodes(), min_support=2)
    lib.stats = {"arms": {"cut": {"skill_cut": {"pulls": 2, "reward_sum": 0.5}}}}
    lib.save(tmp_path / "lib")
    back = SkillLibrary.load(tmp_path / "lib")
    assert back.version == lib.version and set(back.skills) == set(lib.skills)
    assert back.for_task_type("cut").evidence["support"] == 3
    assert back.stats == lib.stats
    assert (tmp_path / "lib" / "general_skills.md").is_file()
    assert (tmp_path / "lib" / "skill_mapping.json").is_file()
    back.stats = {}
    assert back.version != lib.version  # the bandit state is part of the content


def test_keyword_retrieval_hit_and_miss():
    lib = extract_skills(episodes(), min_support=2)
    assert lib.task_keywords == {}  # extracted libraries retrieve by the row's task type
    hit = keyword(lib, "cut", "Goal: make the meal")
    assert hit.hit and hit.matched and hit.ids == [GENERAL, "skill_cut"]
    miss = keyword(lib, "cook", "Goal: cut the apple")
    assert not miss.hit and miss.ids == [GENERAL]
    assert full(lib, "cook", "").ids == [GENERAL, "skill_cut"]


def test_merge_keeps_the_previous_skill_against_weaker_evidence():
    old = extract_skills(episodes(), min_support=2)
    weak = extract_skills(episodes()[:2] + episodes()[3:], min_support=2)
    merged, decisions = merge(old, weak, min_support=2)
    assert merged.for_task_type("cut").evidence["support"] == 3
    assert ("skill_cut", "steps", False) in [(d["skill"], d["rule"], d["replaced"]) for d in decisions]


def test_merge_dedupes_a_new_skill_into_an_existing_one():
    steps = "1. take knife\n2. slice <item> with knife\n3. prepare meal\n"
    old = SkillLibrary({"skill_cut": Skill("skill_cut", "# cut\n" + steps, ["cut"], ["cut"], {"support": 3})})
    twin = Skill("skill_slice", "# slice\n" + steps, ["slice"], ["slice"], {"support": 1})
    merged, _ = merge(old, SkillLibrary({"skill_slice": twin}))
    assert set(merged.skills) == {"skill_cut"}
    assert merged.for_task_type("slice").name == "skill_cut"
    assert merged.for_task_type("cut").name == "skill_cut"


def test_reevaluate_measures_old_skills_on_this_rounds_episodes():
    lib = extract_skills(episodes(), min_support=2)
    round2 = [
        ep("t5", ["look"], False),
        ep("t6", ["take knife", "slice egg with knife", "prepare meal"], True),
    ]
    again = reevaluate(lib, round2)
    assert again.for_task_type("cut").evidence["episodes"] == 2
    assert again.for_task_type("cut").evidence["support"] == 1
    assert lib.for_task_type("cut").evidence["episodes"] == 5  # the input library is not modified


def _goal(item: str, *directions: str) -> str:
    steps = "; ".join([f"{d} the {item}" for d in directions] + ["prepare meal"])
    return f"Prepare the meal following the recipe, then eat it.\nIngredients: {item}\nDirections: {steps}"


def _cook(task: str, item: str, direction: str, tool: str) -> EpisodeActions:
    acts = [f"take {item} from fridge", f"cook {item} with {tool}", "prepare meal", "eat meal"]
    return EpisodeActions(task, "cook", tuple(acts), True, _goal(item, direction))


def test_with_a_goal_only_named_objects_and_places_are_abstracted():
    goal = _goal("carrot", "dice")
    literal = {"prepare meal"}
    assert abstract("take carrot from fridge", literal, goal) == "take <item> from <place>"
    assert abstract("take knife from table", literal, goal) == "take knife from <place>"
    assert abstract("dice carrot with knife", literal, goal) == "dice <item> with knife"
    assert abstract("prepare meal", literal, goal) == "prepare meal"  # literal, though the goal names "meal"
    assert abstract("take <item> from <place>", literal, goal) == "take <item> from <place>"  # idempotent


FOODS = ("carrot", "red apple", "egg", "yellow potato", "tuna", "red onion")


def test_directions_are_learnt_from_what_successes_did_for_them():
    fry = [_cook(f"f{i}", food, "fry", "stove") for i, food in enumerate(FOODS)]
    roast = [_cook(f"r{i}", food, "roast", "oven") for i, food in enumerate(FOODS)]
    eps = fry + roast
    lib = extract_skills(eps)
    skill = lib.for_task_type("cook")
    # the cook action differs by direction: one directions step, and each direction's action spelled out
    assert skill.steps == ["take <item> from <place>", DIRECTIONS_STEP, "prepare meal", "eat meal"]
    assert "fry the <item>: cook <item> with stove\nroast the <item>: cook <item> with oven" in skill.text
    # "take <item> from <place>" goes with every direction, so it is a step, not a direction's action
    assert "the <item>: take" not in skill.text
    # each rule with its evidence: tried on 6 tasks, all solved
    assert lib.for_task_type("cook").evidence["rules"]["fry the <item>"]["tasks"] == 6
    # a direction in every episode has nothing to contrast with
    assert direction_rules(fry, set()) == {}
    # three tasks of each are not enough to tell an action from chance (Wilson 3 of 3 vs 0 of 3 overlap)
    assert direction_rules(fry[:3] + roast[:3], set(), min_support=1) == {}
    # one task sampled six times is one task
    assert direction_rules([fry[0]] * 6 + roast, set(), min_support=2) == {}


def test_an_action_goes_to_the_direction_it_separates_best():
    # every roast recipe also says "dice the": the oven goes with both; the games that dice without roasting
    # (and fry) tell that it is roasting's
    def two(task, item, first, second, tool):
        e = _cook(task, item, first, tool)
        return EpisodeActions(task, "cook", e.actions, True, _goal(item, first, second))

    roast = [two(f"r{i}", food, "dice", "roast", "oven") for i, food in enumerate(FOODS)]
    dice_fry = [two(f"d{i}", food, "dice", "fry", "stove") for i, food in enumerate(FOODS)]
    fry = [_cook(f"f{i}", food, "fry", "stove") for i, food in enumerate(FOODS)]
    assert direction_rules(roast + dice_fry + fry, set()) == {
        "fry the <item>": "cook <item> with stove",
        "roast the <item>": "cook <item> with oven",
    }
    # when two directions always come together, neither gets the action
    assert "dice the <item>" not in direction_rules(roast + fry, set())
    assert "roast the <item>" not in direction_rules(roast + fry, set())


def test_a_step_the_goals_decide_is_never_a_step_for_every_task():
    # every success that diced had a "dice the" recipe: nothing says dicing is for every recipe
    def cut(task, item, verb):
        acts = [
            f"take {item} from fridge",
            "take knife from table",
            f"{verb} {item} with knife",
            "prepare meal",
        ]
        return EpisodeActions(task, "cut", tuple(acts), True, _goal(item, verb))

    lib = extract_skills([cut(f"t{i}", food, "dice") for i, food in enumerate(FOODS)])
    assert "dice <item> with knife" not in lib.for_task_type("cut").steps
    assert "take knife from <place>" in lib.for_task_type("cut").steps


def test_a_direction_without_a_consistent_action_gets_no_rule():
    eps = [_cook(f"f{i}", food, "fry", ("stove", "oven")[i % 2]) for i, food in enumerate(FOODS)]
    eps += [_cook(f"r{i}", food, "roast", "oven") for i, food in enumerate(FOODS)]
    # fry went with two different tools; the oven is also used without "roast": neither direction is specific
    assert direction_rules(eps, set()) == {}


def test_episodes_from_rows_read_the_goal_from_the_first_turn():
    goal = _goal("carrot", "dice")
    rows = [
        {"traj_id": "x", "turn": t, "task_id": "t", "task_type": "cut", "success": True, "format_ok": True,
         "response_text": a, "prompt_messages": dumps(build_messages(goal, [], "a kitchen"))}
        for t, a in enumerate(["take carrot from fridge", "dice carrot with knife"])
    ]  # fmt: skip
    (episode,) = episodes_from_rows(rows)
    assert episode.goal == goal and episode.actions == ("take carrot from fridge", "dice carrot with knife")
    assert goal_of([{"role": "user", "content": "no goal here"}]) == ""
