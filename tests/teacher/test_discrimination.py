"""The teacher's discrimination: contrasts of turn means with a task-level interval, and n/a below 5 tasks."""

import math

import pytest

from sdarflow.teacher.discrimination import (
    MIN_TASKS,
    TurnScore,
    contrast,
    discrimination,
    discrimination_metrics,
    discrimination_rows,
    turn_scores,
)


def test_turn_scores_by_hand():
    # gaps (0, +ln 3 / 5) at beta 5: gates 0.5 and sigmoid(ln 3) = 0.75; mean gate 0.625, mean gap ln 3 / 10
    s = [[-1.0, -2.0], []]
    q = [[-1.0, -2.0 + math.log(3) / 5], []]
    turns = turn_scores(["t0", "t0"], [True, False], [True, None], s, q, beta=5.0)
    assert len(turns) == 1  # the turn without response tokens is left out
    assert turns[0].gate == pytest.approx(0.625)
    assert turns[0].gap == pytest.approx(math.log(3) / 10)
    assert turns[0].task_id == "t0" and turns[0].success and turns[0].expert_match


def _table(tasks: int) -> list[TurnScore]:
    """Per task: two expert-matching turns with gates 0.8 and 0.6 and one other turn at 0.4 (tasks differ by a
    task-level shift of i/100, which the difference does not see); episodes of even tasks succeeded."""
    turns = []
    for i in range(tasks):
        shift = i / 100
        for gate, match in ((0.8, True), (0.6, True), (0.4, False)):
            turns.append(TurnScore(f"t{i}", i % 2 == 0, match, gate + shift, gate - 0.5))
    return turns


def test_a_hand_made_table():
    table = discrimination(_table(10))
    expert = table["expert"]["gate"]
    # turn means: (0.8 + 0.6) / 2 + mean shift, minus 0.4 + mean shift -> exactly 0.3, whichever tasks are drawn
    assert expert.diff == pytest.approx(0.3)
    assert expert.ci95 == pytest.approx((0.3, 0.3))
    assert (expert.tasks_a, expert.tasks_b) == (10, 10)
    assert table["expert"]["gap"].diff == pytest.approx(0.3)
    # success: even tasks (shifts 0, .02, ..., .08) against odd (.01, ..., .09): the same turns, shifted -0.01
    success = table["success"]["gate"]
    assert success.diff == pytest.approx(-0.01)
    lo, hi = success.ci95
    assert lo < -0.01 < hi and hi - lo > 0  # the task shifts make it vary between draws
    metrics = discrimination_metrics(table)
    assert metrics["rescore/discrimination/expert/gate"] == pytest.approx(0.3)
    assert metrics["rescore/discrimination/success/gate/lo"] == pytest.approx(lo)


def test_below_five_tasks_on_a_side_is_na_never_a_zero_width_interval():
    turns = _table(MIN_TASKS + 3)
    # only one task's episodes succeeded: the success side has 1 task
    turns = [TurnScore(t.task_id, t.task_id == "t0", t.expert_match, t.gate, t.gap) for t in turns]
    c = contrast(turns, [t.success for t in turns], "gate")
    assert (c.tasks_a, c.tasks_b) == (1, MIN_TASKS + 2)
    assert c.diff is None and c.ci95 is None
    assert c.text() == "n/a (1 tasks)"
    table = discrimination(turns)
    assert "rescore/discrimination/success/gate" not in discrimination_metrics(table)
    rows = discrimination_rows(table)
    assert [r[3] for r in rows if r[1] == "gate"] == ["+0.300 [+0.300, +0.300]", "n/a (1 tasks)"]


def test_turns_without_an_expert_label_are_left_out():
    turns = _table(6) + [TurnScore("t99", False, None, 0.0, -5.0)]
    c = contrast(turns, [t.expert_match for t in turns], "gate")
    assert c.diff == pytest.approx(0.3) and c.tasks_a == 6
    none = contrast(turns, [None] * len(turns), "gate")
    assert none.text() == "n/a (0 tasks)"
