"""The DeepSpeed engine on CPU (ZeRO-2/3, fp32, gloo, one process): it trains the tiny model, agrees with the torch
engine although it accumulates over many more micro-batches, skips non-finite steps, and resumes exactly from a
checkpoint. Slow: each engine start takes several seconds (and the first one on a machine JIT-builds an op)."""

from __future__ import annotations

import dataclasses
import math
import shutil
from pathlib import Path

import pytest
import torch
from factories import metrics_lines, publish_rescored, rescored_table

from sdarflow import storage
from sdarflow.cli import main
from sdarflow.extensions.format_probe import Rollback
from sdarflow.models import load_policy
from sdarflow.models.policy import new_lora
from sdarflow.train.checkpoint import Checkpoints
from sdarflow.train.engine import DeepSpeedEngine, make_engine
from sdarflow.train.samples import make_samples
from sdarflow.train.schedule import WarmupConstant
from sdarflow.train.trainer import TrainData, TrainingDiverged, TrainLoop, train

pytestmark = pytest.mark.slow


def lora(tiny_model):
    policy = load_policy(str(tiny_model), trainable=True)
    torch.manual_seed(0)
    return new_lora(policy.model, 4, 8, ["q_proj", "v_proj"]), policy.tokenizer.pad_token_id


def weights(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone().float() for n, p in model.named_parameters() if p.requires_grad}


def diff(a: dict, b: dict) -> float:
    return max(float((a[n] - b[n]).abs().max()) for n in a)


def test_deepspeed_trains_agrees_with_torch_skips_nonfinite_and_resumes(tiny_model, tmp_path):
    rows = rescored_table(n_groups=2, group_size=4, prompt_len=12).to_pylist()
    schedule = WarmupConstant(1e-2)
    hp_one = TrainLoop(method="sdar", sdar_coef=0.5, mini_batches=2, max_steps=4, micro_batch_tokens=100_000)
    hp_split = TrainLoop(
        method="sdar", sdar_coef=0.5, mini_batches=2, max_steps=4, micro_batch_tokens=1, save_every=2
    )

    model, pad = lora(tiny_model)
    before = weights(model)
    data = TrainData(make_samples(rows), [], pad)
    torch_state = train(make_engine("torch", model, lr=1e-2, max_grad_norm=1.0), data, hp_one, schedule)
    w_torch = weights(model)

    model, _ = lora(tiny_model)
    engine = make_engine("deepspeed", model, lr=1e-2, max_grad_norm=1.0, zero_stage=2)
    assert isinstance(engine, DeepSpeedEngine)
    ckpt = Checkpoints(tmp_path / "ck", "ds-run")
    ds_state = train(engine, data, hp_split, schedule, on_checkpoint=lambda s: ckpt.save(engine, s, {}))
    w_ds = weights(model)

    assert diff(w_ds, before) > 1e-3  # the adapter moved
    assert all(math.isfinite(h["loss/total"]) and not h["skipped"] for h in ds_state.history)
    # 4 steps of 8 single-sample micro-batches each vs one micro-batch a step: the same update, up to rounding
    # (which Adam amplifies on near-zero gradient entries, hence relative to the size of the update)
    assert diff(w_ds, w_torch) < 1e-2 * diff(w_torch, before)
    for a, b in zip(ds_state.history, torch_state.history):
        assert a["loss/total"] == pytest.approx(b["loss/total"], abs=1e-5)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)

    # non-finite steps: skipped (weights untouched), counted, then the run fails
    bad = [dict(r, old_logprobs=[float("nan")] * len(r["old_logprobs"])) for r in rows]
    hp_bad = TrainLoop(method="grpo", mini_batches=1, max_steps=5, max_nonfinite_steps=2)
    with pytest.raises(TrainingDiverged, match="2 consecutive non-finite steps"):
        train(engine, TrainData(make_samples(bad), [], pad), hp_bad, schedule)
    assert diff(weights(model), w_ds) == 0.0

    # a fresh engine resumed from the step-2 checkpoint ends where the uninterrupted run ended
    assert [s for s, _ in ckpt.complete()] == [2, 4]
    shutil.rmtree(tmp_path / "ck" / "step-00000004")  # as if killed between step 2 and 4
    model, _ = lora(tiny_model)
    engine = make_engine("deepspeed", model, lr=1e-2, max_grad_norm=1.0, zero_stage=2)
    state = Checkpoints(tmp_path / "ck", "ds-run").restore(engine)
    assert state.step == 2
    state = train(engine, data, hp_split, schedule, state=state)
    assert diff(weights(model), w_ds) <= 1e-6

    # the format guard's rollback (engine.save / load): two more steps undone, back to the weights kept at step 4
    rollback = Rollback(engine, tmp_path / "rollback")
    rollback.keep(state.step)
    train(engine, data, dataclasses.replace(hp_split, max_steps=6, save_every=0), schedule, state=state)
    assert diff(weights(model), w_ds) > 1e-4
    assert rollback.restore() == 4 and diff(weights(model), w_ds) <= 1e-6


def test_zero3_through_the_cli_publishes_a_trained_adapter(tiny_model, tmp_path):
    from safetensors.torch import load_file

    data = str(tmp_path / "data")
    publish_rescored(data, n_groups=2, prompt_len=12)
    out = str(tmp_path / "adapter")
    args = ["train", "--input", data, "--model", str(tiny_model), "--output", out, "--mini-batches", "2"]
    assert main([*args, "--engine", "deepspeed", "--zero-stage", "3", "--lr", "1e-2"]) == 0
    assert storage.read_manifest(out, "adapter")
    tensors = load_file(str(Path(out, "adapter_model.safetensors")))
    lora_b = [t for k, t in tensors.items() if "lora_B" in k]
    # gathered before saving: full shapes (ZeRO-3 partitions leave empty tensors), and B moved off its zero init
    assert lora_b and all(t.numel() > 0 for t in tensors.values())
    assert max(float(t.abs().max()) for t in lora_b) > 0
    assert [x["step"] for x in metrics_lines(out)] == [1, 2]
