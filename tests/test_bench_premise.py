"""bench/premise.py's own parts: the other-solution control relabels each task's rows as another task's (a
derangement that keeps every task's turns together), and the discrimination it reports from rescored rows."""

from __future__ import annotations

import pyarrow as pa
import pytest
from factories import rescored_table

from bench.premise import discrimination_of, other_tasks
from sdarflow import storage
from sdarflow.schema import RESCORED_SCHEMA, TRAJECTORY_SCHEMA


def test_the_other_solution_control_is_a_derangement_of_the_tasks(tmp_path):
    table = rescored_table(n_groups=5).select(TRAJECTORY_SCHEMA.names)
    src = str(tmp_path / "own")
    storage.write_table(table, src, kind="trajectories", schema=TRAJECTORY_SCHEMA, config_hash="t", inputs=[])
    got = storage.read_table(
        other_tasks(src, str(tmp_path / "other")), kind="trajectories", schema=TRAJECTORY_SCHEMA
    )
    before, after = table["task_id"].to_pylist(), got["task_id"].to_pylist()
    mapping = dict(zip(before, after, strict=True))
    assert len(mapping) == 5 and sorted(mapping.values()) == sorted(mapping)  # a bijection of the 5 tasks
    assert all(a != b for a, b in mapping.items())  # no task keeps its own solution
    assert all(mapping[b] == a for b, a in zip(before, after, strict=True))  # rows of a task move together
    assert got.drop(["task_id"]).equals(table.drop(["task_id"]))


def test_discrimination_by_hand(tmp_path):
    # 6 tasks; teacher = student + 1.3 on successful episodes' tokens, + 0.3 on failed ones': the gap differs by
    # 1.0 on every task, the gate by sigmoid(5 * 1.3) - sigmoid(5 * 0.3) = 0.998499 - 0.817574 = 0.180925
    rows = rescored_table(n_groups=6).to_pylist()
    for r in rows:
        r["teacher_logprobs"] = [min(0.0, x + (1.3 if r["success"] else 0.3)) for x in r["old_logprobs"]]
        r["old_logprobs"] = [q - (1.3 if r["success"] else 0.3) for q in r["teacher_logprobs"]]
    uri = str(tmp_path / "rescored")
    storage.write_table(pa.Table.from_pylist(rows, schema=RESCORED_SCHEMA), uri, kind="rescored",
                        schema=RESCORED_SCHEMA, config_hash="t", inputs=[])  # fmt: skip
    out = discrimination_of(uri)
    assert out["gap_mean"] == pytest.approx(0.8, abs=1e-5)  # half the tokens each way
    assert out["success/gap"]["diff"] == pytest.approx(1.0, abs=1e-5)
    assert out["success/gap"]["ci95"] == pytest.approx([1.0, 1.0], abs=1e-5)
    assert out["success/gate"]["diff"] == pytest.approx(0.180925, abs=1e-5)
    assert out["success/gate"]["tasks"] == [6, 6]
    # no expert labels in these rows: no contrast, said as such
    assert out["expert/gate"]["diff"] is None and out["expert/gate"]["text"] == "n/a (0 tasks)"
