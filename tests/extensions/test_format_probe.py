"""The format guard's per-step probe on a real model and real TextWorld prompts: the sample it answers, its rate
before and after the weights break, what each guard mode does on the spike, and the train stage failing (or
repairing) a round whose policy collapses between two steps."""

from __future__ import annotations

import json
import logging

import pyarrow as pa
import pytest
import torch
from factories import adapter_weights, metrics_lines, rescored_table

from sdarflow import storage
from sdarflow.cli import main
from sdarflow.extensions.format_probe import (
    AFTER_KEY,
    AFTER_ROLLBACK_KEY,
    LINEAGE_KEY,
    PROBE_KEY,
    PROBES,
    REMEDY_KEY,
    REMEDY_STEPS,
    ROLLBACK_KEY,
    FormatProbe,
    Rollback,
    probe_rows,
)
from sdarflow.schema import RESCORED_SCHEMA
from sdarflow.train.format_guard import FormatCollapse
from sdarflow.train.schedule import TrainState


@pytest.fixture(scope="module")
def expert_prompts(tiny_model) -> list[list[int]]:
    """The student prompts of the smoke games' walkthrough steps: the tiny model answers them well formed."""
    from sdarflow.models import load_policy
    from sdarflow.rollout.prompt import build_messages, encode_prompt
    from sdarflow.train.warmstart import expert_steps

    tokenizer = load_policy(str(tiny_model)).tokenizer
    steps, _ = expert_steps("textworld-cooking", 3)
    return [
        encode_prompt(tokenizer, build_messages(s.instruction, s.actions, s.observation, 2)) for s in steps
    ]


def _rows(prompts: list[list[int]]) -> list[dict]:
    return [
        {"env": "textworld-cooking", "group_id": f"g{i % 2}", "traj_id": f"e{i}", "turn": i,
         "prompt_token_ids": p, "response_token_ids": [5, 6]}
        for i, p in enumerate(prompts)
    ]  # fmt: skip


def test_probe_rows_are_evenly_spaced_rows_with_a_response():
    rows = [
        {"group_id": "g", "traj_id": f"e{i:02d}", "turn": 0, "response_token_ids": [1]} for i in range(40)
    ]
    rows[3]["response_token_ids"] = []  # no response: never probed
    picked = probe_rows(rows, n=4)
    # 39 rows with a response, in (group, episode, turn) order: indices 0, 9, 19, 29 of them
    assert [r["traj_id"] for r in picked] == ["e00", "e10", "e20", "e30"]
    assert probe_rows(rows[:5], n=PROBES) == [r for r in rows[:5] if r["response_token_ids"]]


def _broken(model, trainable_only: bool = False) -> None:
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad or not trainable_only:
                p.add_(torch.randn_like(p) * 0.5)


@pytest.mark.parametrize("mode", ["fail", "warn", "repair"])
def test_a_spike_between_steps_fails_warns_or_takes_the_remedy(tiny_model, expert_prompts, mode, caplog):
    from sdarflow.models import load_policy

    policy = load_policy(str(tiny_model))
    policy.model.train()  # as the trainer has it
    taken = []

    def remedy(state) -> dict:
        taken.append(state.step)
        return {"loss/total": 1.5}

    probe = FormatProbe(_rows(expert_prompts), policy.tokenizer, policy.eos_id, mode, every=2, remedy=remedy)
    state = TrainState(step=2)
    assert probe.start(policy.model, state, []) == {"format/start_probe_error_rate": 0.0}
    assert state.probe_rates == [0.0]  # the smoke model answers its walkthrough prompts well formed
    record = {"step": 1}
    probe.after_step(policy.model, state, record)  # not a probe step
    assert PROBE_KEY not in record and state.probe_rates == [0.0]
    _broken(policy.model)
    record = {"step": 2}
    if mode == "fail":
        with pytest.raises(
            FormatCollapse, match=r"format collapse at step 2: 100.0% of 12 probe answers.*fix:"
        ):
            probe.after_step(policy.model, state, record)
        return
    with caplog.at_level(logging.WARNING):
        probe.after_step(policy.model, state, record)
    assert record[PROBE_KEY] == 1.0 and "format collapse at step 2" in caplog.text
    if mode == "warn":
        assert taken == [] and REMEDY_KEY not in record and state.probe_rates == [0.0, 1.0]
    else:  # the remedy (here: one that cannot mend the broken weights) runs until its limit, each step re-probed
        assert taken == [2] * REMEDY_STEPS and record[REMEDY_KEY] == REMEDY_STEPS and record[AFTER_KEY] == 1.0
        assert record["format/remedy_loss"] == 1.5 and state.probe_rates == [0.0] + [1.0] * (1 + REMEDY_STEPS)
    assert policy.model.training  # the probe restores the mode it found


def test_the_remedy_stops_once_the_probe_recovers(tiny_model, expert_prompts):
    from sdarflow.models import load_policy

    policy = load_policy(str(tiny_model))
    saved = {k: v.clone() for k, v in policy.model.state_dict().items()}

    def remedy(state) -> dict:  # one that mends: the weights from before the break
        policy.model.load_state_dict(saved)
        return {"loss/total": 0.5}

    probe = FormatProbe(
        _rows(expert_prompts), policy.tokenizer, policy.eos_id, "repair", every=1, remedy=remedy
    )
    state = TrainState()
    probe.start(policy.model, state, [])
    _broken(policy.model)
    record = {"step": 1}
    probe.after_step(policy.model, state, record)
    assert (record[PROBE_KEY], record[REMEDY_KEY], record[AFTER_KEY]) == (1.0, 1, 0.0)
    assert state.probe_rates == [0.0, 1.0, 0.0]
    # a round that starts collapsed, against its lineage's clean probes: repaired before its first step
    _broken(policy.model)
    state = TrainState()
    start = probe.start(policy.model, state, [0.0, 0.05])
    assert start["format/start_probe_error_rate"] == 1.0 and start["format/start_remedy_steps"] == 1
    assert state.probe_rates == [0.0, 0.05, 1.0, 0.0]
    assert probe.start(policy.model, state, [0.0]) == {}  # resumed: the start probe was taken


def test_every_rank_acts_on_the_rate_over_all_ranks_answers(tiny_model, expert_prompts):
    from sdarflow.models import load_policy

    policy = load_policy(str(tiny_model))
    other_rank = {"bad": 12.0, "answers": 12.0}  # a second rank whose 12 answers all failed to parse

    def reduce_sum(counts: dict) -> dict:
        return {k: v + other_rank[k] for k, v in counts.items()}

    probe = FormatProbe(
        _rows(expert_prompts), policy.tokenizer, policy.eos_id, "warn", 1, reduce_sum=reduce_sum
    )
    assert len(probe.rows) == 12 and probe.rate(policy.model) == (0 + 12) / (12 + 12)


def _optimizer_step(engine, prompt: list[int]) -> None:
    loss = engine.model(input_ids=torch.tensor([prompt])).logits.float().mean()
    engine.backward(loss)
    engine.step(1e-3)


def test_a_spike_the_remedy_does_not_mend_rolls_back_to_the_last_good_probe(
    tiny_model, expert_prompts, tmp_path, caplog
):
    import copy

    from sdarflow.models import load_policy
    from sdarflow.models.policy import new_lora
    from sdarflow.train.engine import make_engine

    policy = load_policy(str(tiny_model), trainable=True)
    torch.manual_seed(0)
    linear = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    model = new_lora(policy.model, 4, 8, linear)
    engine = make_engine("torch", model, lr=1e-3, max_grad_norm=1.0, zero_stage=0)
    _optimizer_step(engine, expert_prompts[0])  # the optimizer has moments to roll back
    rollback = Rollback(engine, tmp_path / "rollback")
    probe = FormatProbe(_rows(expert_prompts), policy.tokenizer, policy.eos_id, "repair", 1, None, rollback)
    state = TrainState()
    probe.start(model, state, [])
    assert state.probe_rates == [0.0] and rollback.step == 0  # a clean probe: the rollback target
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    good = {n: p.detach().clone() for n, p in trainable.items()}
    good_moments = copy.deepcopy(engine.optimizer.state_dict()["state"])
    _optimizer_step(engine, expert_prompts[1])
    _broken(model, trainable_only=True)  # as training breaks it: in the LoRA weights
    record = {"step": 1}
    with caplog.at_level(logging.WARNING):
        probe.after_step(model, state, record)
    # no remedy (no SFT stream): the spike rolls back to step 0, and the probe answers well formed again
    assert record[PROBE_KEY] > 0.5 and (record[ROLLBACK_KEY], record[AFTER_ROLLBACK_KEY]) == (0, 0.0)
    assert {REMEDY_KEY, AFTER_KEY}.isdisjoint(record) and state.probe_rates == [0.0, record[PROBE_KEY], 0.0]
    assert "rolled back to the weights of step 0: 0.0% after" in caplog.text
    assert all(torch.equal(trainable[n], good[n]) for n in good)
    moments = engine.optimizer.state_dict()["state"]
    assert all(torch.equal(moments[i]["exp_avg"], good_moments[i]["exp_avg"]) for i in good_moments)
    record = {"step": 2}
    probe.after_step(model, state, record)
    assert record[PROBE_KEY] == 0.0 and ROLLBACK_KEY not in record and rollback.step == 2


def _real_prompt_data(prompts: list[list[int]], uri: str) -> str:
    """The synthetic rescored rows with real TextWorld prompts in place of their random ones."""
    table = rescored_table()
    n = table.num_rows
    columns = {
        "prompt_token_ids": pa.array([prompts[i % len(prompts)] for i in range(n)], pa.list_(pa.int32())),
        "env": pa.array(["textworld-cooking"] * n),
    }
    for name, values in columns.items():
        table = table.set_column(table.schema.get_field_index(name), name, values)
    storage.write_table(table, uri, kind="rescored", schema=RESCORED_SCHEMA, config_hash="t", inputs=[])
    return uri


def test_train_fails_a_round_that_collapses_between_steps_and_repairs_it(
    tiny_model, expert_prompts, tmp_path, capsys
):
    data = _real_prompt_data(expert_prompts, str(tmp_path / "data"))
    # lr 5 wrecks the LoRA in one step: every probe answer after step 1 is malformed
    args = ["train", "--input", data, "--model", str(tiny_model), "--max-steps", "2", "--lr", "5"]
    failed = str(tmp_path / "failed")
    assert main([*args, "--format-probe-every", "1", "--format-guard", "fail", "--output", failed]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "format collapse at step 1:" in err and "fix:" in err
    assert not storage.is_published(failed)
    repaired = str(tmp_path / "repaired")
    assert main([*args, "--format-probe-every", "1", "--format-guard", "repair", "--output", repaired]) == 0
    lines = metrics_lines(repaired)
    # both steps break the format; the remedy's SFT steps do not mend it at this lr, so each rolls back to step 0
    assert [
        (x[PROBE_KEY] > 0.5, x[REMEDY_KEY], x[AFTER_KEY] > 0.5, x[ROLLBACK_KEY], x[AFTER_ROLLBACK_KEY])
        for x in lines
    ] == [(True, REMEDY_STEPS, True, 0, 0.0)] * 2
    summary = json.loads(storage.read_member(repaired, "train_summary.json"))
    assert summary["objective"]["format_probe_every"] == 1
    assert (summary["format/remedy_steps"], summary["format/rollbacks"]) == (2 * REMEDY_STEPS, 2)
    # the lineage keeps every probe, the first before any update, for the next round's baseline
    assert summary[LINEAGE_KEY][0] == 0.0 and len(summary[LINEAGE_KEY]) == 1 + 2 * (1 + REMEDY_STEPS + 1)
    assert summary["format/start_probe_error_rate"] == 0.0
    # what is published is the step-0 state, which answers well formed (LoRA B at its start, 0)
    assert summary[LINEAGE_KEY][-1] == 0.0
    weights = adapter_weights(repaired)
    lora_b = [w for name, w in weights.items() if "lora_B" in name]
    assert lora_b and not any(w.any() for w in lora_b)


def test_a_resumed_run_rolls_back_to_the_same_target(tiny_model, expert_prompts, tmp_path):
    data = _real_prompt_data(expert_prompts, str(tmp_path / "data"))
    # lr 5: every step breaks the format and rolls back to step 0's weights (the remedy cannot mend it)
    args = ["train", "--input", data, "--model", str(tiny_model), "--lr", "5", "--deterministic",
            "--format-probe-every", "1", "--format-guard", "repair", "--save-every", "2"]  # fmt: skip
    whole = str(tmp_path / "whole")
    assert main([*args, "--max-steps", "4", "--output", whole]) == 0
    ckpt = str(tmp_path / "ckpt")  # stop after step 2 (its checkpoint written), then rerun the full run on it
    assert (
        main([*args, "--max-steps", "2", "--checkpoint-dir", ckpt, "--output", str(tmp_path / "half")]) == 0
    )
    resumed = str(tmp_path / "resumed")
    assert main([*args, "--max-steps", "4", "--checkpoint-dir", ckpt, "--output", resumed]) == 0
    keys = (PROBE_KEY, REMEDY_KEY, ROLLBACK_KEY, AFTER_ROLLBACK_KEY)
    assert [[x.get(k) for k in keys] for x in metrics_lines(resumed)] == [
        [x.get(k) for k in keys] for x in metrics_lines(whole)
    ]
    assert [x[ROLLBACK_KEY] for x in metrics_lines(resumed)] == [0, 0, 0, 0]
    got, want = adapter_weights(resumed), adapter_weights(whole)
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_a_rollback_also_returns_the_ema_teacher_to_the_good_probe(tiny_model, expert_prompts, tmp_path):
    from safetensors.torch import load_file

    from sdarflow.extensions.ema import EMA_DIR, PEFT_WEIGHTS

    data = _real_prompt_data(expert_prompts, str(tmp_path / "data"))
    out = str(tmp_path / "out")
    # probes at steps 0 and 2: step 1 wrecks the LoRA unseen (the average takes half of it), step 2's probe rolls
    # both back to step 0, where the average was the start weights (LoRA B = 0). lr 50: at lr 5 one remedy step
    # can mend this model's format, and then nothing rolls back
    args = ["train", "--input", data, "--model", str(tiny_model), "--max-steps", "2", "--lr", "50", "--output", out,
            "--format-probe-every", "2", "--format-guard", "repair", "--ema-decay", "0.5"]  # fmt: skip
    assert main(args) == 0
    assert metrics_lines(out)[-1][ROLLBACK_KEY] == 0
    average = load_file(str(tmp_path / "out" / EMA_DIR / PEFT_WEIGHTS))
    lora_b = [w for name, w in average.items() if "lora_B" in name]
    assert lora_b and not any(w.any() for w in lora_b)


def test_a_value_warmup_round_passes_the_probe_lineage_on(tiny_model, expert_prompts, tmp_path):
    data = _real_prompt_data(expert_prompts, str(tmp_path / "data"))
    args = ["train", "--input", data, "--model", str(tiny_model), "--max-steps", "2",
            "--format-probe-every", "1"]  # fmt: skip
    grpo = str(tmp_path / "grpo")
    assert main([*args, "--output", grpo]) == 0
    rates = json.loads(storage.read_member(grpo, "train_summary.json"))[LINEAGE_KEY]
    assert len(rates) == 3  # the start probe and one after each step
    warm = str(tmp_path / "warm")  # FORCE turned on later: its warm-up round takes no step and probes nothing
    head = ["--filter", "negative-value", "--value-estimate", "head", "--value-warmup-rounds", "1"]
    assert main([*args, *head, "--adapter", grpo, "--output", warm]) == 0
    summary = json.loads(storage.read_member(warm, "train_summary.json"))
    assert summary["train/steps"] == 0.0 and summary[LINEAGE_KEY] == rates
    assert "format/start_probe_error_rate" not in summary


def test_the_probe_is_refused_under_zero3_and_named_when_it_does_nothing(
    tiny_model, rescored, tmp_path, capsys, caplog
):
    out = str(tmp_path / "a")
    args = ["train", "--input", rescored, "--model", str(tiny_model), "--output", out,
            "--format-probe-every", "1"]  # fmt: skip
    assert main([*args, "--engine", "deepspeed", "--zero-stage", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "ZeRO-3" in err and "fix: --zero-stage 2" in err
    assert not storage.is_published(out)
    with caplog.at_level(logging.WARNING):
        assert main([*args, "--format-guard", "off", "--max-steps", "1"]) == 0
    assert "--format-probe-every has no effect with --format-guard off" in caplog.text
