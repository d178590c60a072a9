"""The synthetic teacher (``rescore --teacher-context synthetic``): hand-computed tilted log-probs, its labels and
their noise, and the stage: a teacher that prefers exactly the expert-matching turns, on train rows only."""

from __future__ import annotations

import math

import pytest
import torch
from test_rescore_stage import read

from sdarflow.errors import ConfigError
from sdarflow.teacher.synthetic import synthetic_teacher, tilted_logprobs


def test_tilted_logprobs_by_hand():
    # p = 0.5 raised by ln 3: 1.5 / (1.5 + 0.5) = 0.75; p = 0.9 lowered by ln 9: 0.1 / (0.1 + 0.1) = 0.5;
    # p = 0.2 unchanged by 0; a certain token stays certain whatever the shift
    s = torch.tensor([math.log(0.5), math.log(0.9), math.log(0.2), 0.0, 0.0], dtype=torch.float64)
    d = torch.tensor([math.log(3), -math.log(9), 0.0, 2.0, -2.0], dtype=torch.float64)
    expected = [math.log(0.75), math.log(0.5), math.log(0.2), 0.0, 0.0]
    assert tilted_logprobs(s, d).tolist() == pytest.approx(expected, abs=1e-12)
    # always a log-probability, and monotone in the shift
    grid = tilted_logprobs(torch.full((5,), math.log(0.3)), torch.tensor([-3.0, -1.0, 0.0, 1.0, 3.0]))
    assert bool((grid <= 0).all()) and bool((grid.diff() > 0).all())


def test_labels_and_their_noise():
    old = [[-1.0, -0.5], [-2.0]]
    teacher, labels = synthetic_teacher(old, [True, False], delta=1.0, label_noise=0.0, seed=0)
    assert labels == [True, False]
    assert all(q > s for q, s in zip(teacher[0], old[0], strict=True)) and teacher[1][0] < old[1][0]
    assert synthetic_teacher(old, [True, False], 1.0, 1.0, seed=0)[1] == [
        False,
        True,
    ]  # p = 1 flips every label
    flips = synthetic_teacher([[-1.0]] * 2000, [True] * 2000, 1.0, 0.5, seed=3)[1]
    assert 0.45 < sum(flips) / 2000 < 0.55  # p = 0.5: half of them, whatever the content
    with pytest.raises(ConfigError, match="1 of 2 turns have no expert label"):
        synthetic_teacher(old, [True, None], 1.0, 0.0, seed=0)


def _labelled(student_rows):
    return [dict(r, expert_action="take knife", expert_match=r["turn"] == 0) for r in student_rows]


def test_the_synthetic_teacher_prefers_exactly_the_expert_turns(
    student_rows, write_dataset, rescore, reference_library, tmp_path
):
    out = str(tmp_path / "syn")
    code, result = rescore(write_dataset("labelled", _labelled(student_rows)), reference_library, out,
                           "--teacher-context", "synthetic", "--synthetic-delta", "2")  # fmt: skip
    assert code == 0, result
    for r in read(out):
        expected = tilted_logprobs(
            torch.tensor(r["old_logprobs"]), torch.tensor(2.0 if r["turn"] == 0 else -2.0)
        )
        assert r["teacher_logprobs"] == pytest.approx(expected.tolist(), abs=1e-6)
    from sdarflow import storage

    assert "synthetic (logit shift 2 nats, label noise 0)" in storage.read_member(out, "report.md").decode()


@pytest.mark.parametrize("context", ["synthetic", "solution"])
def test_a_privileged_context_refuses_rows_outside_train_and_writes_nothing(
    student_rows, write_dataset, rescore, reference_library, tmp_path, context
):
    rows = _labelled(student_rows)
    rows[-1] = dict(rows[-1], split="test")
    out = tmp_path / "refused"
    code, line = rescore(
        write_dataset("mixed", rows), reference_library, str(out), "--teacher-context", context
    )
    assert code == 2 and "fix:" in line
    assert (
        f"--teacher-context {context}: the input has rows of split test; only train rollouts may be" in line
    )
    assert not out.exists()
