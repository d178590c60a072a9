"""Skill extraction (hindsight, rule-based), the library format, and keyword retrieval."""

from __future__ import annotations

from sdarflow.skills.extract import EpisodeActions, abstract, extract_skills, merge
from sdarflow.skills.library import GENERAL, SkillLibrary
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
    text = skill.text
    assert "take knife" in text and "slice <item> with knife" in text and "eat meal" in text
    # "take <item>" is in every failure as often as in successes: it does not separate them
    assert "take <item>" not in text.split("Evidence")[0]
    assert skill.evidence == {"support": 3, "episodes": 5, "success_rate": 0.6}
    assert lib.general is not None and "prepare meal" in lib.general.text


def test_min_support_skips_rare_task_types():
    lib = extract_skills(
        episodes() + [ep("t9", ["take egg", "fry egg with stove", "eat meal"], True, "cook")]
    )
    assert lib.for_task_type("cook") is None and lib.for_task_type("cut") is not None


def test_library_round_trip_and_content_version(tmp_path):
    lib = extract_skills(episodes())
    lib.save(tmp_path / "lib")
    back = SkillLibrary.load(tmp_path / "lib")
    assert back.version == lib.version and set(back.skills) == set(lib.skills)
    assert back.for_task_type("cut").evidence["support"] == 3
    assert (tmp_path / "lib" / "general_skills.md").is_file() and (
        tmp_path / "lib" / "skill_mapping.json"
    ).is_file()


def test_keyword_retrieval_hit_and_miss():
    lib = extract_skills(episodes())
    hit = keyword(lib, "cut", "Goal: slice the apple")
    assert hit.hit and hit.ids == ["skill_cut", GENERAL]
    miss = keyword(lib, "cook", "Goal: fry the egg")
    assert not miss.hit and miss.ids == [GENERAL]
    assert full(lib, "cook", "").ids == ["skill_cut", GENERAL]


def test_merge_prefers_better_supported_skills():
    old = extract_skills(episodes())
    weak = extract_skills(episodes()[:2] + episodes()[3:], min_support=2)
    merged = merge(old, weak)
    assert merged.for_task_type("cut").evidence["support"] == 3
