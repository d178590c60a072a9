"""bench/premise.py's arithmetic: the gap is averaged per task first, then over tasks, successes and failures
apart; the random control keeps each skill's place and token count (as sampled)."""

from __future__ import annotations

import pytest

from bench.premise import random_control, summarize


def test_gaps_average_per_task_then_over_tasks():
    rows = [
        {"task_id": "a", "success": True},
        {"task_id": "a", "success": True},
        {"task_id": "b", "success": True},
        {"task_id": "b", "success": False},
    ]
    gaps = [[1.0, 3.0], [5.0], [-1.0], [0.5, 0.5]]
    out = summarize(rows, gaps)
    # task a: (1 + 3 + 5) / 3 = 3; task b: -1; over tasks: (3 - 1) / 2 = 1; t interval 1 +- 12.706 * 2.828 / 1.414
    assert out["success"]["gap"] == pytest.approx(1.0) and out["success"]["tasks"] == 2
    assert out["success"]["turns"] == 3
    assert out["success"]["ci95"] == pytest.approx([1 - 12.7062 * 2, 1 + 12.7062 * 2], rel=1e-4)
    assert out["failure"] == {"gap": 0.5, "ci95": [0.5, 0.5], "tasks": 1, "turns": 1}
    assert summarize(rows[:1], gaps[:1])["failure"] == {"gap": None, "ci95": None, "tasks": 0, "turns": 0}


def test_the_random_control_keeps_each_skills_place_and_length(tiny_model):
    from transformers import AutoTokenizer

    from sdarflow.skills.library import SkillLibrary

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    lib = SkillLibrary.load(tiny_model / "seed_skills")
    control = random_control(lib, tokenizer, seed=0)
    assert list(control.skills) == list(lib.skills) and control.version != lib.version
    for name, skill in lib.skills.items():
        mine = control.skills[name]
        assert mine.task_types == skill.task_types and mine.text != skill.text
        n = len(tokenizer(skill.text, add_special_tokens=False)["input_ids"])
        # n random tokens, decoded; re-encoded, random byte pieces split into somewhat more tokens
        assert n <= len(tokenizer(mine.text, add_special_tokens=False)["input_ids"]) <= 2 * n
    assert random_control(lib, tokenizer, seed=0).version == control.version  # seeded
