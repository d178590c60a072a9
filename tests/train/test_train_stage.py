"""The train stage through the CLI: published adapter with metrics and reports, full fine-tune, SFT warm start,
config errors, and a real SIGKILL + resume that ends with the same adapter as an uninterrupted run."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
from pathlib import Path

import pyarrow as pa
import pytest
import torch
from factories import adapter_weights, cli, max_abs_diff, metrics_lines, publish_rescored, rescored_table

from sdarflow import storage
from sdarflow.cli import main
from sdarflow.schema import RESCORED_SCHEMA
from sdarflow.train.trainer import REQUIRED_METRICS


def train_cli(*argv: str) -> int:
    return main(["train", *argv])


def test_train_publishes_adapter_metrics_and_reports(tiny_model, rescored, tmp_path):
    out = str(tmp_path / "adapter")
    args = ["--input", rescored, "--model", str(tiny_model), "--output", out]
    assert (
        train_cli(*args, "--mini-batches", "2", "--sft-ratio", "0.5", "--warmup-steps", "2", "--lr", "1e-3")
        == 0
    )
    manifest = storage.read_manifest(out, "adapter")
    files = {f["path"] for f in manifest["files"]}
    assert {
        "adapter_model.safetensors",
        "metrics.jsonl",
        "report.html",
        "report.md",
        "train_summary.json",
    } <= files
    lines = metrics_lines(out)
    assert [x["step"] for x in lines] == [1, 2, 3]
    assert [x["kind"] for x in lines] == ["rl", "rl", "sft"]
    assert [x["lr"] for x in lines] == [5e-4, 1e-3, 1e-3]  # 2 warmup steps, then constant
    for line in lines:
        assert set(REQUIRED_METRICS) | {"step", "grad_norm", "lr", "tokens_per_s"} <= line.keys()
        assert line["grad_norm"] > 0 and line["tokens_per_s"] > 0
    assert manifest["metrics"]["train/steps"] == 3.0 and manifest["metrics"]["train/sft_steps"] == 1.0
    assert "data:image/png;base64," in Path(out, "report.html").read_text()


def test_full_fine_tune_publishes_a_loadable_model(tiny_model, rescored, tmp_path):
    from safetensors.torch import load_file

    from sdarflow.models import load_policy

    out = str(tmp_path / "full")
    assert (
        train_cli("--input", rescored, "--model", str(tiny_model), "--output", out, "--lora-rank", "0") == 0
    )
    assert storage.read_manifest(out)["kind"] == "model"
    base = load_file(str(tiny_model / "model.safetensors"))
    tuned = load_file(str(Path(out, "model.safetensors")))
    assert max(float((base[k] - tuned[k]).abs().max()) for k in base if k in tuned) > 0
    policy = load_policy(out)  # a complete HF folder: config, weights, tokenizer
    assert policy.tokenizer.eos_token_id == load_policy(str(tiny_model)).tokenizer.eos_token_id


def test_a_bf16_base_trains_a_float32_lora_that_tracks_the_float32_runs(tiny_model, rescored, tmp_path):
    """--precision bf16 (what auto is on a GPU) loads the frozen base in bf16; the LoRA weights still train and
    publish in float32, and move as a float32 base's do, up to bf16's rounding."""
    runs = {}
    for precision in ("bf16", "fp32"):
        out = str(tmp_path / precision)
        args = ["--input", rescored, "--model", str(tiny_model), "--output", out, "--lr", "1e-2"]
        assert train_cli(*args, "--precision", precision, "--seed", "3") == 0
        summary = json.loads(Path(out, "train_summary.json").read_text())
        assert summary["weights_dtype"] == {"fp32": "float32", "bf16": "bfloat16"}[precision]
        runs[precision] = adapter_weights(out)
    assert {t.dtype for t in runs["bf16"].values()} == {torch.float32}
    # lora_B starts at zero, so its weights are the whole update: the same direction, not the same bits
    bf16, fp32 = (torch.cat([v.flatten() for k, v in sorted(runs[p].items()) if "lora_B" in k]) for p in runs)
    assert torch.nn.functional.cosine_similarity(bf16, fp32, dim=0) > 0.98 and not torch.equal(bf16, fp32)


@pytest.mark.parametrize(
    ("engine", "rank"),
    [("torch", "8"), pytest.param("deepspeed", "8", marks=pytest.mark.slow), ("torch", "0")],
)
def test_a_carried_optimizer_makes_two_rounds_one_run(tiny_model, tmp_path, capsys, engine, rank):
    """--carry-optimizer: two rounds of 2 steps, the second continuing the first's adapter and AdamW state, end
    with the weights of one 4-step run on the same rows (one mini-batch a step, so the rounds' steps are the run's);
    without it the second round's AdamW starts over and they do not. DeepSpeed gathers the moments from ZeRO's
    partitions and scatters them back. With --lora-rank 0 the second round continues the first's full fine-tune,
    given where an adapter goes (its output records the base it descends from, so a third could continue it), and
    a LoRA rank with a full fine-tune as the adapter is refused in one line."""
    from safetensors.torch import load_file

    from sdarflow.models.identity import BASE_FILE, base_fingerprint

    data = publish_rescored(str(tmp_path / "data"), prompt_len=32)
    common = [
        "--input",
        data,
        "--model",
        str(tiny_model),
        "--mini-batches",
        "1",
        "--lr",
        "1e-2",
        "--seed",
        "3",
    ]
    common += [
        "--method",
        "sdar",
        "--deterministic",
        "--carry-optimizer",
        "--engine",
        engine,
        "--lora-rank",
        rank,
    ]
    kind, weights = (
        ("model", "model.safetensors") if rank == "0" else ("adapter", "adapter_model.safetensors")
    )

    def run(name: str, steps: int, *flags: str) -> dict[str, torch.Tensor]:
        out = tmp_path / name
        assert train_cli(*common, "--output", str(out), "--max-steps", str(steps), *flags) == 0
        assert storage.read_manifest(str(out))["kind"] == kind
        assert json.loads((out / BASE_FILE).read_text())["fingerprint"] == base_fingerprint(str(tiny_model))
        return load_file(str(out / weights))

    one = run("one", 4)
    run("a", 2)
    assert torch.load(tmp_path / "a" / "optimizer.pt", weights_only=True)["steps"] == 2
    carried = run("b", 2, "--adapter", str(tmp_path / "a"))
    # every weight of a full fine-tune moves: its rounds agree to float32 rounding (measured 1.5e-6, where the same
    # run twice is bit-identical), a restart's AdamW differs by over 1e-4
    assert max_abs_diff(carried, one) <= (1e-5 if rank == "0" else 1e-6)
    restarted = run("c", 2, "--adapter", str(tmp_path / "a"), "--no-carry-optimizer")
    assert max_abs_diff(restarted, one) > 1e-4
    if rank == "0":
        argv = [
            *common,
            "--adapter",
            str(tmp_path / "a"),
            "--lora-rank",
            "8",
            "--output",
            str(tmp_path / "d"),
        ]
        assert train_cli(*argv) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert "is a full fine-tune" in err and "fix: pass --lora-rank 0" in err
        assert not (tmp_path / "d").exists()


def test_sft_mode_trains_on_successful_rows_only(tiny_model, rescored, tmp_path):
    out = str(tmp_path / "sft")
    assert train_cli("--input", rescored, "--model", str(tiny_model), "--output", out, "--mode", "sft") == 0
    lines = metrics_lines(out)
    assert {x["kind"] for x in lines} == {"sft"} and len(lines) == 4
    solved = [r for r in rescored_table().to_pylist() if r["success"]]
    assert sum(x["tokens"] for x in lines) == sum(len(r["response_token_ids"]) for r in solved)
    assert storage.read_manifest(out)["method"] == "sft"


def test_sft_mode_stops_at_the_loss_it_is_given(tiny_model, rescored, tmp_path):
    from sdarflow.train.sft import STOP_WINDOW

    base = ["--input", rescored, "--model", str(tiny_model), "--mode", "sft", "--max-steps", "30"]
    assert train_cli(*base, "--output", str(tmp_path / "full")) == 0
    losses = [x["loss/total"] for x in metrics_lines(str(tmp_path / "full"))]
    target = sum(losses[:STOP_WINDOW]) / STOP_WINDOW  # the first window's mean: reached at step 20
    assert train_cli(*base, "--sft-stop-at-loss", str(target + 1e-6), "--output", str(tmp_path / "es")) == 0
    assert [x["loss/total"] for x in metrics_lines(str(tmp_path / "es"))] == losses[:STOP_WINDOW]


def test_sft_mode_without_successes_fails_with_the_fix(tiny_model, tmp_path, capsys):
    data = str(tmp_path / "failed")
    table = rescored_table(n_groups=1)
    table = table.set_column(table.schema.get_field_index("success"), "success", [[False] * table.num_rows])
    storage.write_table(table, data, kind="rescored", schema=RESCORED_SCHEMA, config_hash="t", inputs=[])
    code = train_cli(
        "--input", data, "--model", str(tiny_model), "--output", str(tmp_path / "o"), "--mode", "sft"
    )
    assert code == 2 and "no successful rows" in capsys.readouterr().err


def test_replay_adds_the_last_successes_of_the_tasks_this_round_did_not_solve(
    tiny_model, rescored, tmp_path, capsys
):
    """task-0 solved nothing this round: its solved episodes in the newest earlier dataset that has any join the
    SFT steps; the tasks this round solved replay nothing."""
    table = rescored_table()  # 4 tasks x 4 episodes x 2 turns, odd episodes solved
    now = table.set_column(
        table.schema.get_field_index("success"),
        "success",
        [[s and t != "task-0" for s, t in zip(table["success"].to_pylist(), table["task_id"].to_pylist())]],
    )
    data = str(tmp_path / "now")
    storage.write_table(now, data, kind="rescored", schema=RESCORED_SCHEMA, config_hash="t", inputs=[])
    out = str(tmp_path / "adapter")
    args = ["--input", data, "--model", str(tiny_model), "--output", out, "--mini-batches", "2"]
    assert train_cli(*args, "--sft-ratio", "0.5", "--replay", rescored) == 0
    # task-0's 2 solved episodes x 2 turns
    assert storage.read_manifest(out, "adapter")["metrics"]["sft/replayed_pairs"] == 4.0
    missing = str(tmp_path / "round-0-never-published")
    assert (
        train_cli(*args, "--sft-ratio", "0.5", "--replay", rescored, "--replay", missing, "--overwrite") == 2
    )
    assert f"--replay '{missing}' does not exist" in capsys.readouterr().err
    # a folder that is not a dataset (a round that published nothing) is named as the --replay it is
    (tmp_path / "empty").mkdir()
    empty = str(tmp_path / "empty")
    assert train_cli(*args, "--sft-ratio", "0.5", "--replay", empty, "--overwrite") == 2
    err = capsys.readouterr().err
    assert err.startswith("error: train --replay: ") and err.count("\n") == 1, err
    # an artifact of another kind is named as the --replay it is, not as an sft run's input
    adapter = shutil.copytree(out, tmp_path / "an-adapter")
    assert train_cli(*args, "--sft-ratio", "0.5", "--replay", str(adapter), "--overwrite") == 2
    assert f"error: train --replay: '{adapter}' holds a 'adapter' artifact" in capsys.readouterr().err


def test_replayed_pairs_take_each_unsolved_tasks_newest_successes():
    from sdarflow.train.sft import SFTPair, replayed_pairs

    def row(task: str, success: bool, token: int, response: tuple = (9,)) -> dict:
        return {
            "task_id": task,
            "success": success,
            "prompt_token_ids": [token],
            "response_token_ids": list(response),
        }

    now = [row("a", True, 1), row("b", False, 2), row("c", False, 3)]
    older = [
        row("b", True, 10),
        row("c", True, 11),
        row("c", True, 12),
        row("a", True, 13),
        row("d", True, 14),
    ]
    newer = [row("b", True, 20), row("b", False, 21), row("c", False, 22), row("b", True, 23, ())]
    # a: solved now, never replayed; b: the newer dataset's solved turn (its empty response left out); c: only the
    # older dataset solved it; d: not played this round (a pipeline's next tasks), not replayed
    assert replayed_pairs(now, [older, newer]) == [SFTPair([20], [9]), SFTPair([11], [9]), SFTPair([12], [9])]
    assert replayed_pairs(now, []) == []


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--replay", "."], r"--replay \(--replay-rounds\) adds earlier successes to the SFT steps"),
        (
            ["--replay-rounds", "2", "--sft-ratio", "0.25", "--mode", "sft"],
            "fix: --mode rl --sft-ratio 0.25, or no replay",
        ),
        (["--checkpoint-dir", "s3://bucket/ck"], "must be a local folder"),
        (["--sft-ratio", "-1"], "sft_ratio = -1.0 must be >= 0"),
        (["--clip-ratio-c", "0.5"], "clip_ratio_c \\(0.5\\) must be > 1"),
        (["--kl-coef", "-0.1"], "kl_coef = -0.1 must be >= 0"),
    ],
)
def test_bad_settings_fail_with_the_fix(flags, message, capsys):
    assert train_cli("--input", ".", "--model", ".", "--output", "o", *flags) == 2
    assert re.search(message, capsys.readouterr().err)


def test_zero_stage_is_a_choice_of_numbers(capsys):
    from sdarflow.errors import ConfigError
    from sdarflow.stages.train import TrainConfig

    with pytest.raises(SystemExit) as exit_:  # argparse refuses it before anything runs
        train_cli("--input", ".", "--model", ".", "--output", "o", "--zero-stage", "1")
    assert exit_.value.code == 2 and "invalid choice: 1 (choose from 2, 3)" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="zero_stage = 1 is not one of 2, 3"):  # a YAML or KFP value
        TrainConfig.from_dict({"zero_stage": 1})
    assert TrainConfig.from_dict({"zero_stage": 3.0}).zero_stage == 3


def _objective(out: str) -> dict:
    return json.loads(Path(out, "train_summary.json").read_text())["objective"]


def test_objective_follows_the_reference_preset_and_is_recorded(tiny_model, rescored, tmp_path):
    base = ["--input", rescored, "--model", str(tiny_model), "--max-steps", "1"]
    out = str(tmp_path / "auto")
    assert train_cli(*base, "--output", out) == 0
    # the rows' env ("test") has no reference family: ALFWorld's settings, and the scripts' shared defaults
    assert {
        k: _objective(out)[k]
        for k in ("preset", "kl_coef", "invalid_action_penalty", "entropy_coef", "clip_ratio_c", "kl_kind")
    } == {
        "preset": "auto",
        "kl_coef": 0.01,
        "invalid_action_penalty": 0.1,
        "entropy_coef": 0.001,
        "clip_ratio_c": 3.0,
        "kl_kind": "low_var_kl",
    }
    assert _objective(out)["rl_step"] == 1 and _objective(out)["adv_stats"] == "turn"
    assert metrics_lines(out)[0]["actor/kl_loss"] > 0
    out = str(tmp_path / "search")
    assert train_cli(*base, "--output", out, "--preset", "search", "--kl-coef", "0.05") == 0
    objective = _objective(out)
    assert (objective["kl_coef"], objective["invalid_action_penalty"]) == (0.05, 0.01)


def test_kl_without_reference_logprobs_fails_with_the_fix(tiny_model, tmp_path, capsys):
    data = str(tmp_path / "no-ref")
    table = rescored_table(n_groups=1)
    table = table.set_column(
        table.schema.get_field_index("ref_logprobs"),
        "ref_logprobs",
        pa.array([None] * table.num_rows, type=pa.list_(pa.float32())),
    )
    storage.write_table(table, data, kind="rescored", schema=RESCORED_SCHEMA, config_hash="t", inputs=[])
    args = ["--input", data, "--model", str(tiny_model), "--max-steps", "1"]
    assert train_cli(*args, "--output", str(tmp_path / "a")) == 2
    err = capsys.readouterr().err
    assert "needs reference log-probs" in err and "--kl-coef 0" in err and len(err.strip().splitlines()) == 1
    assert not storage.is_published(str(tmp_path / "a"))
    assert train_cli(*args, "--output", str(tmp_path / "b"), "--kl-coef", "0") == 0


def test_help_shows_the_objective_flags_with_their_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flag, default in [
        ("--clip-ratio-c", "3.0"),
        ("--entropy-coef", "0.001"),
        ("--skill-sd-coef", "0.001"),
        ("--rlsd-warmdown-steps", "100"),
        ("--kl-kind", "'low_var_kl'"),
        ("--preset", "'auto'"),
        ("--adv-stats", "'turn'"),
    ]:
        assert re.search(re.escape(flag) + r".*?\(default " + re.escape(default) + r"\)", text), flag
    assert "--kl-coef" in text and "--invalid-action-penalty" in text


def _wait(proc, timeout: float = 600) -> str:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("where", ["folder", "mirror"])
def test_sigkill_then_resume_ends_with_the_uninterrupted_weights(tiny_model, tmp_path, where):
    """Killed after a checkpoint, a rerun resumes: from the same --checkpoint-dir, or (mirror) as a retried pod on
    another node does, from the checkpoints published to --checkpoint-uri with an empty local cache."""
    data = publish_rescored(str(tmp_path / "data"), prompt_len=64)
    common = [
        "train",
        "--input",
        data,
        "--model",
        str(tiny_model),
        "--method",
        "sdar",
        "--mini-batches",
        "2",
        "--sft-ratio",
        "0.5",
        "--warmup-steps",
        "3",
        "--max-steps",
        "6",
        "--seed",
        "3",
        "--deterministic",
    ]
    ref = str(tmp_path / "ref")
    _wait(cli(*common, "--output", ref))

    ck, out = tmp_path / "ck", str(tmp_path / "out")
    keep = ["--checkpoint-dir", str(ck)] if where == "folder" else ["--checkpoint-uri", str(ck)]
    resumable = [*common, "--output", out, "--save-every", "2", *keep]
    pod = {"env": {**os.environ, "SDARFLOW_CACHE": str(tmp_path / "node-a")}}
    proc = cli(*resumable, **pod)
    deadline = time.monotonic() + 300
    first = ck / "step-00000002"
    while not (storage.is_published(str(first)) if where == "mirror" else first.is_dir()):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    assert not storage.is_published(out)  # killed mid-run: nothing published
    done = sorted(p.name for p in ck.iterdir() if not p.name.endswith(".tmp"))
    assert "step-00000006" not in done

    if where == "mirror":
        pod = {"env": {**os.environ, "SDARFLOW_CACHE": str(tmp_path / "node-b")}}  # an empty disk
    result = json.loads(_wait(cli(*resumable, **pod)))
    assert result["resumed_from_step"] in (2, 4) and result["steps"] == 6
    if where == "mirror":  # published: the checkpoints are spent, in the mirror and on the node
        assert not ck.exists() and not list((tmp_path / "node-b").glob("checkpoints/*"))
    diff = max_abs_diff(adapter_weights(out), adapter_weights(ref))
    print(f"kill/resume max abs diff: {diff:.3g} (resumed from step {result['resumed_from_step']})")
    assert diff <= 1e-6
    got, want = metrics_lines(out), metrics_lines(ref)
    assert [x["step"] for x in got] == [1, 2, 3, 4, 5, 6]
    for key in ("kind", "lr", "loss/total", "grad_norm"):
        assert [x[key] for x in got] == pytest.approx([x[key] for x in want], abs=1e-6)
    assert torch.equal(torch.tensor([x["epoch"] for x in got]), torch.tensor([x["epoch"] for x in want]))


def test_credit_progress_and_filter_options_train_and_are_recorded(tiny_model, rescored, tmp_path):
    out = str(tmp_path / "shaped")
    args = ["--input", rescored, "--model", str(tiny_model), "--output", out, "--max-steps", "2"]
    assert train_cli(*args, "--credit", "scpo", "--advantage", "progress", "--filter", "negative-value") == 0
    summary = json.loads(storage.read_member(out, "train_summary.json"))
    objective = summary["objective"]
    assert (objective["credit"], objective["advantage"], objective["filter"]) == (
        "scpo",
        "progress",
        "negative-value",
    )
    # every turn has its own random prompt, so a failed episode's turns are states only failures reached: the
    # filter drops them (half of the rows), and SCPO finds no shared prefix to credit
    assert summary["filter/dropped_share"] == pytest.approx(0.5)
    assert summary["format_error_rates"] == [0.0] and summary["format/error_rate"] == 0.0


def _with_format_errors(share: float) -> pa.Table:
    table = rescored_table()
    bad = int(share * table.num_rows)
    flags = pa.array([i >= bad for i in range(table.num_rows)], type=pa.bool_())
    return table.set_column(table.schema.get_field_index("format_ok"), "format_ok", flags)


def test_format_guard_fails_a_round_whose_format_errors_spike(tiny_model, rescored, tmp_path, capsys, caplog):
    first = str(tmp_path / "round0")
    base = ["--model", str(tiny_model), "--max-steps", "1"]
    assert train_cli("--input", rescored, *base, "--output", first) == 0  # a clean round: rate 0
    spiked = str(tmp_path / "spiked")
    storage.write_table(
        _with_format_errors(0.5), spiked, kind="rescored", schema=RESCORED_SCHEMA, config_hash="t", inputs=[]
    )
    args = ["--input", spiked, *base, "--adapter", first]
    assert train_cli(*args, "--format-guard", "fail", "--output", str(tmp_path / "a")) == 2
    err = capsys.readouterr().err.strip()
    assert "format collapse: 50.0% of this round's turns did not parse, against 0.0%" in err
    assert "fix:" in err and len(err.splitlines()) == 1
    assert not storage.is_published(str(tmp_path / "a"))
    # the default warns and trains; the lineage keeps both rounds' rates
    assert train_cli(*args, "--output", str(tmp_path / "b")) == 0
    assert "format collapse: 50.0%" in caplog.text and "--format-guard warn: training on it" in caplog.text
    summary = json.loads(storage.read_member(str(tmp_path / "b"), "train_summary.json"))
    assert summary["format_error_rates"] == [0.0, 0.5] and summary["format/spike_baseline"] == 0.0


def test_progress_advantage_without_reference_logprobs_fails_with_the_fix(tiny_model, tmp_path, capsys):
    data = str(tmp_path / "no-ref")
    table = rescored_table(n_groups=1)
    none = pa.array([None] * table.num_rows, type=pa.list_(pa.float32()))
    table = table.set_column(table.schema.get_field_index("ref_logprobs"), "ref_logprobs", none)
    storage.write_table(table, data, kind="rescored", schema=RESCORED_SCHEMA, config_hash="t", inputs=[])
    args = ["--input", data, "--model", str(tiny_model), "--max-steps", "1", "--kl-coef", "0"]
    assert train_cli(*args, "--advantage", "progress", "--output", str(tmp_path / "a")) == 2
    err = capsys.readouterr().err.strip()
    assert "--advantage progress needs reference log-probs" in err and len(err.splitlines()) == 1


def test_format_guard_repair_trains_the_malformed_turns_back_to_their_repaired_calls(tiny_model, tmp_path):
    table = _with_format_errors(0.25)
    call = '{"tool": "read_file", "args": {"path": "notes/a.txt"}}'
    n = table.num_rows
    texts = [call.replace('"tool"', '"tol"') if i < n // 4 else call for i in range(n)]
    table = table.set_column(table.schema.get_field_index("response_text"), "response_text", pa.array(texts))
    table = table.set_column(table.schema.get_field_index("env"), "env", pa.array(["tool-use"] * n))
    data = str(tmp_path / "malformed")
    storage.write_table(table, data, kind="rescored", schema=RESCORED_SCHEMA, config_hash="t", inputs=[])
    out = str(tmp_path / "repaired")
    args = ["--input", data, "--model", str(tiny_model), "--output", out, "--max-steps", "4"]
    assert train_cli(*args, "--format-guard", "repair", "--format-repair-every", "3") == 0
    assert [x["kind"] for x in metrics_lines(out)] == ["rl", "rl", "rl", "sft"]  # exactly after every 3
    summary = json.loads(storage.read_member(out, "train_summary.json"))
    assert summary["format/malformed_turns"] == summary["format/repaired_turns"] == n // 4
    # without repair the same run takes RL steps only
    assert train_cli(*args[:-4], "--output", str(tmp_path / "plain"), "--max-steps", "4") == 0
    assert {x["kind"] for x in metrics_lines(str(tmp_path / "plain"))} == {"rl"}
