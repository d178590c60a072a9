"""The solution-reading teacher (``rescore --teacher-context solution``): each built-in env's solution solves its
task when played, the teacher's prompt is the reference's with the solution in the skills' place, the stage scores
it (log-probs checked against a plain transformers forward pass), credits no skill, and records the context for the
lineage (a row outside train is refused: test_synthetic.py)."""

from __future__ import annotations

import json

import pytest
import torch
from test_rescore_stage import read
from transformers import AutoModelForCausalLM

from sdarflow import storage
from sdarflow.envs import EnvError, get_suite
from sdarflow.rollout.prompt import prompt_text
from sdarflow.teacher.rescore import teacher_prompts
from sdarflow.teacher.solution import solution_text, task_solutions


def test_solution_text_by_hand():
    assert solution_text(["take knife", "eat meal"]) == (
        "Solution of this task, the expert's actions in order:\n1. take knife\n2. eat meal"
    )


@pytest.mark.parametrize("env", ["tool-use", "search-qa", "textworld-cooking"])
def test_each_builtin_solution_wins_its_task_and_names_only_its_own_split(env, game_cache):
    suite = get_suite(env, **({"cache_dir": game_cache} if env == "textworld-cooking" else {}))
    for task in suite.tasks("train", n=2, start=1):
        game = suite.make(task)
        game.reset()
        steps = suite.solution(task.task_id, "train")
        outcome = None
        for action in steps:
            outcome = game.step(action)
        assert outcome is not None and outcome.won and outcome.done, (task.task_id, steps)
        game.close()
        with pytest.raises(EnvError, match="is not one of the .* tasks of split 'test'.*fix:"):
            suite.solution(task.task_id, "test")
    prefix = task.task_id.rsplit("-", 1)[0]
    with pytest.raises(EnvError, match="fix:"):
        suite.solution(f"{prefix}-99999999", "train")  # past the split's end


def _tool_use_rows(student_rows: list[dict]) -> list[dict]:
    """The hand-built rows as tool-use tasks of train (real ids: the env looks their solutions up)."""
    return [
        dict(r, env="tool-use", task_id=f"tool-use-train-{1000 + int(r['task_id'][-1])}")
        for r in student_rows
    ]


def test_the_teacher_prompt_is_the_reference_prefix_with_the_solution(
    tokenizer, student_rows, reference_library
):
    from sdarflow.skills.library import SkillLibrary
    from sdarflow.skills.retrieve import keyword

    rows = _tool_use_rows(student_rows)
    texts = task_solutions(rows)
    plan = json.loads(get_suite("tool-use").tasks("train", n=1, start=2)[0].payload)["plan"]
    i = next(i for i, r in enumerate(rows) if r["task_id"] == "tool-use-train-1002")
    assert texts[i] == solution_text(plan)
    teach = teacher_prompts(
        rows, SkillLibrary.load(reference_library), keyword, tokenizer, "prefix", 4096, texts
    )
    student = rows[i]["prompt_token_ids"]
    expected = f"[Privileged Skill Information]\n{texts[i]}\n\n{prompt_text(tokenizer, student)}"
    assert teach.prompts[i] == tokenizer.encode(expected, add_special_tokens=False)
    assert teach.skill_ids == [[]] * len(rows) and not any(teach.hits) and teach.unchanged == 0


def test_the_stage_scores_the_solution_teacher_and_records_it(
    student_rows, write_dataset, rescore, reference_library, tiny_model, tokenizer, tmp_path
):
    rows = _tool_use_rows(student_rows)
    out = str(tmp_path / "solution")
    code, result = rescore(
        write_dataset("tool-use", rows), reference_library, out, "--teacher-context", "solution"
    )
    assert code == 0, result
    scored = read(out)
    assert all(
        r["skill_ids"] == [] and not r["skill_hit"] for r in scored
    )  # no skill credited (ucb statistics)
    assert storage.read_manifest(out)["teacher_context"] == "solution"
    assert "| teacher context | solution |" in storage.read_member(out, "report.md").decode()
    # the teacher's log-probs are the model's on the solution-prefixed prompt: a plain forward pass agrees
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), torch_dtype=torch.float32).eval()
    row = scored[0]
    text = task_solutions([row])[0]
    context = tokenizer.encode(
        f"[Privileged Skill Information]\n{text}\n\n{prompt_text(tokenizer, row['prompt_token_ids'])}",
        add_special_tokens=False,
    )
    ids = torch.tensor([context + row["response_token_ids"]])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)
    n = len(row["response_token_ids"])
    expected = logp[-n:].gather(-1, ids[0, -n:, None])[:, 0]
    assert row["teacher_logprobs"] == pytest.approx(expected.tolist(), abs=1e-4)
    assert row["teacher_logprobs"] != pytest.approx(row["old_logprobs"], abs=1e-3)
