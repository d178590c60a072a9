"""A hand-written library in the reference layout loads and is retrieved from; the four strategies reproduce the
reference's choice, order and joining (ZJU-REAL/SDAR ``SkillProvider``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sdarflow.errors import ConfigError
from sdarflow.skills.library import SkillLibrary
from sdarflow.skills.retrieve import STRATEGIES, full, get_strategy, keyword

REFERENCE = Path(__file__).parent / "data" / "reference_library"
# A rendered student prompt as keyword retrieval reads it: the decoded ids, chat-template markers included.
PROMPT = "<|im_start|>user\nGoal: {goal}\nCommand?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture
def ref() -> SkillLibrary:
    return SkillLibrary.load(REFERENCE)


def write_library(folder: Path, mapping: dict, texts: dict[str, str]) -> SkillLibrary:
    folder.mkdir()
    for fname, text in texts.items():
        (folder / fname).write_text(text)
    (folder / "skill_mapping.json").write_text(json.dumps(mapping))
    return SkillLibrary.load(folder)


@pytest.fixture
def small(tmp_path) -> SkillLibrary:
    """Short texts (padded with whitespace the joining strips); skill_files and task_keywords orders differ from
    each other and from name order, so order-dependence shows."""
    mapping = {
        "skill_files": {"general": "general_skills.md", "cutting": "cutting.md", "cooking": "cooking.md"},
        "task_to_skill": {"cut": "cutting", "cook": "cooking"},
        "task_keywords": {"cook": ["fry", "Roast"], "cut": ["cut", "slice"]},
    }
    texts = {
        "general_skills.md": "\nBe careful.\n\n",
        "cutting.md": "Use the knife.\n",
        "cooking.md": "  Use the stove.",
    }
    return write_library(tmp_path / "small", mapping, texts)


def test_reference_layout_loads_without_our_keys(ref):
    assert "evidence" not in json.loads((REFERENCE / "skill_mapping.json").read_text())
    assert ref.general is not None and ref.general.name == "general"  # found by its file, not its key
    assert [s.name for s in ref.task_specific()] == ["cutting", "cooking"]  # skill_files order
    assert ref.for_task_type("cut+cook").name == "cooking"
    assert ref.task_keywords["cut"] == ["slice", "chop", "dice"]
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


def test_save_keeps_the_library_order(small, tmp_path):
    small.save(tmp_path / "copy")
    mapping = json.loads((tmp_path / "copy" / "skill_mapping.json").read_text())
    assert list(mapping["skill_files"]) == ["general", "cutting", "cooking"]
    assert list(mapping["task_keywords"]) == ["cook", "cut"]
    assert mapping["task_keywords"]["cook"] == ["fry", "Roast"]  # keywords are not lower-cased
    back = SkillLibrary.load(tmp_path / "copy")
    assert list(back.skills) == list(small.skills) and back.task_keywords == small.task_keywords
    assert back.version == small.version


def test_skills_join_general_first_with_a_blank_line(small):
    got = keyword(small, "cut", PROMPT.format(goal="slice the apple"))
    assert got.text == "Be careful.\n\nUse the knife."
    assert got.ids == ["general", "cutting"] and got.hit and got.matched


def test_keyword_appends_every_match_in_task_keywords_order(small):
    # "cut" is a plain substring of "cutlery"; "FRY" matches once the prompt is lower-cased
    got = keyword(small, "cut", PROMPT.format(goal="FRY the egg, then set the cutlery"))
    assert got.ids == [
        "general",
        "cooking",
        "cutting",
    ]  # task_keywords order (cook, cut), not skill_files order
    assert got.text == "Be careful.\n\nUse the stove.\n\nUse the knife."
    assert got.hit and got.matched
    # the keyword is matched as written: "Roast" never matches the lower-cased prompt
    got = keyword(small, "cook", PROMPT.format(goal="roast the potato"))
    assert got.ids == ["general"] and got.text == "Be careful." and not got.hit and not got.matched
    # the row's task type plays no part when the library has keywords
    got = keyword(small, "cut", PROMPT.format(goal="fry the egg"))
    assert got.ids == ["general", "cooking"] and got.hit and not got.matched


def test_keyword_matches_the_whole_prompt_and_repeats_a_skill_two_types_map_to(ref):
    # reference library: cut (slice), cook (fry) and cut+cook (slice, fry; mapped to cooking) all match
    got = keyword(ref, "cut", "Goal: slice the apple and fry the egg")
    assert got.ids == ["general", "cutting", "cooking", "cooking"]
    # the whole prompt is read, not only the goal line
    got = keyword(ref, "cook", "Goal: make a meal\nObservation: a grill stands here")
    assert got.ids == ["general", "cooking"]
    got = keyword(ref, "cut", "Goal: eat the apple")
    assert got.ids == ["general"] and not got.hit


def test_keyword_without_task_keywords_uses_the_task_type(tmp_path):
    mapping = {
        "skill_files": {"general_skills": "general_skills.md", "lookup": "lookup.md", "multi": "multi.md"},
        "task_to_skill": {"entity_attribute_lookup": "lookup", "multi_hop_reasoning": "multi"},
    }
    texts = {
        "general_skills.md": "Search first.\n",
        "lookup.md": "Find the entity.\n",
        "multi.md": "Chain hops.\n",
    }
    lib = write_library(tmp_path / "search", mapping, texts)
    got = keyword(lib, "multi_hop_reasoning", "Question: who directed the film? Find the entity.")
    assert got.text == "Search first.\n\nChain hops." and got.ids == ["general_skills", "multi"]
    assert got.hit and got.matched
    got = keyword(lib, "compare", "Question: which is older?")
    assert got.text == "Search first." and not got.hit
    # saving does not invent task_keywords (they would switch retrieval to the keyword path)
    lib.save(tmp_path / "copy")
    assert json.loads((tmp_path / "copy" / "skill_mapping.json").read_text())["task_keywords"] == {}
    assert keyword(SkillLibrary.load(tmp_path / "copy"), "multi_hop_reasoning", "").ids == [
        "general_skills",
        "multi",
    ]


def test_full_is_general_then_skill_files_order(small):
    got = full(small, "cook", "")
    assert got.ids == ["general", "cutting", "cooking"] and got.hit and got.matched
    assert got.text == "Be careful.\n\nUse the knife.\n\nUse the stove."


def test_a_library_without_general_starts_with_its_first_skill(tmp_path):
    mapping = {"skill_files": {"cutting": "cutting.md"}, "task_to_skill": {"cut": "cutting"}}
    lib = write_library(tmp_path / "nogeneral", mapping, {"cutting.md": "Use the knife.\n"})
    assert full(lib, "cut", "").text == "Use the knife."
    assert keyword(lib, "cook", "").text == "" and keyword(lib, "cook", "").ids == []


def test_random_retrieval_is_seeded(ref):
    strategies = [get_strategy("random", seed=s) for s in (1, 1, 2)]
    draws = [[pick(ref, "cut", "").ids[1] for _ in range(20)] for pick in strategies]
    assert draws[0] == draws[1] and draws[0] != draws[2]
    assert set(draws[0]) == {"cooking", "cutting"}


def test_full_retrieval_is_the_whole_library(ref):
    got = get_strategy("full")(ref, "plain", "")
    assert got.ids == ["general", "cutting", "cooking"] and got.hit and not got.matched


def test_unknown_strategy_lists_the_valid_names():
    with pytest.raises(
        ConfigError, match="retrieval strategy 'bm25'; fix: choose one of keyword, ucb, random, full"
    ):
        get_strategy("bm25")
    with pytest.raises(ValueError, match="already registered"):
        STRATEGIES.register("keyword")(lambda **_: None)
    assert tuple(STRATEGIES) == ("keyword", "ucb", "random", "full")
