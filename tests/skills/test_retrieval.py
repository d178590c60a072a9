"""A hand-written library in the reference layout loads and is retrieved from; the four strategies; the bandit."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sdarflow.errors import ConfigError
from sdarflow.skills import bandit
from sdarflow.skills.library import SkillLibrary
from sdarflow.skills.retrieve import STRATEGIES, get_strategy, keyword, register

REFERENCE = Path(__file__).parent / "data" / "reference_library"


@pytest.fixture
def ref() -> SkillLibrary:
    return SkillLibrary.load(REFERENCE)


def test_reference_layout_loads_without_our_keys(ref):
    assert "evidence" not in json.loads((REFERENCE / "skill_mapping.json").read_text())
    assert ref.general is not None and ref.general.name == "general"  # found by its file, not its key
    assert [s.name for s in ref.task_specific()] == ["cooking", "cutting"]
    assert ref.for_task_type("cut+cook").name == "cooking"
    assert ref.keywords_for("cut") == ["slice", "chop", "dice"]
    assert ref.for_task_type("cut").steps[0] == "take the knife"
    assert ref.skills["cooking"].evidence == {}


def test_reference_layout_round_trips_with_the_same_version(ref, tmp_path):
    ref.save(tmp_path / "copy")
    back = SkillLibrary.load(tmp_path / "copy")
    assert back.version == ref.version
    mapping = json.loads((tmp_path / "copy" / "skill_mapping.json").read_text())
    assert mapping["skill_files"]["general"] == "general_skills.md"
    assert mapping["task_keywords"]["cut+cook"] == ["slice", "fry"]


def test_a_library_without_skill_files_uses_its_markdown(tmp_path):
    lib_dir = tmp_path / "lib"
    shutil.copytree(REFERENCE, lib_dir)
    mapping = json.loads((lib_dir / "skill_mapping.json").read_text())
    del mapping["skill_files"]
    (lib_dir / "skill_mapping.json").write_text(json.dumps(mapping))
    lib = SkillLibrary.load(lib_dir)
    assert set(lib.skills) == {"general_skills", "cooking", "cutting"}
    assert lib.general.name == "general_skills"


def test_keyword_retrieval_on_the_reference_library(ref):
    got = keyword(ref, "cut", "Goal: make a meal")
    assert got.ids == ["cutting", "general"] and got.hit and got.matched
    # an unmapped task type: the task type whose keywords the goal text matches
    got = keyword(ref, "unknown", "Goal: fry the egg and eat it")
    assert got.ids == ["cooking", "general"] and got.hit
    got = keyword(ref, "unknown", "Goal: eat the apple")
    assert got.ids == ["general"] and not got.hit
    # whole words only: "fryer" is not "fry"
    assert not keyword(ref, "unknown", "Goal: use the fryer").hit


def test_random_retrieval_is_seeded(ref):
    strategies = [get_strategy("random", seed=s) for s in (1, 1, 2)]
    draws = [[pick(ref, "cut", "").ids[0] for _ in range(20)] for pick in strategies]
    assert draws[0] == draws[1] and draws[0] != draws[2]
    assert set(draws[0]) == {"cooking", "cutting"}


def test_full_retrieval_is_the_whole_library(ref):
    got = get_strategy("full")(ref, "plain", "")
    assert got.ids == ["cooking", "cutting", "general"] and got.hit and not got.matched


def test_ucb_tries_every_skill_then_exploits_the_best(ref):
    ucb = get_strategy("ucb", ucb_c=0.1)
    first = [ucb(ref, "cut", "").ids[0] for _ in range(2)]
    assert first == ["cutting", "cooking"]  # untried first, the task type's own skill before others
    ref.stats = {
        "arms": {
            "cut": {
                "cutting": {"pulls": 10, "reward_sum": 2.0},
                "cooking": {"pulls": 10, "reward_sum": -1.0},
            }
        }
    }
    ucb = get_strategy("ucb", ucb_c=0.1)
    picks = [ucb(ref, "cut", "").ids[0] for _ in range(10)]
    assert picks.count("cutting") == 10
    # a task type with no statistics explores
    assert {get_strategy("ucb")(ref, "cook", "").ids[0]} == {"cooking"}


def test_bandit_reward_is_the_outcome_signed_gap(ref):
    rows = [
        {
            "task_type": "cut",
            "success": True,
            "skill_ids": ["cutting", "general"],
            "old_logprobs": [-2.0, -3.0],
            "teacher_logprobs": [-1.0, -2.0],
        },
        {
            "task_type": "cut",
            "success": False,
            "skill_ids": ["cutting", "general"],
            "old_logprobs": [-1.0],
            "teacher_logprobs": [-0.5],
        },
        {
            "task_type": "cut",
            "success": True,
            "skill_ids": ["cutting"],
            "old_logprobs": [],
            "teacher_logprobs": [],
        },
    ]
    stats = bandit.update(ref, rows)
    assert stats["arms"] == {"cut": {"cutting": {"pulls": 2, "reward_sum": 0.5}}}  # +1.0 and -0.5
    assert "general" not in json.dumps(stats["arms"])
    assert bandit.arm(stats, "cut", "cutting") == (2, 0.25)
    ref.stats = stats
    # a skill whose text changed loses its statistics; unchanged ones keep them
    ref.skills["cutting"].text += "\n4. Eat the meal.\n"
    assert bandit.carry_over(stats, ref)["arms"] == {}


def test_unknown_strategy_lists_the_valid_names():
    with pytest.raises(ConfigError, match="available: keyword, ucb, random, full"):
        get_strategy("bm25")
    with pytest.raises(ValueError, match="registered twice"):
        register("keyword")(lambda **_: None)
    assert tuple(STRATEGIES) == ("keyword", "ucb", "random", "full")
