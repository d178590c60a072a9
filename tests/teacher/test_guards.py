"""Each sanity guard fires on input built to trigger it (one error line through the CLI, nothing published), can be
overridden, and stays quiet on a normal run."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from sdarflow import storage
from sdarflow.skills.library import SkillLibrary
from sdarflow.teacher import report as guards

SETTINGS = guards.GuardSettings()


def test_degenerate_teacher_unit():
    uniform = -math.log(1000)
    with pytest.raises(guards.DegenerateTeacherError, match="near-uniform"):
        guards.check_scores([[-1.0, -2.0]], [[uniform + 0.01, uniform - 0.02]], 1000, 0, SETTINGS, [])
    with pytest.raises(guards.DegenerateTeacherError, match="constant"):
        guards.check_scores([[-1.0, -2.0], [-3.0]], [[-0.5, -0.5], [-0.5]], 1000, 0, SETTINGS, [])
    guards.check_scores([[-1.0, -2.0]], [[-0.9, -2.5]], 1000, 0, SETTINGS, [])  # a normal teacher passes


def test_identical_teacher_unit():
    with pytest.raises(guards.TeacherEqualsStudentError, match="2 of 2 teacher prompts"):
        guards.check_scores([[-1.0, -2.0], [-3.0]], [[-1.0, -2.0], [-3.0]], 1000, 2, SETTINGS, [])
    overridden: list[str] = []
    allow = guards.GuardSettings(allow_identical_teacher=True)
    guards.check_scores([[-1.0, -2.0]], [[-1.0, -2.0]], 1000, 1, allow, overridden)
    assert overridden == ["TeacherEqualsStudentError"]


def test_general_only_unit():
    lib = SkillLibrary.load(Path(__file__).parents[1] / "skills" / "data" / "reference_library")
    with pytest.raises(guards.GeneralOnlyRetrievalError, match=r"75% of rows \(3/4\).*\['plain'\]"):
        guards.check_retrieval(lib, [False, False, False, True], ["plain"] * 3 + ["cut"], SETTINGS, [])
    guards.check_retrieval(lib, [False, True, True, True], ["plain"] + ["cut"] * 3, SETTINGS, [])
    # a library of general skills only cannot do better: no error
    general_only = SkillLibrary({"general": lib.general})
    guards.check_retrieval(general_only, [False] * 4, ["cut"] * 4, SETTINGS, [])


@pytest.fixture
def zeroed_model(tiny_model, tmp_path) -> str:
    """The tiny model with its (tied) embedding/LM-head zeroed: every logit is 0, the teacher exactly uniform."""
    import torch
    from transformers import AutoModelForCausalLM

    out = tmp_path / "zeroed"
    shutil.copytree(tiny_model, out)
    model = AutoModelForCausalLM.from_pretrained(str(out))
    with torch.no_grad():
        model.get_output_embeddings().weight.zero_()
    model.save_pretrained(out)
    return str(out)


def test_degenerate_teacher_fails_the_stage(dataset, reference_library, zeroed_model, tmp_path, capsys):
    from sdarflow.cli import main

    out = tmp_path / "out"
    argv = ["rescore", "--input", dataset(), "--skills", reference_library, "--model", zeroed_model]
    assert main([*argv, "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: teacher log-probs are near-uniform") and "--allow-degenerate-teacher" in err
    assert not out.exists()


def test_identical_teacher_fails_the_stage(dataset, rescore, tmp_path):
    empty = tmp_path / "empty_lib"
    empty.mkdir()
    (empty / "skill_mapping.json").write_text(json.dumps({"skill_files": {}}))
    code, err = rescore(dataset(), str(empty), str(tmp_path / "out"), "--allow-unpublished")
    assert code == 2 and err.startswith("error: teacher log-probs equal the student's on all")
    assert "teacher prompts are identical to the student prompt" in err
    assert not (tmp_path / "out").exists()


@pytest.fixture
def grill_library(tmp_path) -> str:
    """A library whose only task-specific skill is for a task type the data does not have."""
    lib = tmp_path / "grill_lib"
    lib.mkdir()
    (lib / "general_skills.md").write_text("# General\n\n- Read the cookbook.\n- Eat the meal.\n")
    (lib / "grilling.md").write_text("# Grilling\n\n1. Take the <item>.\n2. Grill the <item> with the BBQ.\n")
    mapping = {
        "skill_files": {"general": "general_skills.md", "grilling": "grilling.md"},
        "task_to_skill": {"grill": "grilling"},
        "task_keywords": {"grill": ["grill", "bbq"]},
    }
    (lib / "skill_mapping.json").write_text(json.dumps(mapping))
    return str(lib)


def test_general_only_retrieval_fails_the_stage_and_can_be_overridden(
    dataset, rescore, grill_library, tmp_path
):
    traj = dataset()
    code, err = rescore(traj, grill_library, str(tmp_path / "out"), "--allow-unpublished")
    assert code == 2 and "100% of rows (15/15) got only general skills" in err
    assert "task types without a skill: ['cook', 'cut']" in err and "--allow-general-only" in err
    assert not (tmp_path / "out").exists()
    code, result = rescore(
        traj, grill_library, str(tmp_path / "out"), "--allow-general-only", "--allow-unpublished"
    )
    assert code == 0 and result["metrics"]["rescore/guards_overridden"] == 1.0
    manifest = storage.read_manifest(str(tmp_path / "out"), "rescored")
    assert manifest["guards_overridden"] == ["GeneralOnlyRetrievalError"]


def test_no_guard_fires_on_a_normal_run(dataset, rescore, reference_library, tmp_path):
    code, result = rescore(dataset(), reference_library, str(tmp_path / "out"))
    assert code == 0, result
    assert result["metrics"]["rescore/guards_overridden"] == 0.0
