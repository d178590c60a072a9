"""``make gpu-check`` without a GPU: one line and exit 2; with ``--allow-cpu`` the same stage path runs end to end
at the smallest sizes (hf engine, torch training) and writes every key the GPU result has."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from bench import gpu_check
from sdarflow import plan


def test_without_a_gpu_it_says_so_in_one_line(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert gpu_check.main([]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: gpu-check needs an NVIDIA GPU") and "fix:" in err and "\n" not in err


def test_cpu_run_covers_every_stage_and_writes_the_result(tiny_model, tmp_path):
    shutil.copytree(tiny_model, tmp_path / "work" / "tiny")  # the smoke spec: build-model finds it up to date
    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(["--allow-cpu", "--work", str(tmp_path / "work"), "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    stages = {
        "build-model",
        "generate",
        "extract-skills",
        "rescore",
        "train",
        "generate-with-adapter",
        "evaluate",
        "plan-calibrate",
    }
    assert set(result["seconds"]) == stages == set(result["on_cuda"])
    assert plan.Constants.load(out).decode_flops > 0  # sdarflow plan --constants gpu_check.json
    assert result["device"] == "cpu" and result["generate_tokens_per_s"]["hf"] > 0
    assert result["train_tokens_per_s"] > 0 and result["model"]["parameters"] > 0
    assert {"machine", "total_seconds", "limit_seconds", "mfu"} <= result.keys()
    assert result["generate_engine"] == "hf" and result["on_cuda"]["build-model"] is None  # found up to date
    assert result["provenance"]["commit"] and result["provenance"]["command"]


def test_allow_cpu_never_replaces_the_committed_gpu_result(capsys):
    with pytest.raises(SystemExit):
        gpu_check.main(["--allow-cpu"])
    assert "--allow-cpu needs --out" in capsys.readouterr().err
