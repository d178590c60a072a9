"""The `sdarflow registry` subcommands through argparse, as the top-level CLI calls them."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import yaml
from factories import bound

from sdarflow import storage
from sdarflow.cli.registry import add_arguments
from sdarflow.errors import ConfigError, StorageError
from sdarflow.registry import GateRefused


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="sdarflow")
    add_arguments(parser.add_subparsers(dest="command", required=True).add_parser("registry"))
    args = parser.parse_args(["registry", *argv])
    return args.func(args)


@pytest.fixture
def files(tmp_path, make_adapter, tasks, lineage):
    def write(name: str, rep: dict) -> str:
        path = tmp_path / name
        path.write_text(json.dumps(rep))
        return str(path)

    published = str(tmp_path / "published-adapter")  # as the train stage publishes it
    storage.publish_dir(make_adapter(), published, kind="adapter")
    lineage_path = tmp_path / "lineage.json"
    lineage_path.write_text(json.dumps(lineage))
    return {
        "adapter": published,
        # n = 4 samples on 10 tasks; the base model solves 1 of 4 on each, v1 2 of 4
        "base_model": write("base-model.json", tasks([1] * 10, [2] * 10, adapter="")),
        "base": write("base.json", tasks([2] * 10, [2] * 10)),
        # +0.05 on average (+.25, -.25, +.25, +.25, six ties): inside the noise
        "noise": write("noise.json", tasks([3, 1, 3, 3, 2, 2, 2, 2, 2, 2], [2] * 10)),
        "better": write("better.json", tasks([3] * 9 + [2], [2] * 10)),
        "lineage": str(lineage_path),
    }


def test_cli_flow(local_registry, files, capsys, tmp_path):
    reg = ["--registry", local_registry, "--policy-name", "agent"]
    assert (
        run(
            [
                "register",
                *reg,
                "--adapter",
                files["adapter"],
                "--eval",
                files["base"],
                "--base-eval-report",
                files["base_model"],
                "--lineage",
                files["lineage"],
            ]
        )
        == 0
    )
    assert capsys.readouterr().out == "1\n"
    inline = '{"run_id": "r2"}'
    assert (
        run(
            [
                "register",
                *reg,
                "--adapter",
                files["adapter"],
                "--eval",
                files["noise"],
                "--lineage",
                inline,
            ]
        )
        == 0
    )
    assert capsys.readouterr().out == "2\n"
    run(["register", *reg, "--adapter", files["adapter"], "--eval", files["better"]])
    assert capsys.readouterr().out == "3\n"

    # 10 tasks are fewer than the default policy's min_tasks 32: set the registry's, an integer flag, audited
    with pytest.raises(GateRefused, match="test: 10 paired tasks are fewer than the gate's min_tasks 32"):
        run(["promote", *reg, "--version", "1"])
    assert run(["gate", *reg, "--min-tasks", "10", "--reason", "a 10-task eval set"]) == 0
    assert json.loads(capsys.readouterr().out)["production"]["min_tasks"] == 10
    with pytest.raises(GateRefused, match="min_tasks 5 is looser than the registry's 10"):
        run(["promote", *reg, "--version", "1", "--min-tasks", "5"])
    assert run(["promote", *reg, "--version", "1"]) == 0  # beats the base model it was registered with
    assert capsys.readouterr().out == "agent production -> v1 (gate: passed)\n"

    with pytest.raises(GateRefused) as err:
        run(["promote", *reg, "--version", "2"])
    assert err.value.exit_code == 3
    assert "test pass@1 vs production v1: 0.55 - 0.50 = +0.05, lower bound -0.05 " in str(err.value)
    # A caller may only tighten the registry's policy: a looser threshold is refused (and audited) ...
    with pytest.raises(GateRefused) as err:
        run(["promote", *reg, "--version", "2", "--min-gain", "-0.1"])
    assert "min_gain -0.1 is looser than the registry's 0" in str(err.value)
    # ... until the registry's own policy is set, with a reason, audited: no worse than production beyond 0.1
    with pytest.raises(ConfigError, match="needs --reason"):
        run(["gate", *reg, "--min-gain", "-0.1"])
    assert run(["gate", *reg, "--min-gain", "-0.1", "--reason", "noisy eval set"]) == 0
    assert json.loads(capsys.readouterr().out)["production"]["min_gain"] == -0.1
    assert run(["promote", *reg, "--version", "2"]) == 0
    capsys.readouterr()
    assert run(["rollback", *reg]) == 0
    assert capsys.readouterr().out == "agent production -> v1 (was v2)\n"
    assert run(["promote", *reg, "--version", "3"]) == 0
    assert "gate: passed" in capsys.readouterr().out

    assert run(["list", "--registry", local_registry, "--policy-name", "agent", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["aliases"] for r in rows] == [[], [], ["production"]]
    assert run(["list", "--registry", local_registry]) == 0
    assert capsys.readouterr().out == "agent\tproduction=v3\n"
    assert run(["list", "--registry", local_registry, "--policy-name", "agent"]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("v1\t")

    assert run(["show", *reg, "--version", "1"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["lineage"]["run_id"] == "run-1" and shown["version"] == 1

    assert run(["fetch", *reg, "--version", "production", "--output", str(tmp_path / "dl")]) == 0
    assert capsys.readouterr().out == f"{tmp_path / 'dl'}\n"
    assert (tmp_path / "dl" / "adapter_model.safetensors").is_file()

    out = tmp_path / "k8s.yaml"
    argv = [
        "serve-config",
        "--registry",
        local_registry,
        "--base-model",
        "s3://models/base",
        "--output",
        str(out),
    ]
    assert run([*argv, "--image", "vllm/vllm-openai:v0.9.0", "--secret", "s3-creds"]) == 0
    command = capsys.readouterr().out
    assert (
        command.startswith("vllm serve /models/base --enable-lora") and "agent=/adapters/agent/3" in command
    )
    deployment, service = yaml.safe_load_all(out.read_text())
    assert deployment["kind"] == "Deployment" and service["kind"] == "Service"
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "vllm/vllm-openai:v0.9.0"


def test_serve_config_fetches_with_the_image_make_images_built(local_registry, files, tmp_path, monkeypatch):
    reg = ["--registry", local_registry, "--policy-name", "agent"]
    run(["register", *reg, "--adapter", files["adapter"], "--eval", files["noise"]])
    run(["promote", *reg, "--version", "1", "--force", "--reason", "test setup"])
    monkeypatch.chdir(tmp_path)  # where `make images` ran
    (tmp_path / "images").mkdir()
    built = {"image": "reg.example/sdarflow:0.1.0-abc", "train_image": "t", "rollout_image": "r"}
    (tmp_path / "images" / "built.json").write_text(json.dumps(built))
    argv = [
        "serve-config",
        "--registry",
        local_registry,
        "--base-model",
        "s3://m",
        "--output",
        str(tmp_path / "k.yaml"),
    ]
    assert run(argv) == 0
    deployment, _ = yaml.safe_load_all((tmp_path / "k.yaml").read_text())
    assert deployment["spec"]["template"]["spec"]["initContainers"][0]["image"] == built["image"]


def test_cli_force_and_errors(local_registry, files, capsys):
    from sdarflow.errors import ConfigError

    reg = ["--registry", local_registry, "--policy-name", "agent"]
    for report_file in ("base", "noise"):
        run(["register", *reg, "--adapter", files["adapter"], "--eval", files[report_file]])
    with pytest.raises(GateRefused, match="nothing to compare the candidate v1 with"):
        run(["promote", *reg, "--version", "1"])  # no base-model report, no production
    run(["promote", *reg, "--version", "1", "--force", "--reason", "first version, evaluated by hand"])
    with pytest.raises(ConfigError, match="--force needs --reason"):
        run(["promote", *reg, "--version", "2", "--force"])
    assert run(["promote", *reg, "--version", "2", "--force", "--reason", "known eval flake"]) == 0
    assert "gate: overridden" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="--lineage is not valid JSON"):
        run(["register", *reg, "--adapter", files["adapter"], "--eval", files["base"], "--lineage", "{bad"])
    with pytest.raises(SystemExit):
        run(["promote", *reg, "--version", "2", "--stage", "prod"])


def test_serve_fetch_writes_what_the_serving_pod_reads(
    local_registry, tiny_model, lora_adapter, report, lineage, tmp_path, capsys
):
    from sdarflow.models.identity import base_fingerprint
    from sdarflow.registry import Registry

    registry = Registry(local_registry)
    rep = bound(report(0.5, 0.7, 0.4), lora_adapter, base_fingerprint(str(tiny_model)))
    registry.register("agent", lora_adapter, rep, lineage, base_model=tiny_model)
    registry.promote("agent", 1, force=True, reason="test setup")
    argv = [
        "serve-fetch",
        "--registry",
        local_registry,
        "--base-model",
        str(tiny_model),
        "--adapter",
        "agent",
    ]
    assert run([*argv, "--adapter-root", str(tmp_path / "adapters")]) == 0
    (served,) = json.loads(capsys.readouterr().out)
    assert served == {
        "name": "agent",
        "version": 1,
        "path": str(tmp_path / "adapters/agent/production"),
        "lora_rank": 8,
    }
    assert (tmp_path / "adapters" / "max-lora-rank").read_text() == "8\n"
    with pytest.raises(ConfigError, match="bad adapter name '../agent'"):
        run([*argv[:-1], "../agent"])


def test_listing_a_registry_that_is_not_there_is_an_error(tmp_path, capsys, local_registry, files):
    from sdarflow.cli import main

    assert main(["registry", "list", "--registry", str(tmp_path / "typo")]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith(f"error: --registry '{tmp_path / 'typo'}' does not exist; fix: check --registry")
        and err.count("\n") == 1
    )
    (tmp_path / "empty").mkdir()
    assert main(["registry", "list", "--registry", str(tmp_path / "empty"), "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == [] and "holds no adapters yet" in err
    run(
        [
            "register",
            "--registry",
            local_registry,
            "--policy-name",
            "agent",
            "--adapter",
            files["adapter"],
            "--eval",
            files["base"],
        ]
    )
    capsys.readouterr()
    assert main(["registry", "list", "--registry", local_registry, "--policy-name", "agnet"]) == 2
    err = capsys.readouterr().err
    assert "no adapter named 'agnet'" in err and "fix: one of agent" in err


def test_fetch_replaces_only_an_earlier_fetch(local_registry, make_adapter, report, lineage, tmp_path):
    """--output holding a user's README.md was overwritten by the model card; an earlier fetch (an init
    container's retry) is still replaced, and a published version folder never is."""
    from sdarflow.registry import Registry

    Registry(local_registry).register("agent", make_adapter(), report(0.5, 0.7, 0.4), lineage)
    argv = ["fetch", "--registry", local_registry, "--policy-name", "agent", "--version", "1", "--output"]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "README.md").write_text("my notes")
    version = Path(local_registry) / "agent" / "versions" / "1"
    for refused, error, message in (
        (mine, ConfigError, r"did not write \(no lineage\.json\)"),
        (version, StorageError, "lies inside the registry folder"),
    ):
        before = {p: p.read_bytes() for p in refused.rglob("*") if p.is_file()}
        with pytest.raises(error, match=message):
            run([*argv, str(refused)])
        assert {p: p.read_bytes() for p in refused.rglob("*") if p.is_file()} == before
    assert run([*argv, str(tmp_path / "dl")]) == 0
    (tmp_path / "dl" / "adapter_model.safetensors").write_bytes(b"half-written")
    assert run([*argv, str(tmp_path / "dl")]) == 0
    assert (
        Registry(local_registry).fetch_adapter("agent", 1).joinpath("adapter_model.safetensors").read_bytes()
        == (tmp_path / "dl" / "adapter_model.safetensors").read_bytes()
    )
