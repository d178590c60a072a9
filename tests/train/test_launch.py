"""Multi-GPU launch: when the stage re-launches itself, and the torchrun command it builds (no GPU here, so the
launch itself is not run)."""

from __future__ import annotations

import os

import pytest

from sdarflow.errors import ConfigError
from sdarflow.stages.train import TrainConfig, run
from sdarflow.train.launch import ensure_process_group_env, launcher_command, should_relaunch


def test_relaunch_only_with_several_gpus_deepspeed_and_no_launcher():
    assert should_relaunch("deepspeed", device_count=4, env={})
    assert not should_relaunch("deepspeed", device_count=1, env={})
    assert not should_relaunch("deepspeed", device_count=0, env={})
    # Inside torchrun/deepspeed workers LOCAL_RANK is set: never launch again (that would recurse).
    assert not should_relaunch("deepspeed", device_count=4, env={"LOCAL_RANK": "0"})
    # The torch engine has no gradient sync across processes: it stays on one GPU.
    assert not should_relaunch("torch", device_count=4, env={})


def test_launcher_command_runs_the_train_cli_once_per_gpu():
    cmd = launcher_command("/tmp/cfg/train.yaml", nproc=8, master_port=29511, python="/venv/bin/python")
    assert cmd == [
        "/venv/bin/python",
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=8",
        "--master-port=29511",
        "-m",
        "sdarflow.cli",
        "train",
        "--config",
        "/tmp/cfg/train.yaml",
    ]


def test_the_config_file_rebuilds_the_same_config(tmp_path):
    import yaml

    cfg = TrainConfig(
        input=["a", "b"], model="m", output="o", engine="deepspeed", zero_stage=3, lora_targets=["q_proj"]
    )
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(cfg.to_dict()))
    assert TrainConfig.load(path) == cfg


def test_single_process_env_is_filled_only_without_a_launcher(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, "")  # records the original value, so the test's changes are undone
        monkeypatch.delenv(key)
    ensure_process_group_env()
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"]) == ("0", "1", "0")
    assert int(os.environ["MASTER_PORT"]) > 0
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    ensure_process_group_env()
    assert os.environ["RANK"] == "3"


def test_torch_engine_refuses_to_run_as_one_of_several_workers(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="engine torch trains in one process.*--engine deepspeed"):
        run(TrainConfig(input=["x"], model="m", output="o", engine="torch"))
