"""Bad input: one line naming the problem and the fix, a non-zero exit, and nothing published."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from factories import cli, rescored_table, reseal

from sdarflow import storage
from sdarflow.cli import main
from sdarflow.schema import TRAJECTORY_SCHEMA


def fails(capsys, argv: list[str], *expected: str) -> str:
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code != 0
    assert err.startswith("error: ")
    for text in expected:
        assert text in err, err
    return err


def rows(n: int = 2) -> list[dict]:
    return [
        {
            "run_id": "r",
            "round": 0,
            "task_id": "t",
            "group_id": "g",
            "traj_id": f"e{i}",
            "turn": 0,
            "task_type": "cut",
            "split": "train",
            "prompt_token_ids": [1, 2],
            "response_token_ids": [3, 4],
            "response_text": "look",
            "rollout_logprobs": [-1.0, -1.0],
            "reward": 0.0,
            "episode_return": 0.0,
            "success": False,
            "format_ok": True,
            "policy_version": "base",
            "prompt_messages": "[]",
            "env": "textworld-cooking",
            "num_turns": 1,
        }
        for i in range(n)
    ]


def fake_dataset(folder: Path, table: pa.Table, kind: str = "trajectories") -> str:
    """A dataset written by hand (not through sdarflow) with a manifest, as a foreign producer would."""
    folder.mkdir(parents=True)
    pq.write_table(table, folder / "part-00000.parquet")
    (folder / "_manifest.json").write_text(
        json.dumps({"kind": kind, "files": [{"path": "part-00000.parquet"}]})
    )
    reseal(folder)  # its parts' sizes and sha256, as the data contract asks
    return str(folder)


def rescore_refuses(tmp_path, capsys, tiny_model, table: pa.Table, *expected: str) -> None:
    """rescore of ``table`` (written by hand) fails in one line with ``expected`` and publishes nothing."""
    src = fake_dataset(tmp_path / "in", table)
    out = tmp_path / "out"
    skills = str(tiny_model / "seed_skills")
    argv = ["rescore", "--input", src, "--skills", skills, "--model", str(tiny_model), "--output", str(out)]
    fails(capsys, argv, f"dataset {src}", *expected)
    assert not out.exists()


def test_missing_column(tmp_path, capsys, tiny_model):
    table = pa.Table.from_pylist(rows(), schema=TRAJECTORY_SCHEMA).drop_columns(["reward"])
    rescore_refuses(tmp_path, capsys, tiny_model, table, "missing required column 'reward'")


@pytest.mark.parametrize(
    ("row", "column", "value", "message"),
    [
        (1, "rollout_logprobs", [-1.0], "row 1 has 1 'rollout_logprobs' for 2 response tokens"),
        *[
            (
                1,
                "rollout_logprobs",
                [-1.0, v],
                "row 1 has a 'rollout_logprobs' value that is not a log-probability",
            )
            for v in (float("nan"), float("inf"), 1e30)  # no model writes them: refused where they enter
        ],
        (0, "prompt_token_ids", [1, -5], "row 0 has a negative 'prompt_token_ids'"),
    ],
)
def test_rows_no_stage_writes_are_refused(tmp_path, capsys, row, column, value, message):
    bad = rows()
    bad[row][column] = value
    src = fake_dataset(tmp_path / "in", pa.Table.from_pylist(bad, schema=TRAJECTORY_SCHEMA))
    fails(capsys, ["extract-skills", "--input", src, "--output", str(tmp_path / "out")], message)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("column", ["teacher_logprobs", "old_logprobs", "ref_logprobs"])
def test_a_rescored_log_prob_no_model_writes_is_refused_before_training(tmp_path, capsys, tiny_model, column):
    """A teacher log-prob of +1e30 in a rescored dataset made by hand would train (a huge OPSD target) and
    publish: train refuses it in one line and writes nothing."""
    table = rescored_table(n_groups=1, group_size=2, turns=1)
    values = table[column].to_pylist()
    values[1] = [1e30, *values[1][1:]]
    table = table.set_column(
        table.schema.get_field_index(column), column, pa.array(values, pa.list_(pa.float32()))
    )
    src = fake_dataset(tmp_path / "in", table, kind="rescored")
    out = tmp_path / "out"
    argv = ["train", "--input", src, "--model", str(tiny_model), "--output", str(out)]
    fails(capsys, argv, f"dataset {src}", f"row 1 has a '{column}' value that is not a log-probability")
    assert not out.exists()


def test_a_token_id_beyond_the_models_vocabulary_is_refused_before_scoring(tmp_path, capsys, tiny_model):
    bad = rows()
    bad[1]["response_token_ids"] = [3, 10**8]
    table = pa.Table.from_pylist(bad, schema=TRAJECTORY_SCHEMA)
    rescore_refuses(
        tmp_path,
        capsys,
        tiny_model,
        table,
        "row 1 has a 'response_token_ids' id >= the vocabulary size",
        "fix: pass the base model the dataset was generated with",
    )


def test_no_manifest(tmp_path, capsys):
    (tmp_path / "in").mkdir()
    pq.write_table(
        pa.Table.from_pylist(rows(), schema=TRAJECTORY_SCHEMA), tmp_path / "in" / "part-00000.parquet"
    )
    fails(
        capsys,
        ["extract-skills", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out")],
        "has no _manifest.json",
    )


def test_malformed_parquet(tmp_path, capsys):
    src = fake_dataset(tmp_path / "in", pa.Table.from_pylist(rows(), schema=TRAJECTORY_SCHEMA))
    (Path(src) / "part-00000.parquet").write_bytes(b"garbage")
    reseal(src)
    fails(capsys, ["extract-skills", "--input", src, "--output", str(tmp_path / "out")], "not valid Parquet")


def test_unknown_env(tmp_path, capsys, tiny_model):
    fails(
        capsys,
        ["generate", "--model", str(tiny_model), "--env", "chess", "--output", str(tmp_path / "o")],
        "unknown env 'chess'",
        "textworld-cooking",
    )
    assert not (tmp_path / "o").exists()


def test_missing_model_folder(tmp_path, capsys):
    fails(
        capsys,
        ["generate", "--model", str(tmp_path / "nope"), "--output", str(tmp_path / "o")],
        "--model",
        "does not exist; fix:",
    )


def test_corrupt_adapter(tmp_path, capsys, tiny_model):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{not json")
    fails(
        capsys,
        [
            "generate",
            "--model",
            str(tiny_model),
            "--adapter",
            str(adapter),
            "--output",
            str(tmp_path / "o"),
            "--allow-unpublished",
        ],
        "adapter_config.json",
    )


def test_bad_config_value(tmp_path, capsys):
    fails(
        capsys,
        ["generate", "--model", str(tmp_path), "--group-size", "1", "--output", str(tmp_path / "o")],
        "group_size = 1 must be >= 2",
    )
    cfg = tmp_path / "c.yaml"
    cfg.write_text("lamda: 0.1\n")
    fails(capsys, ["train", "--config", str(cfg)], "unknown config key(s) lamda")


def test_unreachable_storage(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    fails(
        capsys,
        ["extract-skills", "--input", "s3://bucket/runs/x", "--output", str(tmp_path / "o")],
        "cannot read 's3://bucket/runs/x",
        "AWS_ENDPOINT_URL",
    )


@pytest.mark.parametrize("stage", ["generate", "extract-skills", "rescore", "train", "evaluate", "register"])
def test_help_for_every_stage(stage, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([stage, "--help"])
    assert exit_.value.code == 0 and "--config" in capsys.readouterr().out


def test_written_dataset_refuses_unknown_kind(tmp_path):
    uri = str(tmp_path / "t")
    storage.write_table(
        pa.Table.from_pylist(rows(), schema=TRAJECTORY_SCHEMA),
        uri,
        kind="trajectories",
        schema=TRAJECTORY_SCHEMA,
        config_hash="h",
        inputs=[],
    )
    assert storage.read_manifest(uri, "trajectories")["rows"] == 2


def test_half_written_outputs_are_never_read(tmp_path, capsys, tiny_model):
    """A train run killed before its manifest leaves a folder without one: evaluate, generate and registry register
    refuse it (no model loaded, nothing written); a library without a manifest is refused as --previous too."""
    adapter = tmp_path / "killed-train"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}))
    (adapter / "adapter_model.safetensors").write_bytes(b"\x00" * 8)  # the write was cut short
    expected = ("is a folder without _manifest.json", "fix: pass a published adapter", "--allow-unpublished")
    out = tmp_path / "o"
    fails(
        capsys,
        ["evaluate", "--model", str(tiny_model), "--adapter", str(adapter), "--output", str(out)],
        *expected,
    )
    fails(
        capsys,
        ["generate", "--model", str(tiny_model), "--adapter", str(adapter), "--output", str(out)],
        *expected,
    )
    registry = tmp_path / "registry"
    report = tmp_path / "eval.json"
    report.write_text(json.dumps({"splits": {"test": {"pass_at_k": {"1": 0.5}}}}))
    argv = ["registry", "register", "--registry", str(registry), "--policy-name", "agent", "--adapter", str(adapter),
            "--eval", str(report)]  # fmt: skip
    fails(capsys, argv, *expected)
    assert not out.exists() and not registry.exists()
    library = tmp_path / "hand-made-skills"
    library.mkdir()
    (library / "skill_mapping.json").write_text(json.dumps({"skill_files": {}}))
    fails(
        capsys,
        [
            "extract-skills",
            "--input",
            fake_dataset(tmp_path / "t", pa.Table.from_pylist(rows(), schema=TRAJECTORY_SCHEMA)),
            "--previous",
            str(library),
            "--output",
            str(out),
        ],  # fmt: skip
        "skills",
        "is a folder without _manifest.json",
    )


def test_a_baseline_report_the_gate_cannot_trust_fails_before_any_episode(tmp_path, capsys, tiny_model):
    made, baseline = tmp_path / "made", tmp_path / "baseline"
    made.mkdir()
    (made / "report.json").write_text('{"splits": {"test": {"pass_at_k": {"1": NaN}}}}')
    storage.publish_dir(made, str(baseline), kind="eval-report")
    argv = [
        "evaluate",
        "--model",
        str(tiny_model),
        "--baseline",
        str(baseline),
        "--output",
        str(tmp_path / "o"),
    ]
    fails(capsys, argv, "splits.test: pass_at_k.1 = nan must be a finite number")
    assert not (tmp_path / "o").exists()


def test_registry_register_refuses_an_adapter_that_does_not_fit_the_base(
    capsys, tmp_path, tiny_model, lora_adapter
):
    """An adapter whose LoRA tensors do not fit the base's weights (here one lora_A one column too wide) is refused
    by `registry register --model` with one line, and nothing is registered."""
    import shutil

    from safetensors.torch import load_file, save_file

    adapter = tmp_path / "made"
    shutil.copytree(lora_adapter, adapter)
    weights = adapter / "adapter_model.safetensors"
    tensors = load_file(str(weights))
    name = next(n for n in tensors if ".lora_A." in n)
    tensors[name] = tensors[name].new_zeros(tensors[name].shape[0], tensors[name].shape[1] + 1)
    save_file(tensors, str(weights))
    published, registry = tmp_path / "adapter", tmp_path / "registry"
    storage.publish_dir(adapter, str(published), kind="adapter")
    report = tmp_path / "eval.json"
    report.write_text(json.dumps({"splits": {"test": {"pass_at_k": {"1": 0.5}}}}))
    argv = ["registry", "register", "--registry", str(registry), "--policy-name", "agent", "--adapter", str(published),
            "--eval", str(report), "--model", str(tiny_model)]  # fmt: skip
    fails(capsys, argv, "does not fit base model", name.removeprefix("base_model.model."), "fix:")
    assert not (registry / "agent" / "versions").exists()


def test_an_adapter_whose_weights_file_is_corrupt_is_one_line(capsys, tmp_path, tiny_model, lora_adapter):
    """Its manifest re-recorded (someone with write access), so only loading the file can tell."""
    import shutil

    made = tmp_path / "made"
    shutil.copytree(lora_adapter, made)
    weights = made / "adapter_model.safetensors"
    weights.write_bytes((2**40).to_bytes(8, "little") + weights.read_bytes()[8:])  # header length: 1 TiB
    adapter = tmp_path / "adapter"
    storage.publish_dir(made, str(adapter), kind="adapter")
    out = tmp_path / "o"
    argv = ["generate", "--model", str(tiny_model), "--adapter", str(adapter), "--output", str(out)]
    fails(capsys, [*argv, "--env", "tool-use", "--tasks", "1"], "is corrupt or incompatible", "fix:")
    assert not out.exists()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--sft-time-limit", "nan"], "--sft-time-limit (nan) must be seconds >= 0"),
        (["--sft-time-limit", "-1"], "--sft-time-limit (-1.0) must be seconds >= 0"),
        (["--seed", "-1"], "seed = -1 must be in [0,"),
    ],
)
def test_build_model_refuses_bad_numbers_before_any_work(capsys, tmp_path, flags, message):
    fails(capsys, ["build-model", "--output", str(tmp_path / "m"), *flags], message, "fix:")
    assert not (tmp_path / "m").exists()


def test_evaluate_refuses_a_prompt_longer_than_the_context(tmp_path, capsys, tiny_model):
    import shutil

    short = tmp_path / "short-context"
    shutil.copytree(tiny_model, short)
    config = json.loads((short / "config.json").read_text())
    (short / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 96}))
    argv = [
        "evaluate",
        "--model",
        str(short),
        "--env",
        "tool-use",
        "--tasks",
        "1",
        "--output",
        str(tmp_path / "o"),
    ]
    fails(capsys, argv, "the first prompt is", "tokens, over the", "fix:")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("config", "change"),
    [
        # an architecture transformers does not know: it can only come from the folder's code
        ("config.json", {"model_type": "evil", "auto_map": {"AutoConfig": "evil.EvilConfig"}}),
        ("tokenizer_config.json", {"auto_map": {"AutoTokenizer": ["evil.EvilTokenizer", None]}}),
    ],
)
def test_a_model_that_ships_its_own_code_is_refused_without_a_prompt(tmp_path, tiny_model, config, change):
    """``yes | sdarflow evaluate --model evil``: transformers would ask on stdin whether to run the folder's
    Python, and the piped "y" would import it. Refused in one line before any loading; the code never runs."""
    import shutil

    evil = tmp_path / "evil"
    shutil.copytree(tiny_model, evil)
    marker = tmp_path / "ran"
    (evil / "evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    settings = json.loads((evil / config).read_text()) if (evil / config).is_file() else {}
    (evil / config).write_text(json.dumps({**settings, **change}))
    out = tmp_path / "o"
    proc = cli("evaluate", "--model", str(evil), "--env", "tool-use", "--tasks", "1", "--output", str(out),
               stdin=subprocess.PIPE)  # fmt: skip
    _, err = proc.communicate("y\n" * 20, timeout=120)
    last = err.strip().splitlines()[-1]
    assert proc.returncode != 0
    assert (
        last.startswith("error: ")
        and f"ships its own Python ({config} has auto_map)" in last
        and "fix:" in last
    )
    assert not marker.exists() and not out.exists()


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["generate", "--shard", "3", "--num-shards", "2"],
            "must be in [0, num_shards=2); fix: --shard 0 to 1",
        ),
        (["evaluate", "--splits", "bogus"], "evaluate: splits ['bogus'] invalid; fix: pass splits among"),
        (["train", "--clip-ratio-c", "0.5"], "fix: --clip-ratio-c 3 (the reference's) or 0"),
        (["train", "--method", "opsd", "--target-kl", "0.02"], "opsd has no policy-gradient term"),
    ],
)
def test_a_settings_refusal_names_its_fix(tmp_path, capsys, argv, expected):
    fails(capsys, [*argv, "--output", str(tmp_path / "out")], expected)
    assert not (tmp_path / "out").exists()


def test_a_component_process_frees_a_failed_stages_frames_before_teardown():
    """KFP's executor lets a stage's exception end the process: the frames it held (Arrow tables among them, in
    reference cycles) were freed only at teardown, after torch's, where they aborted it. A component process prints
    the exception, then frees them: before the interpreter's exit handlers run, not after."""
    code = """
import atexit, sys
from sdarflow.kfp_runtime import setup_component
setup_component()
class Held:
    def __del__(self):
        print("freed", file=sys.stderr, flush=True)
atexit.register(lambda: print("exit handlers", file=sys.stderr, flush=True))
def stage():
    held = Held()
    held.cycle = held  # only the cycle collector frees it, as the Arrow tables
    raise ValueError("refused")
stage()
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    assert lines[-3:] == ["ValueError: refused", "freed", "exit handlers"], proc.stderr


def test_a_refusal_in_a_subprocess_exits_2_not_sigabrt(tmp_path, tiny_model):
    """A refused dataset (a wrong dtype) used to end in SIGABRT (exit 134, "terminate called without an active
    exception") in most runs: the failed stage's frames, holding Arrow tables, were freed after torch at exit."""
    table = pa.Table.from_pylist(rows(), schema=TRAJECTORY_SCHEMA)
    table = table.set_column(table.schema.get_field_index("turn"), "turn", pa.array(["0"] * table.num_rows))
    src = fake_dataset(tmp_path / "in", table)
    argv = [
        "rescore",
        "--input",
        src,
        "--skills",
        str(tiny_model / "seed_skills"),
        "--model",
        str(tiny_model),
    ]
    for i in range(3):
        proc = cli(*argv, "--output", str(tmp_path / f"out{i}"))
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 2, err[-2000:]
        assert "column 'turn' has type string, expected int32" in err and "terminate called" not in err
