"""The whole DAG through the KFP local runner (real subprocess tasks), on a local folder and on S3, and the
compiled pipeline spec."""

from __future__ import annotations

import json

import pytest
import yaml

from sdarflow import storage
from sdarflow.cli import main
from sdarflow.demo import run_demo
from sdarflow.schema import RESCORED_SCHEMA, TRAJECTORY_SCHEMA


def check_summary(summary: dict) -> None:
    storage.read_table(summary["trajectories"], kind="trajectories", schema=TRAJECTORY_SCHEMA)
    storage.read_table(summary["rescored"], kind="rescored", schema=RESCORED_SCHEMA)
    storage.read_manifest(summary["skills"], "skills")
    storage.read_manifest(summary["adapter"], "adapter")
    report = storage.read_json(storage.join(summary["eval_report"], "report.json"))
    assert set(report["splits"]) == {"test", "ood"}
    assert storage.exists(storage.join(summary["registry"], "sdar-policy", "versions", "1", "lineage.json"))


@pytest.mark.slow
def test_demo_dag_on_local_storage(tiny_model, tmp_path):
    summary = run_demo(tmp_path / "demo", rounds=2, preset="smoke", base_model=str(tiny_model))
    assert json.loads((tmp_path / "demo" / "summary.json").read_text())["rounds"] == 2
    assert summary["trajectories"].startswith(str(tmp_path / "demo" / "store"))
    check_summary(summary)
    # round 1 generated with round 0's adapter
    rows = storage.read_table(summary["trajectories"], kind="trajectories", schema=TRAJECTORY_SCHEMA)
    assert set(rows["policy_version"].to_pylist()) == {summary["adapter"].replace("round=1", "round=0")}
    assert storage.exists(storage.join(summary["registry"], "sdar-policy", "versions", "2", "lineage.json"))


@pytest.mark.slow
def test_demo_dag_on_s3(tiny_model, tmp_path, s3_root):
    summary = run_demo(
        tmp_path / "demo", storage_root=s3_root, rounds=1, preset="smoke", base_model=str(tiny_model)
    )
    for key in ("trajectories", "skills", "rescored", "adapter", "eval_report", "registry"):
        assert summary[key].startswith(s3_root), key
    check_summary(summary)
    assert not (tmp_path / "demo" / "store").exists()


def test_compiled_spec_has_every_stage(tmp_path, capsys):
    out = tmp_path / "pipeline.yaml"
    assert main(["pipeline", "compile", "--out", str(out), "--rounds", "1"]) == 0
    spec = yaml.safe_load(out.read_text())
    tasks = spec["root"]["dag"]["tasks"]
    assert {"prepare", "generate", "extract-skills", "rescore", "train", "evaluate", "register"} <= set(tasks)
    params = spec["root"]["inputDefinitions"]["parameters"]
    assert params["lam"]["defaultValue"] == 0.01 and params["beta"]["defaultValue"] == 5.0
    assert params["method"]["defaultValue"] == "sdar"
