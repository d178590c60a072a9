"""The rescore stage through the CLI: a hand-written reference library is used, every strategy runs, packed and
padded batching agree, the reports are published with the dataset, shards partition the rows, and the ucb
statistics carry across rounds through extract-skills."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sdarflow import storage
from sdarflow.cli import main
from sdarflow.schema import RESCORED_SCHEMA


def read(uri: str) -> list[dict]:
    return storage.read_table(uri, kind="rescored", schema=RESCORED_SCHEMA).to_pylist()


def test_reference_library_is_used_and_reports_are_published(dataset, rescore, reference_library, tmp_path):
    out = str(tmp_path / "out")
    code, result = rescore(dataset(), reference_library, out)
    assert code == 0, result
    rows = read(out)
    for r in rows:
        own = {"cut": "cutting", "cook": "cooking"}[r["task_type"]]
        assert r["skill_ids"] == [own, "general"] and r["skill_hit"]
        assert len(r["teacher_logprobs"]) == len(r["old_logprobs"]) == len(r["response_token_ids"])
    assert any(abs(a - b) > 1e-4 for r in rows for a, b in zip(r["old_logprobs"], r["teacher_logprobs"]))
    m = result["metrics"]
    for key in ("rescore/gap_mean/cut", "rescore/gap_positive_share/cook", "rescore/skill_uses/general"):
        assert key in m
    assert m["rescore/retrieval_hit_rate"] == m["rescore/retrieval_match_rate"] == 1.0
    assert m["rescore/skill_uses/general"] == len(rows) and m["rescore/tokens_per_s"] > 0
    manifest = storage.read_manifest(out, "rescored")
    assert manifest["reports"] == ["report.html", "report.md"]
    page = (Path(out) / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "data:image/png;base64," in page and "cutting" in page
    assert "| cut |" in (Path(out) / "report.md").read_text()


def test_overwrite_keeps_the_reports_and_refuses_without_the_flag(
    dataset, rescore, reference_library, tmp_path
):
    traj, out = dataset(), str(tmp_path / "out")
    assert rescore(traj, reference_library, out)[0] == 0
    code, err = rescore(traj, reference_library, out)
    assert code == 2 and "already published" in err and "--overwrite" in err
    assert rescore(traj, reference_library, out, "--overwrite", "--retrieval", "full")[0] == 0
    assert (Path(out) / "report.html").is_file() and (Path(out) / "report.md").is_file()
    assert read(out)[0]["skill_ids"] == ["cooking", "cutting", "general"]


@pytest.mark.parametrize("strategy", ["keyword", "ucb", "random", "full"])
def test_every_strategy_runs(dataset, rescore, reference_library, tmp_path, strategy):
    out = str(tmp_path / strategy)
    code, result = rescore(dataset(), reference_library, out, "--retrieval", strategy, "--seed", "3")
    assert code == 0, result
    rows = read(out)
    assert all(r["skill_hit"] and r["skill_ids"][-1] == "general" for r in rows)
    if strategy == "ucb":  # per task type, untried skills first: the first two rows of a type differ
        first = {}
        for r in rows:
            first.setdefault(r["task_type"], []).append(r["skill_ids"][0])
        assert all(len(set(ids[:2])) == 2 for ids in first.values())


def test_packed_and_padded_stage_outputs_agree(dataset, rescore, reference_library, tmp_path):
    traj = dataset()
    for mode in ("packed", "padded"):
        assert rescore(traj, reference_library, str(tmp_path / mode), "--batching", mode)[0] == 0
    packed, padded = read(str(tmp_path / "packed")), read(str(tmp_path / "padded"))
    diff = max(
        abs(a - b)
        for p, q in zip(packed, padded)
        for col in ("old_logprobs", "teacher_logprobs")
        for a, b in zip(p[col], q[col])
    )
    assert diff < 1e-5


def test_shards_partition_the_groups(dataset, rescore, reference_library, tmp_path):
    traj = dataset()
    shards = []
    for s in (0, 1):
        out = str(tmp_path / f"shard{s}")
        assert rescore(traj, reference_library, out, "--shard", str(s), "--num-shards", "2")[0] == 0
        shards.append(read(out))
    groups = [{r["group_id"] for r in rows} for rows in shards]
    assert groups[0] and groups[1] and not groups[0] & groups[1]
    assert sum(len(rows) for rows in shards) == 15


def test_ucb_statistics_carry_across_rounds(dataset, rescore, reference_library, tmp_path, capsys):
    traj = dataset()
    scored = str(tmp_path / "rescored0")
    assert rescore(traj, reference_library, scored, "--retrieval", "ucb")[0] == 0
    lib1 = str(tmp_path / "skills1")
    argv = ["extract-skills", "--input", traj, "--previous", reference_library, "--output", lib1]
    assert main([*argv, "--rescored", scored]) == 0
    capsys.readouterr()
    stats = json.loads((Path(lib1) / "skill_stats.json").read_text())
    arms = stats["arms"]
    assert set(arms) == {"cut", "cook"} and stats["updates"] == 1
    pulls = sum(a["pulls"] for per_type in arms.values() for a in per_type.values())
    assert pulls == 15  # every row credited its one task-specific skill
    # the next round reads them from the library
    code, result = rescore(traj, lib1, str(tmp_path / "rescored1"), "--retrieval", "ucb")
    assert code == 0, result
    # rows scored with another library cannot update this one
    code = main(
        [
            "extract-skills",
            "--input",
            traj,
            "--previous",
            lib1,
            "--rescored",
            scored,
            "--output",
            str(tmp_path / "x"),
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and "was scored with skill library" in err
