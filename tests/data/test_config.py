"""Stage configs: unknown keys, types, choices and cross-field checks fail with the fix; the hash ignores I/O."""

from __future__ import annotations

import pytest

from sdarflow.errors import ConfigError
from sdarflow.stages.generate import GenerateConfig
from sdarflow.stages.train import TrainConfig


def test_defaults_are_the_papers():
    cfg = TrainConfig()
    assert (cfg.method, cfg.lam, cfg.beta) == ("sdar", 0.01, 5.0)


def test_unknown_key_lists_valid_keys():
    with pytest.raises(ConfigError, match="unknown config key\\(s\\) lamda; valid keys: .*lam"):
        TrainConfig.from_dict({"lamda": 0.1})


def test_types_choices_and_cross_field_checks():
    with pytest.raises(ConfigError, match="lam = 'high' is not a valid float"):
        TrainConfig.from_dict({"lam": "high"})
    with pytest.raises(ConfigError, match="method = 'ppo' is not one of grpo, opsd"):
        TrainConfig.from_dict({"method": "ppo"})
    with pytest.raises(ConfigError, match="group_size \\(1\\) must be >= 2: GRPO normalizes within a group"):
        GenerateConfig.from_dict({"group_size": 1})


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text("lam: 0.05\nlora_targets: [q_proj, v_proj]\n")
    cfg = TrainConfig.load(path, beta="2.5", lam=None)
    assert cfg.lam == 0.05 and cfg.beta == 2.5 and cfg.lora_targets == ["q_proj", "v_proj"]
    path.write_text("- not a mapping\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        TrainConfig.load(path)


def test_hash_ignores_io_but_not_settings():
    a = TrainConfig(input=["a"], output="x")
    assert a.config_hash() == TrainConfig(input=["b"], output="y").config_hash()
    assert a.config_hash() != TrainConfig(lam=0.02).config_hash()
