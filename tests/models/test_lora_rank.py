"""One LoRA-rank rule for rollouts, intake and serving: the largest of ``r`` and ``rank_pattern``, rounded up to a
value vLLM's --max-lora-rank accepts."""

from __future__ import annotations

import json
import shutil

import pytest

from sdarflow.errors import ModelError
from sdarflow.models.identity import lora_rank, max_lora_rank
from sdarflow.rollout.vllm_engine import adapter_rank


@pytest.mark.parametrize(
    ("config", "rank"),
    [
        ({"r": 8}, 8),
        ({"r": 8, "rank_pattern": {"q_proj": 32, "v_proj": 4}}, 32),
        ({"r": 0}, None),
        ({"r": True}, None),  # a bool is not a rank
        ({}, None),
    ],
)
def test_lora_rank_is_the_largest_declared(config, rank):
    assert lora_rank(config) == rank


@pytest.mark.parametrize(("ranks", "flag"), [([1], 1), ([2], 8), ([8, 9], 16), ([300], 320), ([512], 512)])
def test_max_lora_rank_rounds_up_to_a_vllm_value(ranks, flag):
    assert max_lora_rank(ranks) == flag


def test_a_rank_above_vllms_maximum_is_refused():
    with pytest.raises(ModelError, match="above vLLM's maximum 512.*fix: train the adapter with a smaller r"):
        max_lora_rank([513])


def test_the_vllm_engine_reads_rank_pattern(lora_adapter, tiny_model, tmp_path):
    adapter = tmp_path / "patterned"
    shutil.copytree(lora_adapter, adapter)
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert adapter_rank(str(adapter), str(tiny_model)) == config["r"] == 8
    config["rank_pattern"] = {"q_proj": 16}
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    assert adapter_rank(str(adapter), str(tiny_model)) == 16
