"""The capacity planner: its formulas against hand-computed values, the CLI, and calibration on a real model."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from sdarflow import plan
from sdarflow.cli import main
from sdarflow.errors import ConfigError

CONSTANTS = plan.Constants(
    prefill_flops=1e12,
    decode_flops=1e11,
    forward_flops=2e12,
    train_flops=1e12,
    env_turn_s=0.01,
    env_reset_s=0.1,
    task_start_s=7.0,
    source="test",
)
WORK = plan.Workload(
    model_params=1e9,
    gpus=2,
    tasks=4,
    group_size=2,
    turns=5,
    prompt_tokens=100,
    response_tokens=10,
    eval_tasks=3,
    eval_samples=2,
    eval_turns=4,
    epochs=2,
    rescore_passes=3,
    envs="local",
)


def test_estimate_matches_the_formulas_by_hand():
    # 40 turn rows of 110 tokens. generate: 2e9 x 40 x (100/1e12 + 10/1e11) / 2 GPUs = 8 s, env 40 x 0.01 + 8 x 0.1.
    # rescore: 2e9 x 4400 x 3 / 2e12 / 2 = 6.6 s; train: 6e9 x 4400 x 2 / 1e12 / 2 = 26.4 s; evaluate: per split
    # 6 episodes x 4 turns: 2e9 x 24 x 2e-10 / 2 = 4.8 s + 24 x 0.01 + 6 x 0.1 = 5.64 s, two splits.
    got = plan.estimate(WORK, CONSTANTS)
    expected = {"generate": 9.2, "rescore": 6.6, "train": 26.4, "evaluate": 11.28}
    for stage, seconds in expected.items():
        assert got["work_seconds"][stage] == pytest.approx(seconds)
        assert got["stages_seconds"][stage] == pytest.approx(seconds + 7.0)
    assert got["round_seconds"] == pytest.approx(53.48 + 8 * 7.0)
    assert got["gpu_hours"] == pytest.approx(2 * 109.48 / 3600)
    assert got["weights_gib_per_gpu"] == pytest.approx(2e9 / 2**30)  # bf16: 2 bytes a parameter
    fp32 = plan.estimate(dataclasses.replace(WORK, precision="fp32"), CONSTANTS)
    assert fp32["weights_gib_per_gpu"] == pytest.approx(4e9 / 2**30)
    overlapped = plan.estimate(dataclasses.replace(WORK, envs="process"), CONSTANTS)
    assert overlapped["work_seconds"]["generate"] == pytest.approx(8.0)  # the envs' 1.2 s hide behind it


def test_bad_workload_is_one_line():
    with pytest.raises(ConfigError, match="--turns must be > 0"):
        plan.estimate(dataclasses.replace(WORK, turns=0), CONSTANTS)


def test_cli_plans_a_cluster_round_with_published_figures(capsys):
    argv = [
        "plan",
        "--model-params",
        "7e9",
        "--gpus",
        "8",
        "--tasks",
        "512",
        "--group-size",
        "8",
        "--turns",
        "20",
    ]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["constants"]["source"].startswith("published") and out["workload"]["envs"] == "process"
    assert out["gpu_hours"] == pytest.approx(8 * out["round_seconds"] / 3600) and out["round_seconds"] > 0
    text = capsys.readouterr().out if main(argv) == 0 else ""
    assert "GPU-hours per round" in text and "weights per GPU: 13.0 GiB (bf16)" in text


def test_cli_on_the_cpu_needs_measured_constants(tmp_path, capsys):
    assert main(["plan", "--model-params", "1e6", "--tasks", "4", "--turns", "5"]) == 2
    assert "fix: sdarflow plan --calibrate" in capsys.readouterr().err
    partial = tmp_path / "c.json"
    partial.write_text(json.dumps({"prefill_flops": 1.0}))
    assert (
        main(["plan", "--model-params", "1e6", "--tasks", "4", "--turns", "5", "--constants", str(partial)])
        == 2
    )
    assert "lacks decode_flops" in capsys.readouterr().err
    assert main(["plan", "--model-params", "1e6", "--gpus", "-1", "--tasks", "4", "--turns", "5"]) == 2
    assert "--gpus must be >= 0 (0: one CPU machine)" in capsys.readouterr().err


def test_calibrate_measures_a_real_model_and_plans_with_it(tiny_model, tmp_path, capsys):
    out = tmp_path / "constants.json"
    assert main(["plan", "--calibrate", str(tiny_model), "--device", "cpu", "--output", str(out)]) == 0
    constants = plan.Constants.load(out)
    rates = dataclasses.asdict(constants)
    assert all(math.isfinite(v) and v > 0 for k, v in rates.items() if k != "source")
    argv = [
        "plan",
        "--model-params",
        "1e6",
        "--tasks",
        "4",
        "--turns",
        "5",
        "--constants",
        str(out),
        "--json",
    ]
    capsys.readouterr()
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["workload"]["envs"] == "local"


def test_the_formulas_predict_this_machines_measured_demo_round():
    # bench/plan_check.py: constants calibrated here on the demo model, then a demo round measured stage by stage
    from bench.common import RESULTS

    check = json.loads((RESULTS / "plan_check.json").read_text())
    predicted = plan.estimate(plan.Workload(**check["workload"]), plan.Constants(**check["constants"]))
    ratio = sum(predicted["work_seconds"].values()) / sum(check["measured_seconds"].values())
    assert abs(ratio - 1) <= 0.3, ratio
