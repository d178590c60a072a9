"""Stage configs: unknown keys, types, choices and cross-field checks fail with the fix; the hash ignores I/O."""

from __future__ import annotations

import pytest

from sdarflow.errors import ConfigError
from sdarflow.stages.evaluate import EvaluateConfig
from sdarflow.stages.generate import GenerateConfig
from sdarflow.stages.train import TrainConfig


def test_defaults_are_the_papers():
    cfg = TrainConfig()
    assert (cfg.method, cfg.sdar_coef, cfg.gate_beta) == ("sdar", 0.01, 5.0)


def test_unknown_key_lists_valid_keys():
    with pytest.raises(ConfigError, match="unknown config key\\(s\\) gate_bta; valid keys: .*gate_beta"):
        TrainConfig.from_dict({"gate_bta": 0.1})


def test_types_choices_and_cross_field_checks():
    with pytest.raises(ConfigError, match="sdar_coef = 'high' is not a valid float"):
        TrainConfig.from_dict({"sdar_coef": "high"})
    with pytest.raises(ConfigError, match="method = 'ppo' is not one of grpo, opsd"):
        TrainConfig.from_dict({"method": "ppo"})
    with pytest.raises(
        ConfigError, match=r"group_size = 1 must be >= 2 \(G rollouts .*fix: set group_size to"
    ):
        GenerateConfig.from_dict({"group_size": 1})


@pytest.mark.parametrize(
    ("cls", "values", "message"),
    [
        (TrainConfig, {"lr": -1}, r"train: lr = -1.0 must be > 0 .*; fix: set lr to a value > 0$"),
        (TrainConfig, {"lr": "nan"}, "lr = nan must be a finite number"),
        (TrainConfig, {"micro_batch_tokens": 0}, "micro_batch_tokens = 0 must be >= 1"),
        (TrainConfig, {"max_grad_norm": -1}, "max_grad_norm = -1.0 must be >= 0"),
        (TrainConfig, {"epochs": True}, "epochs = True is not a valid int"),
        (GenerateConfig, {"batch_size": 0}, "batch_size = 0 must be >= 1"),
        (GenerateConfig, {"max_turns": -1}, "max_turns = -1 must be >= 0"),
        (GenerateConfig, {"temperature": -1}, "temperature = -1.0 must be > 0"),
        (GenerateConfig, {"top_p": 1.5}, r"top_p = 1.5 must be in \(0, 1\]"),
        (GenerateConfig, {"tasks": 1.9}, "tasks = 1.9 is not a whole number"),
        (GenerateConfig, {"tasks": "1.9"}, "tasks = '1.9' is not a valid int"),
        (EvaluateConfig, {"temperature": -1}, "temperature = -1.0 must be >= 0"),
        (EvaluateConfig, {"samples": 0}, "samples = 0 must be >= 1"),
        (TrainConfig, {1: 0.1}, r"unknown config key\(s\) 1; valid keys"),
    ],
)
def test_out_of_range_values_are_one_line(cls, values, message):
    with pytest.raises(ConfigError, match=message) as err:
        cls.from_dict(values)
    assert "\n" not in str(err.value)


def test_integral_floats_are_integers():
    """A KFP parameter carries a whole number as a float (8.0): it is the integer, never a truncated one."""
    assert GenerateConfig.from_dict({"tasks": 8.0}).tasks == 8
    assert EvaluateConfig.from_dict({"temperature": 0}).temperature == 0.0  # greedy evaluation is allowed


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text("sdar_coef: 0.05\nlora_targets: [q_proj, v_proj]\n")
    cfg = TrainConfig.load(path, gate_beta="2.5", sdar_coef=None)
    assert cfg.sdar_coef == 0.05 and cfg.gate_beta == 2.5 and cfg.lora_targets == ["q_proj", "v_proj"]
    path.write_text("- not a mapping\n")
    with pytest.raises(
        ConfigError, match="must hold a mapping of keys to values; fix: write it as `key: value`"
    ):
        TrainConfig.load(path)


def test_a_missing_required_setting_names_its_flag_and_the_fix():
    from sdarflow.stages.common import require

    with pytest.raises(
        ConfigError, match=r"^train: --model is required; fix: pass --model \(or set model in"
    ):
        require("train", input=["x"], model="")


def test_hash_ignores_io_but_not_settings():
    a = TrainConfig(input=["a"], output="x")
    assert a.config_hash() == TrainConfig(input=["b"], output="y").config_hash()
    assert a.config_hash() != TrainConfig(sdar_coef=0.02).config_hash()


def test_one_validation_for_settings_and_file_schemas():
    """Checked: bounds reach every number in a mapping, ``keys`` bounds a mapping's keys, a nested schema's
    refusal names its path, and a strict (file) schema takes no text for a number."""
    from sdarflow.evaluate.metrics import EvalReport
    from sdarflow.registry.gate import GatePolicy

    with pytest.raises(ConfigError, match=r"^gate: floor = 1.5 must be in \[0, 1\]"):
        GatePolicy(floor=1.5)
    report = {"splits": {"test": {"pass_at_k": {"1": 0.5, "2": 1.5}}}, "anything": "kept"}
    with pytest.raises(ConfigError, match=r"^splits.test: pass_at_k.2 = 1.5 must be in \[0, 1\]"):
        EvalReport.from_dict(report)
    report["splits"]["test"]["pass_at_k"]["2"] = "0.9"
    with pytest.raises(ConfigError, match=r"splits.test: pass_at_k.2 = '0.9' is not a valid float"):
        EvalReport.from_dict(report)
    report["splits"]["test"]["pass_at_k"]["2"] = 0.9
    assert EvalReport.from_dict(report).splits["test"].pass_at_k == {"1": 0.5, "2": 0.9}
    from sdarflow.pipeline_config import PipelineConfig

    with pytest.raises(ConfigError, match="stage_settings: unknown key"):
        PipelineConfig.from_dict({"stage_settings": {"trian": {}}})
