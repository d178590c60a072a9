"""The EMA teacher: the update by hand, the average a run publishes (decay 0: the final student; 1: the start, or
the average the input adapter carries), and resuming from a checkpoint continues the same average."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from factories import adapter_weights
from safetensors.torch import load_file

from sdarflow.cli import main
from sdarflow.extensions.ema import EMA_DIR, PEFT_WEIGHTS, EmaWeights, ema_update


def test_ema_update_by_hand():
    avg, value = torch.tensor([1.0, 2.0]), torch.tensor([3.0, -2.0], requires_grad=True)
    out = ema_update(avg, value, 0.9)
    torch.testing.assert_close(out, torch.tensor([0.9 * 1 + 0.1 * 3, 0.9 * 2 + 0.1 * -2]))  # [1.2, 1.4]
    assert not out.requires_grad
    torch.testing.assert_close(ema_update(avg, value, 0.0), value.detach())
    torch.testing.assert_close(ema_update(avg, value, 1.0), avg)


def test_the_average_follows_the_student_step_by_step():
    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(0.0)
    ema = EmaWeights(model, decay=0.5)  # starts at the weights: 0
    for value in (1.0, 1.0, 3.0):
        with torch.no_grad():
            model.weight.fill_(value)
        ema.update()
    # 0 -> 0.5 -> 0.75 -> 0.5 * 0.75 + 0.5 * 3 = 1.875
    torch.testing.assert_close(ema.average["weight"], torch.full((1, 2), 1.875))


def test_a_rollback_restores_the_average_it_kept(tmp_path):
    from sdarflow.extensions.format_probe import Rollback
    from sdarflow.train.engine import make_engine

    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(0.0)
    engine = make_engine("torch", model, lr=1e-3, max_grad_norm=1.0, zero_stage=0)
    ema = EmaWeights(model, decay=0.5)
    rollback = Rollback(engine, tmp_path / "rollback", ema)
    rollback.keep(0)  # weights 0, average 0
    for value in (4.0, 8.0):  # two steps the probe later rejects: the average goes 0 -> 2 -> 5
        with torch.no_grad():
            model.weight.fill_(value)
        ema.update()
    assert rollback.restore() == 0
    torch.testing.assert_close(model.weight.detach(), torch.zeros(1, 2))
    torch.testing.assert_close(ema.average["weight"], torch.zeros(1, 2))
    ema.update()  # the update after the rollback's step adds the restored weights: still 0, not 0.5 * 5
    torch.testing.assert_close(ema.average["weight"], torch.zeros(1, 2))


def _ema_weights(adapter: str) -> dict[str, torch.Tensor]:
    return load_file(str(Path(adapter) / EMA_DIR / PEFT_WEIGHTS))


def _train(rescored, tiny_model, out, *flags) -> int:
    argv = [
        "train",
        "--input",
        rescored,
        "--model",
        str(tiny_model),
        "--output",
        str(out),
        "--max-steps",
        "2",
    ]
    return main([*argv, "--lr", "1e-2", *flags])


def test_a_run_publishes_its_average_beside_the_adapter(tiny_model, rescored, tmp_path):
    assert _train(rescored, tiny_model, tmp_path / "d0", "--ema-decay", "0") == 0
    assert not (tmp_path / "d0" / EMA_DIR).exists()  # 0 = off
    # decay 1 keeps the weights the round started with: a new LoRA's (B = 0)
    assert _train(rescored, tiny_model, tmp_path / "d1", "--ema-decay", "1") == 0
    start = _ema_weights(str(tmp_path / "d1"))
    student = adapter_weights(str(tmp_path / "d1"))
    assert start.keys() == student.keys()
    assert all(float(v.abs().max()) == 0 for k, v in start.items() if "lora_B" in k)
    assert any(float(v.abs().max()) > 0 for k, v in student.items() if "lora_B" in k)
    # an adapter listed in the manifest like any file, and the run records its decay
    summary = json.loads((tmp_path / "d1" / "train_summary.json").read_text())
    assert summary["objective"]["ema_decay"] == 1.0
    # decay ~0: the average is the final student
    assert _train(rescored, tiny_model, tmp_path / "d", "--ema-decay", "1e-9") == 0
    final, avg = adapter_weights(str(tmp_path / "d")), _ema_weights(str(tmp_path / "d"))
    assert max(float((final[k] - avg[k]).abs().max()) for k in final) < 1e-6


def test_the_next_round_continues_the_adapters_average(tiny_model, rescored, tmp_path):
    assert _train(rescored, tiny_model, tmp_path / "r0", "--ema-decay", "1") == 0
    assert (
        _train(rescored, tiny_model, tmp_path / "r1", "--ema-decay", "1", "--adapter", str(tmp_path / "r0"))
        == 0
    )
    carried, now = _ema_weights(str(tmp_path / "r0")), _ema_weights(str(tmp_path / "r1"))
    # round 1 starts from round 0's student, but decay 1 keeps the average it was handed: round 0's start
    assert carried.keys() == now.keys() and all(torch.equal(carried[k], now[k]) for k in carried)


def test_resume_continues_the_same_average(tiny_model, rescored, tmp_path):
    flags = ["--ema-decay", "0.5", "--deterministic", "--max-steps", "4", "--save-every", "2"]
    assert _train(rescored, tiny_model, tmp_path / "whole", *flags) == 0
    ckpt = tmp_path / "ckpt"
    # stop after step 2 (its checkpoint written), then rerun the full run on the same folder
    assert _train(rescored, tiny_model, tmp_path / "half", *flags[:-4], "--max-steps", "2", "--save-every", "2",
                  "--checkpoint-dir", str(ckpt)) == 0  # fmt: skip
    assert _train(rescored, tiny_model, tmp_path / "resumed", *flags, "--checkpoint-dir", str(ckpt)) == 0
    whole, resumed = _ema_weights(str(tmp_path / "whole")), _ema_weights(str(tmp_path / "resumed"))
    assert all(torch.equal(whole[k], resumed[k]) for k in whole)


@pytest.mark.parametrize("flags", [["--lora-rank", "0"], ["--engine", "deepspeed", "--zero-stage", "3"]])
def test_ema_needs_a_lora_every_rank_holds(tiny_model, rescored, tmp_path, capsys, flags):
    assert _train(rescored, tiny_model, tmp_path / "x", "--ema-decay", "0.9", *flags) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--ema-decay averages LoRA weights" in err[0] and "fix:" in err[0]
