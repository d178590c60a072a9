"""Attacks on a registry by someone with write access to its prefix (a review's red-team findings): an alias state
cannot name a path or take another shape, a stored report replaced together with its sha256 is still validated,
and what no check anticipated ends in one line and exit code 2, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from factories import with_report

from sdarflow import storage
from sdarflow.cli import main


def one_line_error(capsys, argv: list[str], *expected: str) -> str:
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    for text in expected:
        assert text in err, err
    return err


@pytest.fixture
def registry_with_versions(tmp_path, make_adapter, report, lineage) -> str:
    from sdarflow.registry import Registry

    reg = Registry(tmp_path / "registry")
    reg.register("pol", make_adapter(), report(0.5, 0.7, 0.4), lineage)
    reg.register("pol", *with_report(make_adapter(seed=1), report(0.3, 0.5, 0.3)), lineage)
    reg.promote("pol", 1, force=True, reason="test setup")
    return str(tmp_path / "registry")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda s: s["stages"]["production"].update(version="../../../evil"),
            "stages.production: version = '../../../evil' is not a valid int",
        ),
        (
            lambda s: s["stages"]["production"]["history"].append({"version": "abc"}),
            "stages.production: history[1]: version = 'abc' is not a valid int",
        ),
        (lambda s: s.update(stages=[]), "is not an alias state: stages = [] is not a mapping"),
        (lambda s: s["stages"].update(production="x"), "stages.production: 'x' is not a mapping"),
        (lambda s: s["stages"]["production"].update(history="x"), "history = 'x' is not a list"),
    ],
)
def test_an_alias_state_that_names_a_path_or_has_another_shape_is_refused(
    registry_with_versions, capsys, edit, message
):
    aliases = Path(registry_with_versions) / "pol" / "aliases.json"
    state = json.loads(aliases.read_text())
    edit(state)
    aliases.write_text(json.dumps(state))
    argv = _version_2("promote", registry_with_versions)
    one_line_error(capsys, argv, message, "fix:")


def _version_2(command: str, registry: str) -> list[str]:
    """``sdarflow registry COMMAND`` on the fixture's policy ``pol``, version 2."""
    return ["registry", command, "--registry", registry, "--policy-name", "pol", "--version", "2"]


def test_a_report_replaced_together_with_its_sha256_is_refused(registry_with_versions, capsys):
    version = Path(registry_with_versions) / "pol" / "versions" / "2"
    (version / "eval_report.json").write_text("{}")
    manifest = json.loads((version / storage.MANIFEST).read_text())
    for entry in manifest["files"]:
        if entry["path"] == "eval_report.json":
            entry.update(bytes=2, sha256="44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a")
    (version / storage.MANIFEST).write_text(json.dumps(manifest))
    argv = _version_2("show", registry_with_versions)
    one_line_error(capsys, argv, "eval report of pol v2")


def test_an_unexpected_error_is_one_line_and_verbose_shows_the_traceback(registry_with_versions, capsys):
    """The catch-all for what no check anticipated: a claim file named with a digit of another script."""
    (Path(registry_with_versions) / "pol" / "versions" / "²").mkdir()
    argv = ["registry", "list", "--registry", registry_with_versions, "--policy-name", "pol"]
    assert main(argv) == 0  # not a version folder: ignored, not int()-ed
    capsys.readouterr()
    aliases = Path(registry_with_versions) / "pol" / "aliases.json"
    aliases.write_bytes(b'{"stages": {"production": {"version": 1, "history": []}}, "name": "\xff"}')
    one_line_error(capsys, [*argv], "not valid JSON")


def test_a_version_folder_linked_out_of_the_registry_is_refused(registry_with_versions, tmp_path, capsys):
    import shutil

    versions = Path(registry_with_versions) / "pol" / "versions"
    outside = tmp_path / "elsewhere"
    shutil.move(versions / "2", outside)  # a published version, moved out and linked back
    (versions / "2").symlink_to(outside, target_is_directory=True)
    one_line_error(
        capsys,
        ["registry", "fetch", "--registry", registry_with_versions, "--policy-name", "pol", "--version", "2",
         "--output", str(tmp_path / "fetched")],
        "registry version", "resolves outside", "through a symlink",
    )  # fmt: skip


def test_a_claim_file_cannot_move_the_next_version_out_of_range(
    registry_with_versions, make_adapter, report, lineage
):
    from sdarflow.registry import Registry

    claims = Path(registry_with_versions) / "pol" / "claims"
    (claims / "99999999999999999999.json").write_text("{}")  # a stray or hostile claim name
    (claims / "1000000.json").write_text("{}")
    assert (
        Registry(registry_with_versions).register(
            "pol", *with_report(make_adapter(seed=2), report(0.5, 0.7, 0.4)), lineage
        )
        == 3
    )


def test_an_adapter_whose_weights_hold_nan_or_inf_is_refused(local_registry, make_adapter, report, lineage):
    from safetensors.torch import load_file, save_file

    from sdarflow.errors import ModelError
    from sdarflow.registry import Registry

    reg = Registry(local_registry)
    for bad in (float("nan"), float("inf")):
        adapter = make_adapter()
        weights = adapter / "adapter_model.safetensors"
        tensors = load_file(str(weights))
        next(iter(tensors.values()))[0, 0] = bad
        save_file(tensors, str(weights))
        with pytest.raises(ModelError, match=r"holds 1 NaN or infinite value\(s\) .*; fix:"):
            reg.register("agent", adapter, report(0.5, 0.7, 0.4), lineage)
    assert reg.list_versions("agent") == []


def test_an_adapter_in_pickle_format_is_refused(local_registry, make_adapter, report, lineage):
    """A NaN adapter saved as adapter_model.bin got past the weight checks, which read safetensors."""
    import torch
    from safetensors.torch import load_file

    from sdarflow.errors import ModelError
    from sdarflow.registry import Registry

    reg = Registry(local_registry)
    for keep_safetensors in (False, True):  # alone, or beside checked weights that PEFT would load instead
        adapter = make_adapter()
        weights = adapter / "adapter_model.safetensors"
        tensors = load_file(str(weights))
        next(iter(tensors.values()))[0, 0] = float("nan")
        torch.save(tensors, adapter / "adapter_model.bin")
        if not keep_safetensors:
            weights.unlink()
        with pytest.raises(
            ModelError, match=r"holds adapter_model\.bin: the registry keeps safetensors .*; fix:"
        ):
            reg.register("agent", adapter, report(0.5, 0.7, 0.4), lineage)
    assert reg.list_versions("agent") == []


def test_nothing_but_the_registry_writes_inside_its_folders(
    local_registry, make_adapter, report, lineage, tiny_model, capsys, tmp_path
):
    """`evaluate --output <registry>/p/versions/1 --overwrite` deleted a registered adapter, and an output at a
    version number not yet claimed (or anywhere in the name's folder) would break or shadow a later version: every
    stage and command that writes a folder (a fetch, an import, a build) refuses one inside a registry name folder,
    before any work, leaving the registry as it was."""
    from sdarflow.cli import main
    from sdarflow.registry import Registry

    reg = Registry(local_registry)
    reg.register("agent", make_adapter(), report(0.5, 0.7, 0.4), lineage)
    reg.set_gate("other", "production", {"min_gain": 0.1}, reason="a name with a policy and no version yet")
    root = Path(local_registry)
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    evaluate = ["evaluate", "--model", str(tiny_model), "--env", "tool-use", "--tasks", "1", "--output"]
    for out in ("agent/versions/1", "agent/versions/2", "agent", "agent/notes/x", "other/versions/1"):
        for extra in ([], ["--overwrite"]):
            assert main([*evaluate, str(root / out), *extra]) == 2
            err = capsys.readouterr().err.strip().splitlines()[-1]
            name = out.split("/")[0]
            assert f"evaluate: '{root / out}' lies inside the registry folder {root / name}," in err, err
            assert "fix: choose an output outside the registry" in err
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    registry = ["--registry", str(root)]
    # a version folder holds lineage.json: fetch took it for an earlier fetch's output
    inside = str(root / "agent" / "versions" / "1")
    for what, argv in (
        ("registry fetch", ["registry", "fetch", *registry, "--policy-name", "agent", "--version", "1", "--output"]),
        ("import-model", ["import-model", "--gguf", str(gguf), "--source", "s", "--license", "l", "--output"]),
        ("build-model", ["build-model", "--tasks", "1", "--sft-steps", "1", "--output"]),
        ("registry serve-fetch", ["registry", "serve-fetch", *registry, "--base-model", str(tiny_model),
                                  "--adapter", "agent:1", "--model-dir", str(tmp_path / "m"), "--adapter-root"]),
    ):  # fmt: skip
        out = str(root / "agent") if what == "registry serve-fetch" else inside
        assert main([*argv, out]) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert f"{what}: '" in err and "lies inside the registry folder" in err, err
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before
    assert [v["version"] for v in reg.list_versions("agent")] == [1]
    # the registry itself still registers, and a folder that merely holds an `audit` folder is not a registry's
    assert reg.register("agent", *with_report(make_adapter(seed=1), report(0.5, 0.7, 0.4)), lineage) == 2
    folder = tmp_path / "r"
    folder.mkdir()
    (folder / "x.json").write_text("{}")
    (tmp_path / "mine" / "audit").mkdir(parents=True)
    storage.publish_dir(folder, str(tmp_path / "mine" / "report"), kind="report")


def test_overwrite_never_replaces_another_kind_of_artifact(tmp_path):
    """A publish with --overwrite replaces only its own kind: a report never replaces an adapter."""
    from sdarflow.errors import StorageError

    adapter, report_dir = tmp_path / "a", tmp_path / "r"
    for folder in (adapter, report_dir):
        folder.mkdir()
        (folder / "x.json").write_text(f'"{folder.name}"')
    storage.publish_dir(adapter, str(tmp_path / "out"), kind="adapter")
    before = {p: p.read_bytes() for p in (tmp_path / "out").rglob("*") if p.is_file()}
    with pytest.raises(StorageError, match="is a published adapter, and --overwrite replaces only a report"):
        storage.publish_dir(report_dir, str(tmp_path / "out"), kind="report", overwrite=True)
    assert {p: p.read_bytes() for p in (tmp_path / "out").rglob("*") if p.is_file()} == before
