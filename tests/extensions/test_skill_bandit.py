"""The ``ucb`` retrieval strategy explores untried skills, then exploits the best; its statistics' reward is the
outcome-signed teacher-student gap, and a skill whose text changed starts afresh."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sdarflow.extensions.skill_bandit import arm, carry_over, update
from sdarflow.skills.library import SkillLibrary
from sdarflow.skills.retrieve import get_strategy

REFERENCE = Path(__file__).parents[1] / "skills" / "data" / "reference_library"


@pytest.fixture
def ref() -> SkillLibrary:
    return SkillLibrary.load(REFERENCE)


def test_ucb_tries_every_skill_then_exploits_the_best(ref):
    ucb = get_strategy("ucb", ucb_c=0.1)
    first = [ucb(ref, "cut", "").ids[1] for _ in range(2)]
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
    picks = [ucb(ref, "cut", "").ids[1] for _ in range(10)]
    assert picks.count("cutting") == 10
    # a task type with no statistics explores
    got = get_strategy("ucb")(ref, "cook", "")
    assert got.ids == ["general", "cooking"] and got.matched


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
    stats = update(ref, rows)
    assert stats["arms"] == {"cut": {"cutting": {"pulls": 2, "reward_sum": 0.5}}}  # +1.0 and -0.5
    assert "general" not in json.dumps(stats["arms"])
    assert arm(stats, "cut", "cutting") == (2, 0.25)
    ref.stats = stats
    # a skill whose text changed loses its statistics; unchanged ones keep them
    ref.skills["cutting"].text += "\n4. Eat the meal.\n"
    assert carry_over(stats, ref)["arms"] == {}
