"""The generate stage through the CLI: shards partition the tasks, every env runs, stage metrics are published,
and bad input fails in one line before any episode runs (nothing is written)."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from sdarflow import storage
from sdarflow.cli import main
from sdarflow.envs import get_suite
from sdarflow.models.identity import BASE_FILE
from sdarflow.stages.generate import shard_tasks

HAS_VLLM = importlib.util.find_spec("vllm") is not None
METRICS = (
    "episodes", "success", "mean_turns", "format_error_rate", "tokens", "tokens_per_s", "env_steps_per_s",
    "identical_groups", "env_errors",
)  # fmt: skip


def fails(capsys, argv: list[str], *expected: str) -> str:
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code != 0 and err.startswith("error: "), err
    for text in expected:
        assert text in err, err
    return err


def generate(model: Path, out: Path, *extra: str) -> list[str]:
    return ["generate", "--model", str(model), "--output", str(out), "--group-size", "2", *extra]


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_shards_partition_the_tasks(n: int) -> None:
    tasks = list(range(11))
    shards = [shard_tasks(tasks, i, n) for i in range(n)]
    assert sorted(t for s in shards for t in s) == tasks
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


@pytest.mark.parametrize("env", ["tool-use", "search-qa"])
def test_sharded_generate_covers_the_tasks_once(env, tiny_model, tmp_path, capsys) -> None:
    seen = []
    for shard in range(2):
        out = tmp_path / f"shard={shard}"
        argv = ["--env", env, "--tasks", "3", "--max-turns", "2", "--max-new-tokens", "8", "--device", "cpu"]
        argv += ["--shard", str(shard), "--num-shards", "2"]
        assert main(generate(tiny_model, out, *argv)) == 0
        result = json.loads(capsys.readouterr().out)
        assert all(f"rollout/{k}" in result["metrics"] for k in METRICS)
        manifest = storage.read_manifest(str(out), "trajectories")
        assert manifest["metrics"] == result["metrics"]
        # --engine auto on a CPU: the hf engine, recorded with what it generated
        assert manifest["engine"] == result["engine"] == "hf"
        table = pq.read_table(out).to_pylist()
        assert {r["env"] for r in table} == {env} and result["metrics"]["rollout/episodes"] == 2 * (2 - shard)
        seen += sorted({r["task_id"] for r in table})
    assert sorted(seen) == sorted(t.task_id for t in get_suite(env).tasks("train", 3))


def test_same_seed_same_rollouts_in_another_run(tiny_model, tmp_path, capsys) -> None:
    # sampling seeds derive from the seed, round, task and sample, not from the run id
    runs = []
    for run_id, seed in (("run-a", "5"), ("run-b", "5"), ("run-c", "6")):
        out = tmp_path / run_id
        argv = ["--env", "search-qa", "--tasks", "2", "--max-turns", "2", "--max-new-tokens", "8"]
        assert main(generate(tiny_model, out, *argv, "--run-id", run_id, "--seed", seed)) == 0
        capsys.readouterr()
        runs.append([r["response_token_ids"] for r in pq.read_table(out).to_pylist()])
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_unknown_engine(tiny_model, tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(generate(tiny_model, tmp_path / "o", "--engine", "tgi"))
    assert exit_.value.code == 2 and "invalid choice: 'tgi'" in capsys.readouterr().err
    cfg = tmp_path / "c.yaml"
    cfg.write_text("engine: tgi\n")
    fails(capsys, [*generate(tiny_model, tmp_path / "o"), "--config", str(cfg)], "engine = 'tgi'", "hf, vllm")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_a_whole_model_where_the_adapter_goes_must_be_a_fine_tune_of_the_base(
    engine, tiny_model, tmp_path, capsys
) -> None:
    """A full fine-tune stands where an adapter goes only with its base's fingerprint: a model folder recording
    none, or another base's, is refused before anything is played."""
    model = tmp_path / "whole"
    shutil.copytree(tiny_model, model)
    argv = generate(
        tiny_model, tmp_path / "o", "--env", "tool-use", "--engine", engine, "--adapter", str(model),
        "--allow-unpublished",
    )  # fmt: skip
    fails(capsys, argv, "records no base model", "fix: pass a model the train stage fine-tuned from it")
    (model / BASE_FILE).write_text(json.dumps({"fingerprint": "0123456789abcdef"}))
    fails(capsys, argv, "full fine-tune '", "was trained on a different base model")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_adapter_for_another_base_model(engine, tiny_model, lora_adapter, tmp_path, capsys) -> None:
    adapter = tmp_path / "adapter"
    shutil.copytree(lora_adapter, adapter)
    (adapter / BASE_FILE).write_text(json.dumps({"fingerprint": "0123456789abcdef"}))
    argv = generate(
        tiny_model, tmp_path / "o", "--env", "tool-use", "--engine", engine, "--adapter", str(adapter),
        "--allow-unpublished",
    )  # fmt: skip
    fails(capsys, argv, "was trained on a different base model", "fix: pass the matching --model")
    assert not (tmp_path / "o").exists()


@pytest.mark.skipif(HAS_VLLM, reason="vllm is installed here")
def test_vllm_not_installed_names_the_fix(tiny_model, tmp_path, capsys) -> None:
    argv = generate(tiny_model, tmp_path / "o", "--env", "tool-use", "--engine", "vllm")
    fails(capsys, argv, "engine 'vllm' needs the vllm package", "pip install 'sdarflow[cpu-vllm]'")


def test_prompt_longer_than_the_context(tiny_model, tmp_path, capsys) -> None:
    short = tmp_path / "short-context"
    shutil.copytree(tiny_model, short)
    config = json.loads((short / "config.json").read_text())
    (short / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 96}))
    argv = generate(short, tmp_path / "o", "--env", "tool-use", "--tasks", "2")
    fails(
        capsys, argv, "task tool-use-train-1000: the first prompt is", "over the 32 the engine allows", "fix:"
    )
    fails(capsys, [*argv, "--max-new-tokens", "200"], "max_new_tokens (200) leaves no room", "(96)")
    assert not (tmp_path / "o").exists()


def test_an_adapter_is_tied_to_the_base_weights_not_only_the_config(
    tiny_model, lora_adapter, tmp_path, capsys
):
    """A base model with the same config.json but other weights (another training run) has another fingerprint,
    so an adapter trained on one is refused on the other; a copy of the same model (another path) is accepted."""
    import torch
    from safetensors.torch import load_file, save_file

    from sdarflow.models.identity import base_fingerprint

    copy = tmp_path / "copy"
    shutil.copytree(tiny_model, copy)
    assert base_fingerprint(str(copy)) == base_fingerprint(str(tiny_model))
    weights = load_file(str(copy / "model.safetensors"))
    save_file({k: v + 0.01 * torch.ones_like(v) for k, v in weights.items()}, str(copy / "model.safetensors"))
    assert (copy / "config.json").read_bytes() == (tiny_model / "config.json").read_bytes()
    assert base_fingerprint(str(copy)) != base_fingerprint(str(tiny_model))
    argv = generate(
        copy, tmp_path / "o", "--env", "tool-use", "--adapter", str(lora_adapter), "--allow-unpublished"
    )
    fails(capsys, argv, "was trained on a different base model", "fix: pass the matching --model")


def test_a_retried_request_is_not_redone(tiny_model, tmp_path, capsys, caplog):
    """A KFP retry (same request, --overwrite as the pipeline passes it) after the pod died past publishing returns
    the recorded result without generating again; another request to the same output is refused before any work."""
    out = tmp_path / "o"
    argv = generate(tiny_model, out, "--env", "tool-use", "--tasks", "2", "--max-turns", "2")
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    stamp = (out / storage.MANIFEST).stat().st_mtime_ns
    caplog.clear()
    with caplog.at_level("INFO", logger="sdarflow"):
        assert main([*argv, "--overwrite"]) == 0
    assert json.loads(capsys.readouterr().out) == first and "nothing to do" in caplog.text
    assert (out / storage.MANIFEST).stat().st_mtime_ns == stamp and "episodes |" not in caplog.text
    fails(capsys, [*argv, "--seed", "7"], "already published by another generate request", "--overwrite")


def test_a_model_rebuilt_at_the_same_path_is_a_new_request(tiny_model, tmp_path, capsys):
    """The request identity covers the base model's content (its fingerprint), not only its path: after the model
    at the same path changed, a rerun is another request, refused without --overwrite and redone with it."""
    import torch
    from safetensors.torch import load_file, save_file

    model, out = tmp_path / "model", tmp_path / "o"
    shutil.copytree(tiny_model, model)
    argv = generate(model, out, "--env", "tool-use", "--tasks", "2", "--max-turns", "2")
    assert main(argv) == 0
    capsys.readouterr()
    weights = load_file(str(model / "model.safetensors"))
    save_file(
        {k: v + 0.01 * torch.ones_like(v) for k, v in weights.items()}, str(model / "model.safetensors")
    )
    fails(capsys, argv, "already published by another generate request")
    assert main([*argv, "--overwrite"]) == 0


def test_an_unpublished_adapter_changed_in_place_is_a_new_request(tiny_model, lora_adapter, tmp_path, capsys):
    """An adapter folder made by hand (--allow-unpublished) has no manifest to tell its versions apart: its files
    are hashed, so after they change a rerun is another request, not a stale "already holds" result."""
    from safetensors.torch import load_file, save_file

    adapter, out = tmp_path / "adapter", tmp_path / "o"
    shutil.copytree(lora_adapter, adapter)
    (adapter / storage.MANIFEST).unlink(missing_ok=True)  # as if made by hand
    argv = generate(tiny_model, out, "--env", "tool-use", "--tasks", "2", "--max-turns", "2")
    argv += ["--adapter", str(adapter), "--allow-unpublished"]
    assert main(argv) == 0
    capsys.readouterr()
    weights = adapter / "adapter_model.safetensors"
    save_file({k: v * 2 for k, v in load_file(str(weights)).items()}, str(weights))
    fails(capsys, argv, "already published by another generate request")


@pytest.mark.parametrize("legacy", ["config", "sampled"])
def test_an_adapter_from_before_whole_weight_fingerprints_still_loads(
    tiny_model, lora_adapter, tmp_path, capsys, caplog, legacy
):
    """Adapters written when the fingerprint covered config.json only, or 16 sampled 4 KiB windows of each weight
    file (a registry's production version), keep working on their base, with a warning."""
    import hashlib

    from sdarflow.models.identity import BASE_FILE, legacy_fingerprints

    adapter = tmp_path / "old-adapter"
    shutil.copytree(lora_adapter, adapter)
    config_only = hashlib.sha256((tiny_model / "config.json").read_bytes()).hexdigest()[:16]
    sampled = legacy_fingerprints(str(tiny_model))[0]
    (adapter / BASE_FILE).write_text(
        json.dumps({"fingerprint": config_only if legacy == "config" else sampled})
    )
    argv = generate(tiny_model, tmp_path / "o", "--env", "tool-use", "--tasks", "1", "--max-turns", "1",
                    "--adapter", str(adapter), "--allow-unpublished")  # fmt: skip
    with caplog.at_level("WARNING"):
        assert main(argv) == 0
    assert "records its base model by an older fingerprint" in caplog.text
