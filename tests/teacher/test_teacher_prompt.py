"""The teacher's prompt as the SDAR reference builds it (``build_teacher_batch`` in ZJU-REAL/SDAR
``verl/trainer/ppo/rlsd_ray_trainer.py``): the student prompt ids decoded with special tokens, the skills header and
text in front, re-tokenized without added special tokens, the last N tokens kept. The message places truncate the
same way."""

from __future__ import annotations

import pytest

from sdarflow.rollout.prompt import encode_prompt, insert_skills, loads, teacher_prompt_ids
from sdarflow.skills.library import SkillLibrary
from sdarflow.skills.retrieve import keyword
from sdarflow.teacher.rescore import teacher_prompts

# keyword retrieval for "Goal: dice the carrot" (game-2): the general skill, a blank line, the cutting skill.
DICE_SKILLS = (
    "# General skills\n\n"
    "- Read the cookbook first: it lists every ingredient and how to prepare it.\n"
    "- Take each ingredient before preparing it.\n"
    "- When every ingredient is prepared, prepare the meal, then eat it.\n\n"
    "# Cutting ingredients\n\n"
    "Ingredients that must be sliced, chopped or diced need the knife.\n\n"
    "1. Take the knife.\n"
    "2. Slice, chop or dice the <item> with the knife, as the recipe says.\n"
    "3. Prepare the meal."
)


@pytest.fixture
def lib(reference_library) -> SkillLibrary:
    return SkillLibrary.load(reference_library)


def test_prefix_teacher_prompt_is_the_reference_text(tokenizer, student_rows, lib):
    i, row = next((i, r) for i, r in enumerate(student_rows) if r["task_id"] == "game-2")
    teach = teacher_prompts(student_rows, lib, keyword, tokenizer, "prefix", 2048)
    assert teach.skill_ids[i] == ["general", "cutting"]
    decoded = tokenizer.decode(row["prompt_token_ids"], skip_special_tokens=False)
    assert decoded.startswith("<|im_start|>system\n")  # special tokens kept, as the reference decodes
    expected = tokenizer.encode(
        "[Privileged Skill Information]\n" + DICE_SKILLS + "\n\n" + decoded, add_special_tokens=False
    )
    assert teach.prompts[i] == expected
    assert teach.prompts[i][-len(row["prompt_token_ids"]) :] == row["prompt_token_ids"]
    assert teach.unchanged == 0


def test_prefix_left_truncation_keeps_the_last_tokens(tokenizer, student_rows, lib):
    row = student_rows[0]
    student = row["prompt_token_ids"]
    whole = teacher_prompt_ids(tokenizer, student, [], DICE_SKILLS, "prefix")
    n = len(student) + 5
    assert len(whole) > n
    cut = teacher_prompt_ids(tokenizer, student, [], DICE_SKILLS, "prefix", max_tokens=n)
    assert cut == whole[-n:] and cut[-len(student) :] == student
    teach = teacher_prompts([row], lib, keyword, tokenizer, "prefix", n)
    assert len(teach.prompts[0]) == n
    assert teacher_prompt_ids(tokenizer, student, [], DICE_SKILLS, "prefix", max_tokens=len(whole)) == whole


@pytest.mark.parametrize("place", ["system", "user"])
def test_message_places_truncate_the_same_way(tokenizer, student_rows, place):
    row = student_rows[0]
    messages = loads(row["prompt_messages"])
    whole = encode_prompt(tokenizer, insert_skills(messages, DICE_SKILLS, place))
    assert teacher_prompt_ids(tokenizer, row["prompt_token_ids"], messages, DICE_SKILLS, place) == whole
    got = teacher_prompt_ids(tokenizer, row["prompt_token_ids"], messages, DICE_SKILLS, place, max_tokens=20)
    assert got == whole[-20:]


def test_no_skill_text_keeps_the_student_prompt(tokenizer, student_rows):
    student = student_rows[0]["prompt_token_ids"]
    assert teacher_prompt_ids(tokenizer, student, [], "", "prefix", max_tokens=3) == student
