"""Skill accuracy against the env's ground truth (TextWorld cooking), on skills written by hand as the extractor
renders them, including the wrong libraries the demo once made; and the extract-skills stage reporting it."""

from __future__ import annotations

import json

import pytest

from sdarflow.envs import get_suite
from sdarflow.skills.accuracy import score_library
from sdarflow.skills.extract import DIRECTIONS_STEP, render
from sdarflow.skills.library import Skill, SkillLibrary


@pytest.fixture(scope="module")
def truth():
    return get_suite("textworld-cooking").skill_truth()


def _skill(task_type: str, steps: list[str], rules: dict[str, str] | None = None) -> Skill:
    name = "skill_" + task_type.replace("+", "_")
    return Skill(name, render(name, steps, rules), [task_type] if task_type else [], [])


def _score(truth, *skills: Skill) -> dict:
    return score_library(SkillLibrary({s.name: s for s in skills}), truth)


def test_the_seed_librarys_rules_are_right(truth):
    cut = _skill("cut", ["take <item> from <place>", DIRECTIONS_STEP], {
        "chop the <item>": "chop <item> with knife", "dice the <item>": "dice <item> with knife"})  # fmt: skip
    cook = _skill("cook", [DIRECTIONS_STEP, "prepare meal"], {
        "fry the <item>": "cook <item> with stove", "roast the <item>": "cook <item> with oven"})  # fmt: skip
    scored = _score(truth, cut, cook)
    assert (scored["right"], scored["wrong"], scored["recipe_blind"]) == (4, 0, 0)


def test_the_demos_wrong_skills_are_named(truth):
    # round 0: an unconditional cut verb, and a tool and a verb for cut+cook: right for some recipes only
    cut = _skill("cut", ["take <item> from <place>", "dice <item> with knife", "prepare meal"])
    cut_cook = _skill("cut+cook", ["cook <item> with oven", "chop <item> with knife", "eat meal"])
    assert _score(truth, cut)["skills"]["skill_cut"]["recipe_blind"] == ["dice <item> with knife"]
    assert _score(truth, cut_cook)["recipe_blind"] == 2
    # round 1: directions bound to the wrong action
    cut_cook = _skill("cut+cook", [DIRECTIONS_STEP], {
        "roast the <item>": "chop <item> with knife", "slice the <item>": "cook <item> with stove"})  # fmt: skip
    cook = _skill("cook", [DIRECTIONS_STEP], {"chop the <item>": "cook <item> with oven"})
    scored = _score(truth, cut_cook, cook)
    assert (scored["right"], scored["wrong"], scored["recipe_blind"]) == (0, 3, 0)
    assert scored["skills"]["skill_cook"]["wrong"] == ["chop the <item>: cook <item> with oven"]


def test_an_action_where_the_type_needs_none_is_wrong_and_mixed_types_are_blind(truth):
    # plain games list "roast the <item>" but the food comes roasted: cooking it again is wrong
    plain = _skill("plain", ["cook <item> with oven"], None)
    assert _score(truth, plain)["skills"]["skill_plain"]["wrong"] == ["cook <item> with oven"]
    # a general skill covers every type: a cooking rule is right for cook types and wrong for the others
    general = Skill("general_skills", render("general", [DIRECTIONS_STEP], {"fry the <item>": "cook <item> with stove"}), [], [])  # fmt: skip
    assert _score(truth, general)["skills"]["general_skills"]["recipe_blind"] == [
        "fry the <item>: cook <item> with stove"
    ]


def test_extract_skills_reports_the_librarys_accuracy(episodes_dataset, tmp_path, capsys):
    from sdarflow import storage
    from sdarflow.cli import main

    out = str(tmp_path / "lib")
    assert main(["extract-skills", "--input", episodes_dataset, "--output", out, "--min-support", "1"]) == 0
    result = json.loads(capsys.readouterr().out)
    manifest = storage.read_manifest(out, "skills")
    assert set(result["metrics"]) == {
        "skills/rules_right",
        "skills/rules_wrong",
        "skills/rules_recipe_blind",
        "skills/replacements_made",
        "skills/replacements_refused",
    }
    assert manifest["metrics"] == result["metrics"] and set(manifest["accuracy"]["skills"]) >= {"skill_cut"}
    assert "Accuracy against the env" in (tmp_path / "lib" / "report.md").read_text()


def test_tool_calls_are_scored_against_the_gold_plans():
    truth = get_suite("tool-use").skill_truth()
    listing = '{"tool": "list_files", "args": {"folder": "tmp"}}'
    reading = '{"tool": "read_file", "args": {"path": "<item>"}}'
    cleanup = Skill("skill_cleanup", render("cleanup", [listing, reading, "look around"]), ["cleanup"], [])
    scored = _score(truth, cleanup)["skills"]["skill_cleanup"]
    # cleanup lists tmp in every task and never reads a file; "look around" calls no tool and is not scored
    assert scored == {"right": [listing], "wrong": [reading], "recipe_blind": []}
    # a general skill covers every type: listing files is right for some (cleanup) and not others (schedule)
    general = Skill("general_skills", render("general", [listing, '{"tool": "finish", "args": {}}']), [], [])
    scored = _score(truth, general)["skills"]["general_skills"]
    assert scored["recipe_blind"] == [listing] and scored["right"] == ['{"tool": "finish", "args": {}}']


def test_search_qa_steps_are_scored_as_calls():
    truth = get_suite("search-qa").skill_truth()
    skill = Skill(
        "skill_employer", render("employer", ["search[<item>]", "answer[<item>]", "think"]), ["employer"], []
    )
    assert _score(truth, skill)["skills"]["skill_employer"] == {
        "right": ["search[<item>]", "answer[<item>]"],
        "wrong": [],
        "recipe_blind": [],
    }
