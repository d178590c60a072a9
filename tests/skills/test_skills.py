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
    merge,
    reevaluate,
)
from sdarflow.skills.library import GENERAL, Skill, SkillLibrary
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
    assert {"take knife", "slice <item> with knife", "eat meal"} <= set(skill.steps)
    # "take <item>" is in every failure as often as in successes: it does not separate them
    assert "take <item>" not in skill.steps
    # every success followed the skill, no failure did: success rate 1, lift 1 - 0
    assert skill.evidence == {
        "support": 3,
        "followed": 3,
        "episodes": 5,
        "success_rate": 1.0,
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
    assert got == {"support": 2, "followed": 3, "episodes": 4, "success_rate": 0.6667, "lift": 0.6667}
    assert evidence(steps, eps, {"take knife"}, follow_share=1.0)["followed"] == 2
    # no failures: nothing to compare against
    assert evidence(steps, [eps[0]], set())["lift"] is None


def test_min_support_skips_rare_task_types():
    lib = extract_skills(
        episodes() + [ep("t9", ["take egg", "fry egg with stove", "eat meal"], True, "cook")]
    )
    assert lib.for_task_type("cook") is None and lib.for_task_type("cut") is not None


def test_library_round_trip_and_content_version(tmp_path):
    lib = extract_skills(episodes())
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
    lib = extract_skills(episodes())
    assert lib.task_keywords == {}  # extracted libraries retrieve by the row's task type
    hit = keyword(lib, "cut", "Goal: make the meal")
    assert hit.hit and hit.matched and hit.ids == [GENERAL, "skill_cut"]
    miss = keyword(lib, "cook", "Goal: cut the apple")
    assert not miss.hit and miss.ids == [GENERAL]
    assert full(lib, "cook", "").ids == [GENERAL, "skill_cut"]


def test_merge_prefers_better_supported_skills():
    old = extract_skills(episodes())
    weak = extract_skills(episodes()[:2] + episodes()[3:], min_support=2)
    merged = merge(old, weak)
    assert merged.for_task_type("cut").evidence["support"] == 3


def test_merge_dedupes_a_new_skill_into_an_existing_one():
    steps = "1. take knife\n2. slice <item> with knife\n3. prepare meal\n"
    old = SkillLibrary({"skill_cut": Skill("skill_cut", "# cut\n" + steps, ["cut"], ["cut"], {"support": 3})})
    twin = Skill("skill_slice", "# slice\n" + steps, ["slice"], ["slice"], {"support": 1})
    merged = merge(old, SkillLibrary({"skill_slice": twin}))
    assert set(merged.skills) == {"skill_cut"}
    assert merged.for_task_type("slice").name == "skill_cut"
    assert merged.for_task_type("cut").name == "skill_cut"


def test_reevaluate_measures_old_skills_on_this_rounds_episodes():
    lib = extract_skills(episodes())
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


def test_directions_are_learnt_from_what_successes_did_for_them():
    eps = [
        _cook("a", "carrot", "fry", "stove"),
        _cook("b", "red apple", "fry", "stove"),
        _cook("c", "egg", "roast", "oven"),
        _cook("d", "yellow potato", "roast", "oven"),
    ]
    lib = extract_skills(eps, min_support=2)
    skill = lib.for_task_type("cook")
    # the cook action differs by direction: one directions step, and each direction's action spelled out
    assert skill.steps == ["take <item> from <place>", DIRECTIONS_STEP, "prepare meal", "eat meal"]
    assert "fry the <item>: cook <item> with stove\nroast the <item>: cook <item> with oven" in skill.text
    # "take <item> from <place>" goes with every direction, so it is a step, not a direction's action
    assert "the <item>: take" not in skill.text
    # a direction in every episode has nothing to contrast with
    assert direction_rules(eps[:2], set()) == {}


def test_a_direction_without_a_consistent_action_gets_no_rule():
    eps = [
        _cook("a", "carrot", "fry", "stove"),
        _cook("b", "egg", "fry", "oven"),
        _cook("c", "egg", "roast", "oven"),
    ]
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
