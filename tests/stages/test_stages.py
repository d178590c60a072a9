"""Each stage on tiny inputs, chained through the CLI the way a user runs them; outputs validate."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from sdarflow import storage
from sdarflow.cli import main
from sdarflow.errors import StorageError
from sdarflow.registry import Registry
from sdarflow.schema import RESCORED_SCHEMA, TRAJECTORY_SCHEMA


def run_cli(capsys, *argv: str) -> dict:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def chain(tiny_model, tmp_path_factory):
    """generate -> extract-skills -> rescore -> train on the tiny model; returns the URIs."""
    root = tmp_path_factory.mktemp("store")
    uris = {s: str(root / s) for s in ("generate", "skills", "rescore", "train", "evaluate")}
    model = str(tiny_model)
    assert (
        main(
            [
                "generate",
                "--model",
                model,
                "--env",
                "textworld-cooking",
                "--split",
                "train",
                "--tasks",
                "2",
                "--group-size",
                "2",
                "--max-turns",
                "3",
                "--output",
                uris["generate"],
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "extract-skills",
                "--input",
                uris["generate"],
                "--output",
                uris["skills"],
                "--previous",
                str(tiny_model / "seed_skills"),
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "rescore",
                "--input",
                uris["generate"],
                "--skills",
                uris["skills"],
                "--model",
                model,
                "--output",
                uris["rescore"],
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "train",
                "--input",
                uris["rescore"],
                "--model",
                model,
                "--output",
                uris["train"],
                "--mini-batches",
                "2",
            ]
        )
        == 0
    )
    return uris


def test_generate_writes_groups_of_turn_rows(chain):
    t = storage.read_table(chain["generate"], kind="trajectories", schema=TRAJECTORY_SCHEMA).to_pylist()
    assert {r["task_id"] for r in t} == {"tw-cooking-train-1000", "tw-cooking-train-1001"}
    assert len({r["traj_id"] for r in t}) == 4 and all(r["turn"] < 3 for r in t)
    for r in t:
        assert len(r["rollout_logprobs"]) == len(r["response_token_ids"]) > 0
        assert all(lp <= 0 for lp in r["rollout_logprobs"])
    # the report beside the rows: overview, success by task type, a transcript
    md = storage.read_member(chain["generate"], "report.md").decode()
    assert "## By task type" in md and "| episodes | 4 |" in md
    assert "episode (tw-cooking-train-100" in md  # a transcript
    assert storage.read_member(chain["generate"], "report.html").startswith(b"<!DOCTYPE html>")


def test_skills_are_a_versioned_library(chain):
    manifest = storage.read_manifest(chain["skills"], "skills")
    assert len(manifest["version"]) == 12
    files = {f["path"] for f in manifest["files"]}
    assert "skill_mapping.json" in files and "general_skills.md" in files
    md = storage.read_member(chain["skills"], "report.md").decode()
    assert "## Skills" in md and r"general\_skills" in md and r"Skill: general\_skills" in md


def test_rescore_adds_teacher_and_student_logprobs(chain):
    t = storage.read_table(chain["rescore"], kind="rescored", schema=RESCORED_SCHEMA).to_pylist()
    for r in t:
        assert len(r["old_logprobs"]) == len(r["teacher_logprobs"]) == len(r["response_token_ids"])
        # same weights, same context as the engine: the student re-score matches the rollout log-probs
        assert max(abs(a - b) for a, b in zip(r["old_logprobs"], r["rollout_logprobs"])) < 1e-3
    assert any(r["skill_ids"] for r in t)
    assert any(abs(a - b) > 1e-4 for r in t for a, b in zip(r["old_logprobs"], r["teacher_logprobs"]))


def test_train_publishes_a_peft_adapter_with_step_metrics(chain):
    manifest = storage.read_manifest(chain["train"], "adapter")
    files = {f["path"] for f in manifest["files"]}
    assert {"adapter_config.json", "adapter_model.safetensors", "metrics.jsonl"} <= files
    lines = [json.loads(x) for x in Path(chain["train"], "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2]
    for key in (
        "loss/total",
        "sdar/gate_mean",
        "sdar/gate_active_ratio",
        "sdar/teacher_gap_mean",
        "grad_norm",
    ):
        assert key in lines[0]


def test_train_target_kl_stops_the_round_and_says_where(chain, tiny_model, tmp_path, capsys):
    """rescore's old log-probs are the policy's own, so step 1 measures KL ~0 and is applied; at lr 0.05 step 2
    measures more than 1e-6 and ends the run unapplied: one metrics line, and the summary names step 2."""
    out = run_cli(
        capsys, "train", "--input", chain["rescore"], "--model", str(tiny_model), "--output",
        str(tmp_path / "kl"), "--mini-batches", "1", "--epochs", "3", "--lr", "0.05", "--target-kl", "1e-6",
    )  # fmt: skip
    assert out["metrics"]["train/kl_stop_step"] == 2 and out["metrics"]["train/steps"] == 1
    assert len(Path(tmp_path, "kl", "metrics.jsonl").read_text().splitlines()) == 1


def test_evaluate_and_register(chain, tiny_model, tmp_path, capsys):
    out = run_cli(
        capsys,
        "evaluate",
        "--model",
        str(tiny_model),
        "--adapter",
        chain["train"],
        "--splits",
        "test",
        "--tasks",
        "1",
        "--samples",
        "2",
        "--max-turns",
        "2",
        "--output",
        chain["evaluate"],
    )
    report = storage.read_json(f"{chain['evaluate']}/report.json")
    assert report["splits"]["test"]["samples_per_task"] == 2 and set(
        report["splits"]["test"]["pass_at_k"]
    ) == {"1", "2"}
    assert out["metrics"]["test/pass@1"] == report["splits"]["test"]["pass_at_k"]["1"]
    # the task window and the seed are the protocol too: the gate pairs only reports on the same tasks and samples
    assert {k: report["protocol"][k] for k in ("first_task", "tasks", "seed")} == {
        "first_task": 0,
        "tasks": 1,
        "seed": 1234,
    }
    reg = str(tmp_path / "registry")
    got = run_cli(
        capsys,
        "register",
        "--registry",
        reg,
        "--adapter",
        chain["train"],
        "--eval-report",
        chain["evaluate"],
        "--model",
        str(tiny_model),
        "--data",
        chain["generate"],
        "--data",
        chain["skills"],
    )
    assert got["version"] == 1
    # a KFP retry of the same task (its pod died after publishing) finds its version instead of adding one;
    # another registration of the same adapter (other data in its lineage) is a new version
    argv = ["register", "--registry", reg, "--adapter", chain["train"], "--eval-report", chain["evaluate"]]
    argv += ["--model", str(tiny_model), "--data", chain["generate"]]
    assert run_cli(capsys, *argv, "--data", chain["skills"])["version"] == 1
    assert run_cli(capsys, *argv)["version"] == 2
    # a staging policy that refuses: the version is registered and reported not staged, and the command succeeds
    # (a pipeline's register task would otherwise fail, be retried and be refused again)
    Registry(reg).set_gate("sdar-policy", "staging", {"floor": 0.99}, reason="test: a canary bar")
    staged = run_cli(capsys, *argv, "--data", chain["rescore"], "--promote-to", "staging")
    assert staged["version"] == 3 and staged["staging"].startswith("refused: ")
    assert "staging" not in Registry(reg).aliases("sdar-policy")
    lineage = json.loads(Path(reg, "sdar-policy/versions/1/lineage.json").read_text())
    assert lineage["skill_library_version"] == storage.read_manifest(chain["skills"])["version"]
    assert lineage["train_config_hash"] == storage.read_manifest(chain["train"])["config_hash"]
    # the teacher that taught it, from rescore's manifest through train's (a control would be refused production)
    assert storage.read_manifest(chain["rescore"])["teacher_context"] == "skills"
    assert (
        lineage["teacher_contexts"] == storage.read_manifest(chain["train"])["teacher_contexts"] == ["skills"]
    )


def test_generate_continues_from_the_trained_adapter(chain, tiny_model, tmp_path):
    out = str(tmp_path / "gen2")
    assert (
        main(
            [
                "generate",
                "--model",
                str(tiny_model),
                "--adapter",
                chain["train"],
                "--tasks",
                "1",
                "--group-size",
                "2",
                "--max-turns",
                "1",
                "--output",
                out,
            ]
        )
        == 0
    )
    rows = storage.read_table(out, kind="trajectories", schema=TRAJECTORY_SCHEMA).to_pylist()
    assert {r["policy_version"] for r in rows} == {chain["train"]}


def test_a_published_skill_library_is_read_from_a_copy_that_is_removed(chain, tmp_path, monkeypatch):
    """rescore and extract-skills read a published library from a verified copy; the copy does not outlive the
    read (a study's rounds ran in one process each left one in the temp folder)."""
    from sdarflow.stages.common import load_skills

    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    lib = load_skills(chain["skills"])
    assert lib.skills and list(temp.iterdir()) == []


def test_a_remote_adapter_is_read_from_a_copy_the_stage_removes(
    chain, tiny_model, tmp_path, monkeypatch, s3_root
):
    """A stage given an S3 adapter verified it into a copy in the temp folder and left it there: each round of a
    study on S3 left one (a full fine-tune's: the whole model). The copy now lives in the stage's scratch folder,
    removed when the stage returns; a copy that fails verification is removed at once."""
    remote = storage.join(s3_root, "adapter")
    storage.publish_dir(storage.fetch_dir(chain["train"], kind="adapter"), remote, kind="adapter")
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    argv = ["generate", "--model", str(tiny_model), "--adapter", remote, "--tasks", "1", "--group-size", "2"]
    assert main([*argv, "--max-turns", "1", "--output", str(tmp_path / "gen")]) == 0
    rows = storage.read_table(
        str(tmp_path / "gen"), kind="trajectories", schema=TRAJECTORY_SCHEMA
    ).to_pylist()
    assert {r["policy_version"] for r in rows} == {remote} and list(temp.iterdir()) == []

    last = storage.read_manifest(remote)["files"][-1]["path"]  # the copy holds every other file by then
    storage.write_bytes(storage.join(remote, last), b"flipped bits")
    with pytest.raises(StorageError, match="sha256"):
        storage.fetch_dir(remote, kind="adapter")
    assert list(temp.iterdir()) == []
