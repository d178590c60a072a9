"""``sdarflow study`` at smoke size through the CLI: every cell trains and is evaluated, study.json holds every
result the comparison needs, the reports render, and a rerun skips the finished cells."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sdarflow.cli import main
from sdarflow.extensions.options import OPTIONS


def test_smoke_study_writes_every_key_and_resumes(tiny_model, tmp_path, caplog, capsys):
    out = tmp_path / "study"
    argv = ["study", "--methods", "grpo", "sdar", "--seeds", "0", "--rounds", "2", "--output", str(out),
            "--base-model", str(tiny_model), "--preset", "smoke"]  # fmt: skip
    assert main(argv) == 0
    study = json.loads((out / "study.json").read_text())
    assert {"settings", "k", "base", "runs", "methods", "table", "paired", "gate"} <= study.keys()
    assert {(r["method"], r["seed"]) for r in study["runs"]} == {("grpo", 0), ("sdar", 0)}
    for run in study["runs"]:
        assert len(run["rounds"]) == 2 and len(run["valid_after_round"]) == 1  # round 0's adapter on valid
        rnd = run["rounds"][0]
        # per-round train success, gate and teacher-gap statistics, wall time per stage, held-out pass@k + CIs
        assert {"train_success", "gate_mean", "teacher_gap_mean", "teacher_gap_positive_share"} <= rnd.keys()
        # the smoke preset's env rewards the win alone: each episode's return is its success
        assert rnd["train_return"] == pytest.approx(rnd["train_success"])
        assert rnd["rollout_engine"] == "hf" and rnd["rollout_tokens_per_s"] > 0
        assert 0 <= rnd["zero_adv_group_share"] <= 1 and rnd["adv_std"] >= 0
        assert -1e3 < rnd["adv_token_weighted_mean"] < 1e3
        assert set(run["seconds"]) == {"generate", "extract-skills", "rescore", "train"}
        for split in ("test", "ood"):
            assert set(run["eval"][split]["ci95"]) == set(run["eval"][split]["pass_at_k"])
    for method in ("grpo", "sdar"):
        r = study["methods"][method]
        assert {"test_pass@1", "test_pass@k", "ood_pass@1", "curves", "train_seconds"} <= r.keys()
        assert len(r["test_pass@1"]["ci95"]) == 2
        # held-out by round: the base model, round 0's adapter, the final one
        assert all(v is not None for v in r["curves"]["valid_pass@1"]["mean"])
        assert len(r["curves"]["valid_pass@1"]["mean"]) == 3
    # the base model's rollouts on each round's games (the runs' train-success reference); round 0's are the same
    # rollouts as each run's round 0 (the same stage config and seed, no update yet)
    base_rounds, base_returns = (study["base_curves"][k]["mean"] for k in ("train_success", "train_return"))
    assert len(base_rounds) == 2 and base_returns == pytest.approx(base_rounds)
    assert all(base_rounds[0] == pytest.approx(run["rounds"][0]["train_success"]) for run in study["runs"])
    row = {t["method"]: t for t in study["table"]}
    assert row["grpo"]["training_overhead"] == 1.0
    assert {"test_pass@1", "ood_pass@1"} <= study["paired"]["sdar"].keys()
    assert "0" in study["gate"]["sdar"]
    md = (out / "report.md").read_text()
    assert "relative pass@1" in md and "Paired differences" in md and "promotion gate" in md.lower()
    assert "data:image/png;base64," in (out / "report.html").read_text()

    cell = out / "cells" / "sdar-seed0" / "cell.json"
    stamp = cell.stat().st_mtime_ns
    caplog.clear()
    with caplog.at_level("INFO"):
        assert main(argv) == 0
    assert cell.stat().st_mtime_ns == stamp
    assert "sdar-seed0 finished earlier; skipped" in caplog.text
    assert json.loads(Path(out, "study.json").read_text())["table"] == study["table"]

    # a rerun with other settings never mixes its cells with these: one line, nothing written
    changed = argv[:-2] + ["--stage-settings", '{"train": {"lr": 0.01}}'] + argv[-2:]
    capsys.readouterr()
    assert main(changed) == 2
    err = capsys.readouterr().err
    assert "cell base" in err and "made with other settings" in err
    assert cell.stat().st_mtime_ns == stamp


def test_study_pipeline_runs_locally_on_the_cells_sdarflow_study_reads(tiny_model, tmp_path, caplog):
    """The KFP study pipeline through the local runner writes the cells and the report; ``sdarflow study`` on the
    same folder finds every cell finished and writes the same table."""
    import kfp.local

    from pipelines.study import build_study_pipeline

    out = tmp_path / "study"
    kfp.local.init(runner=kfp.local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "kfp"))
    build_study_pipeline(["grpo"], [0])(out=str(out), base_model=str(tiny_model), rounds=1, preset="smoke")
    study = json.loads((out / "study.json").read_text())
    assert [(r["method"], r["seed"]) for r in study["runs"]] == [("grpo", 0)]
    assert "data:image/png;base64," in (out / "report.html").read_text()
    argv = ["study", "--methods", "grpo", "--seeds", "0", "--rounds", "1", "--output", str(out),
            "--base-model", str(tiny_model), "--preset", "smoke"]  # fmt: skip
    with caplog.at_level("INFO"):
        assert main(argv) == 0
    assert "grpo-seed0 finished earlier; skipped" in caplog.text
    assert json.loads((out / "study.json").read_text())["table"] == study["table"]


def test_the_settings_key_covers_the_base_models_content_not_only_its_path(tiny_model, tmp_path):
    """A base model rebuilt at the same path makes earlier cells unusable: they were trained on another model."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from sdarflow.study import StudySettings, settings_key

    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    settings = StudySettings(
        methods=["grpo"], seeds=[0], rounds=1, out=str(tmp_path / "s"), base_model=str(model)
    )
    before = settings_key(settings)
    assert settings_key(settings) == before
    weights = load_file(str(model / "model.safetensors"))
    save_file(
        {k: v + 0.01 * torch.ones_like(v) for k, v in weights.items()}, str(model / "model.safetensors")
    )
    assert settings_key(settings) != before


def test_an_option_row_trains_its_method_with_the_options_train_settings(tiny_model, tmp_path):
    from sdarflow.pipeline_config import stage_config
    from sdarflow.study import StudySettings, pipeline_config

    s = StudySettings(
        methods=["grpo", "sdar+scpo+filter"], seeds=[0], rounds=1, out=str(tmp_path), preset="smoke"
    )
    s.validate()
    pc = pipeline_config(s, str(tiny_model), "sdar+scpo+filter", 0, str(tmp_path / "store"))
    train = stage_config(pc, "train", 0, input=["x"], adapter="")
    assert (train.method, train.credit, train.filter, train.advantage) == (
        "sdar",
        "scpo",
        "negative-value",
        "outcome",
    )
    plain = stage_config(
        pipeline_config(s, str(tiny_model), "grpo", 0, str(tmp_path / "g")), "train", 0, input=["x"]
    )
    assert (plain.method, plain.credit, plain.filter) == ("grpo", "outcome", "none")


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_every_option_is_valid_settings_of_its_stages(tiny_model, tmp_path, option):
    from sdarflow.pipeline_config import stage_config
    from sdarflow.study import StudySettings, pipeline_config

    row = f"grpo+{option}"
    s = StudySettings(methods=["grpo", row], seeds=[0], rounds=1, out=str(tmp_path), preset="smoke")
    pc = pipeline_config(s, str(tiny_model), row, 0, str(tmp_path / "store"))
    inputs = {"train": {"input": ["x"]}, "rescore": {"input": ["x"], "skills": "s"}}
    for stage, values in OPTIONS[option].items():
        cfg = stage_config(pc, stage, 0, **inputs[stage])
        cfg.validate()
        assert {k: getattr(cfg, k) for k in values} == values


def test_the_studys_stage_settings_win_over_a_rows_options(tiny_model, tmp_path):
    from sdarflow.pipeline_config import stage_config
    from sdarflow.study import StudySettings, pipeline_config

    s = StudySettings(
        methods=["grpo", "sdar+ema"], seeds=[0], rounds=1, out=str(tmp_path), preset="smoke",
        stage_settings={"train": {"ema_decay": 0.9}},
    )  # fmt: skip
    pc = pipeline_config(s, str(tiny_model), "sdar+ema", 0, str(tmp_path / "store"))
    assert stage_config(pc, "train", 0, input=["x"]).ema_decay == 0.9
    assert stage_config(pc, "rescore", 0, input=["x"], skills="s").teacher == "ema"


def test_a_pretrained_base_starts_every_cell_from_one_warm_start(tiny_model, tmp_path, monkeypatch):
    import shutil

    from sdarflow import storage
    from sdarflow.sizes import SIZES
    from sdarflow.study import StudySettings, pipeline_config
    from sdarflow.train.warmstart import SEED_SKILLS

    # a base sdarflow did not build brings no seed library; the pretrained preset warm-starts it (made smaller here)
    base = tmp_path / "base"
    shutil.copytree(tiny_model, base, ignore=shutil.ignore_patterns(SEED_SKILLS))
    small = {"tasks": 2, "train": {"mini_batches": 1, "engine": "torch"}}
    monkeypatch.setitem(SIZES, "pretrained", {**SIZES["pretrained"], "warm_start": small})
    s = StudySettings(methods=["grpo", "sdar"], seeds=[0], rounds=1, out=str(tmp_path / "study"),
                      base_model=str(base), env="tool-use", preset="pretrained")  # fmt: skip
    pc = pipeline_config(s, str(base), "sdar", 0, str(tmp_path / "a"))
    assert storage.read_manifest(pc.start_adapter, "adapter")["kind"] == "adapter"
    assert storage.read_manifest(pc.seed_skills, "skills")
    made = tmp_path / "study" / "start" / "start.json"
    stamp = made.stat().st_mtime_ns
    other = pipeline_config(s, str(base), "grpo", 0, str(tmp_path / "b"))  # every cell: the same, made once
    assert (other.start_adapter, other.seed_skills) == (pc.start_adapter, pc.seed_skills)
    assert made.stat().st_mtime_ns == stamp

    # a model sdarflow built: its own library, a new LoRA, nothing written
    built = StudySettings(methods=["grpo"], seeds=[0], rounds=1, out=str(tmp_path / "s2"), preset="smoke")
    pc = pipeline_config(built, str(tiny_model), "grpo", 0, str(tmp_path / "c"))
    assert (pc.seed_skills, pc.start_adapter) == (str(tiny_model / SEED_SKILLS), "")
    assert not (tmp_path / "s2").exists()
