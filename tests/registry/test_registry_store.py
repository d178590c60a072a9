"""Register / list / show / fetch round trips, immutability, name validation and tamper detection."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from factories import bound, with_report

from sdarflow import storage
from sdarflow.defaults import VERSION_KIND
from sdarflow.errors import ConfigError, ModelError, StorageError
from sdarflow.models.identity import base_fingerprint
from sdarflow.registry import Registry, RegistryError
from sdarflow.registry.layout import Layout


def test_round_trip(registry_uri, make_adapter, report, lineage, tmp_path):
    reg = Registry(registry_uri)
    adapter = make_adapter()
    assert reg.register("agent", adapter, report(0.5, 0.7, 0.4), lineage, actor="ci") == 1
    assert (
        reg.register("agent", *with_report(make_adapter(seed=1), report(0.6, 0.8, 0.5)), lineage, actor="ci")
        == 2
    )
    assert reg.list_names() == ["agent"]

    rows = reg.list_versions("agent")
    assert [r["version"] for r in rows] == [1, 2]
    assert rows[1]["pass@1"] == {"test": 0.6, "ood": 0.5}
    assert rows[0]["by"] == "ci" and rows[0]["aliases"] == []

    info = reg.show("agent", 1)
    assert info["lineage"] == lineage
    assert info["eval"]["test"]["pass_at_k"]["1"] == 0.5
    assert info["lora_rank"] == 8
    files = {f["path"]: f["sha256"] for f in info["files"]}
    assert set(files) == {
        "adapter_config.json",
        "adapter_model.safetensors",
        "base_model.json",  # the base model's fingerprint, as the train stage records it
        "eval_report.json",
        "lineage.json",
        "README.md",  # the model card (registry.intake.model_card)
    }
    weights = (adapter / "adapter_model.safetensors").read_bytes()
    assert files["adapter_model.safetensors"] == hashlib.sha256(weights).hexdigest()

    local = reg.fetch_adapter("agent", "1", dest=tmp_path / "fetched")
    assert (local / "adapter_model.safetensors").read_bytes() == weights
    assert json.loads((local / "lineage.json").read_text()) == lineage
    assert reg.resolve("agent", "latest") == 2
    assert [e["event"] for e in reg.audit_log("agent")] == ["register", "register"]


def test_fetched_adapter_loads_with_safetensors(local_registry, make_adapter, report, lineage):
    from safetensors.torch import load_file

    reg = Registry(local_registry)
    reg.register("agent", *with_report(make_adapter(rank=4), report(0.5, 0.7, 0.4)), lineage)
    tensors = load_file(str(reg.fetch_adapter("agent", 1) / "adapter_model.safetensors"))
    assert next(iter(tensors.values())).shape == (4, 16)


def test_versions_are_immutable(registry_uri, make_adapter, report, lineage):
    reg = Registry(registry_uri)
    reg.register("agent", make_adapter(), report(0.5, 0.7, 0.4), lineage, version=1)
    with pytest.raises(RegistryError, match="version 1 of 'agent' already exists and versions are immutable"):
        reg.register("agent", *with_report(make_adapter(seed=1), report(0.9, 0.9, 0.9)), lineage, version=1)
    # Even bypassing the claim, the published folder refuses to be overwritten, and only versions publish there
    with pytest.raises(StorageError, match="already published"):
        storage.publish_dir(make_adapter(seed=2), Layout(reg.uri, "agent").version(1), kind=VERSION_KIND)
    for version in (1, 3):
        with pytest.raises(
            StorageError, match="publish x: .* lies inside the registry folder .*/agent, where"
        ):
            storage.publish_dir(make_adapter(seed=2), Layout(reg.uri, "agent").version(version), kind="x")
    assert reg.show("agent", 1)["eval"]["test"]["pass_at_k"]["1"] == 0.5
    # The next automatic number skips the taken one.
    assert reg.register("agent", *with_report(make_adapter(seed=3), report(0.5, 0.7, 0.4)), lineage) == 2


@pytest.mark.parametrize(
    "name", ["../x", "a/b", "", "..", "a..b", "Agent", "-agent", ".hidden", "a" * 64, "a b"]
)
def test_bad_names_are_refused(local_registry, make_adapter, report, lineage, name):
    reg = Registry(local_registry)
    with pytest.raises(ConfigError, match=r"bad adapter name .*must match .*fix:"):
        reg.register(name, make_adapter(), report(0.5, 0.7, 0.4), lineage)
    assert not Path(local_registry).exists() or not any(Path(local_registry).rglob("*.json"))


def test_tampered_file_is_refused(registry_uri, make_adapter, report, lineage, tmp_path):
    reg = Registry(registry_uri)
    reg.register("agent", make_adapter(), report(0.5, 0.7, 0.4), lineage)
    weights = storage.join(Layout(reg.uri, "agent").version(1), "adapter_model.safetensors")
    storage.write_bytes(weights, b"not the weights")
    with pytest.raises(StorageError) as err:
        reg.fetch_adapter("agent", 1, dest=tmp_path / "out")
    message = str(err.value)
    assert "adapter_model.safetensors" in message and "sha256" in message and "fix:" in message
    assert "\n" not in message


def test_tampered_eval_report_is_refused(local_registry, make_adapter, report, lineage):
    reg = Registry(local_registry)
    reg.register("agent", make_adapter(), report(0.5, 0.7, 0.4), lineage)
    path = Path(Layout(reg.uri, "agent").version(1)) / "eval_report.json"
    path.write_text(json.dumps(report(0.99, 0.99, 0.99)))
    with pytest.raises(StorageError, match=r"eval_report.json' does not match its recorded sha256 .*fix:"):
        reg.show("agent", 1)


def test_not_an_adapter_folder(local_registry, tmp_path, report, lineage):
    reg = Registry(local_registry)
    with pytest.raises(ModelError, match="no adapter_config.json"):
        reg.register("agent", tmp_path, report(0.5, 0.7, 0.4), lineage)


def test_adapter_folder_must_not_bring_reserved_files(local_registry, make_adapter, report, lineage):
    adapter = make_adapter()
    (adapter / "lineage.json").write_text("{}")
    with pytest.raises(ConfigError, match="contains 'lineage.json'"):
        Registry(local_registry).register("agent", adapter, report(0.5, 0.7, 0.4), lineage)


def test_eval_report_from_path_and_bad_report(local_registry, make_adapter, report, lineage, tmp_path):
    reg = Registry(local_registry)
    path = tmp_path / "eval_report.json"
    path.write_text(json.dumps(report(0.5, 0.7, 0.4)))
    assert reg.register("agent", make_adapter(), path, lineage) == 1
    with pytest.raises(
        ConfigError,
        match=r"eval report \(dict\): splits: the test split, which the promotion gate compares, is missing",
    ):
        reg.register("agent", make_adapter(), {"pass": 1}, lineage)


def test_resolve_errors(local_registry, make_adapter, report, lineage):
    reg = Registry(local_registry)
    reg.register("agent", make_adapter(), report(0.5, 0.7, 0.4), lineage)
    with pytest.raises(StorageError, match="version 7 of 'agent' does not exist"):
        reg.resolve("agent", 7)
    with pytest.raises(RegistryError, match="no 'production' alias yet"):
        reg.resolve("agent", "production")
    with pytest.raises(ConfigError, match="allowed: a version number, 'latest', production, staging"):
        reg.resolve("agent", "newest")


def test_failed_publish_leaves_no_version_and_number_is_not_reused(
    local_registry, make_adapter, report, lineage, monkeypatch
):
    reg = Registry(local_registry)

    def broken(*args, **kwargs):
        raise StorageError("disk full")

    monkeypatch.setattr(storage, "publish_dir", broken)
    with pytest.raises(StorageError, match="disk full"):
        reg.register("agent", make_adapter(), report(0.5, 0.7, 0.4), lineage)
    monkeypatch.undo()
    assert reg.list_versions("agent") == []
    assert reg.register("agent", make_adapter(), report(0.5, 0.7, 0.4), lineage) == 2


def test_corrupt_or_mismatched_adapter_weights_are_refused(local_registry, make_adapter, report, lineage):
    """A truncated safetensors file, or weights of a higher rank than adapter_config.json declares (vLLM sizes its
    LoRA slots by the config), are refused before anything is registered."""
    reg = Registry(local_registry)
    corrupt = make_adapter()
    weights = corrupt / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-16])
    with pytest.raises(ModelError, match="is not a valid safetensors file .*; fix: save it again") as err:
        reg.register("agent", corrupt, report(0.5, 0.7, 0.4), lineage)
    assert "\n" not in str(err.value)
    mismatched = make_adapter(rank=16)
    config = json.loads((mismatched / "adapter_config.json").read_text())
    (mismatched / "adapter_config.json").write_text(json.dumps({**config, "r": 8}))
    with pytest.raises(ModelError, match=r"shape \[16, 16\], not within the LoRA rank 8"):
        reg.register("agent", mismatched, report(0.5, 0.7, 0.4), lineage)
    assert reg.list_versions("agent") == []


def _edit_adapter(src: Path, dest: Path, edit) -> Path:
    """A copy of the adapter at ``src`` whose tensors (name -> tensor) went through ``edit``."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dest)
    weights = dest / "adapter_model.safetensors"
    save_file(edit(load_file(str(weights))), str(weights))
    return dest


def test_an_adapter_is_checked_against_its_base_model(
    local_registry, lora_adapter, tiny_model, report, lineage
):
    reg = Registry(local_registry)
    rep = bound(report(0.5, 0.7, 0.4), lora_adapter, base_fingerprint(str(tiny_model)))
    assert reg.register("agent", lora_adapter, rep, lineage, base_model=tiny_model) == 1
    assert reg._manifest(reg._layout("agent"), 1)["checked_against_base"] == str(tiny_model)


def test_an_s3_base_is_checked_where_it_is(
    s3_root, local_registry, lora_adapter, tiny_model, report, lineage, tmp_path, monkeypatch
):
    """register reads an s3:// base's fingerprint (streamed) and safetensors headers (by ranges) where it is: the
    same fingerprint and shapes as the local folder, the same verdicts, and nothing copied to the model cache (only
    the weight files' sha256 digests are cached)."""
    import shutil

    from sdarflow import storage
    from sdarflow.models.identity import BASE_FILE, weight_shapes

    base = storage.join(s3_root, "models", "tiny")
    for f in Path(tiny_model).iterdir():
        if f.is_file():
            storage.write_bytes(storage.join(base, f.name), f.read_bytes())
    assert base_fingerprint(base) == base_fingerprint(str(tiny_model))
    assert weight_shapes(base) == weight_shapes(str(tiny_model)) != {}
    monkeypatch.setenv("SDARFLOW_CACHE", str(tmp_path / "cache"))
    reg = Registry(local_registry)
    rep = bound(report(0.5, 0.7, 0.4), lora_adapter, base_fingerprint(base))
    assert reg.register("agent", lora_adapter, rep, lineage, base_model=base) == 1
    assert reg._manifest(reg._layout("agent"), 1)["checked_against_base"] == base
    assert not (tmp_path / "cache" / "models").exists()  # the model was not copied
    assert [len(p.read_text()) for p in (tmp_path / "cache" / "sha256").iterdir()] == [64]  # its digest was
    other = tmp_path / "other-base"
    shutil.copytree(lora_adapter, other)
    (other / BASE_FILE).write_text(json.dumps({"fingerprint": "0123456789abcdef"}))
    with pytest.raises(ModelError, match="trained on a different base model"):
        reg.register("agent", other, report(0.5, 0.7, 0.4), lineage, base_model=base)
    widened = _edit_adapter(lora_adapter, tmp_path / "widened", _widen_first_lora_a)
    with pytest.raises(ModelError, match="does not fit base model"):
        reg.register("agent", widened, report(0.5, 0.7, 0.4), lineage, base_model=base)


def _widen_first_lora_a(tensors):
    name = next(n for n in tensors if ".lora_A." in n)
    return {**tensors, name: tensors[name].new_zeros(tensors[name].shape[0], tensors[name].shape[1] + 1)}


def _retarget_first_lora_b(tensors):
    name = next(n for n in tensors if ".lora_B." in n)
    moved = name.replace(name.split(".lora_B.")[0].rsplit(".", 1)[1], "nope_proj")
    return {**{n: t for n, t in tensors.items() if n != name}, moved: tensors[name]}


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_widen_first_lora_a, r"lora_A.weight has shape \[8, \d+\], the base's .*\.weight is \[\d+, \d+\]"),
        (_retarget_first_lora_b, r"adapts '.*nope_proj', which the base lacks"),
    ],
)
def test_an_adapter_that_does_not_fit_the_base_is_refused(
    local_registry, lora_adapter, tiny_model, report, lineage, tmp_path, edit, message
):
    adapter = _edit_adapter(lora_adapter, tmp_path / "edited", edit)
    reg = Registry(local_registry)
    with pytest.raises(
        ModelError, match=f"does not fit base model .*{message}.*; fix: register it with the base"
    ):
        reg.register("agent", adapter, report(0.5, 0.7, 0.4), lineage, base_model=tiny_model)
    assert reg.list_names() == []


def test_an_adapter_of_another_base_with_the_same_config_is_refused(
    local_registry, lora_adapter, tiny_model, report, lineage, tmp_path
):
    import shutil

    from sdarflow.models.identity import BASE_FILE

    adapter = tmp_path / "other-base"
    shutil.copytree(lora_adapter, adapter)
    (adapter / BASE_FILE).write_text(json.dumps({"fingerprint": "0123456789abcdef"}))
    with pytest.raises(ModelError, match="trained on a different base model"):
        Registry(local_registry).register(
            "agent", adapter, report(0.5, 0.7, 0.4), lineage, base_model=tiny_model
        )


def test_a_base_model_that_is_not_a_model_folder_is_refused(
    local_registry, make_adapter, report, lineage, tmp_path
):
    with pytest.raises(ConfigError, match="is not an HF model folder"):
        Registry(local_registry).register(
            "agent", make_adapter(), report(0.5, 0.7, 0.4), lineage, base_model=tmp_path
        )


@pytest.mark.parametrize(
    "lora",
    [
        {
            "target_modules": ["q_proj", "embed_tokens"]
        },  # embedding LoRA: "<module>.lora_embedding_A", no suffix
        {"target_modules": ["q_proj", "down_proj"], "lora_bias": True},  # lora_B's 1-D bias
        {"target_modules": ["v_proj"], "modules_to_save": ["lm_head"]},
    ],
)
def test_real_peft_adapters_of_every_shape_fit_their_base(
    local_registry, tiny_model, report, lineage, tmp_path, lora
):
    import torch
    from peft import LoraConfig, get_peft_model

    from sdarflow.models import load_policy

    torch.manual_seed(0)
    model = get_peft_model(load_policy(str(tiny_model), device="cpu").model, LoraConfig(r=4, **lora))
    model.save_pretrained(tmp_path / "adapter")
    reg = Registry(local_registry)
    rep = bound(report(0.5, 0.7, 0.4), tmp_path / "adapter", base_fingerprint(str(tiny_model)))
    assert reg.register("agent", tmp_path / "adapter", rep, lineage, base_model=tiny_model) == 1


# ------------------------------------------------------------------- a report is bound to what it judges


def test_a_report_of_another_adapter_is_refused(local_registry, make_adapter, report, lineage):
    reg = Registry(local_registry)
    # report() evaluated the default adapter; seed 1 is another one with the same config
    with pytest.raises(ConfigError, match=r"the eval report evaluated another adapter \('file:///a', id "):
        reg.register("agent", make_adapter(seed=1), report(0.5, 0.7, 0.4), lineage)
    assert reg.list_names() == []


def test_the_base_models_own_report_is_not_an_adapters(local_registry, make_adapter, tasks, lineage):
    with pytest.raises(
        ConfigError, match=r"does not record which adapter it evaluated \(adapter_id: it evaluated 'base'"
    ):
        Registry(local_registry).register("agent", make_adapter(), tasks([2] * 10, adapter="base"), lineage)


def test_a_report_on_another_base_model_is_refused(local_registry, lora_adapter, tiny_model, report, lineage):
    reg = Registry(local_registry)
    rep = bound(report(0.5, 0.7, 0.4), lora_adapter)  # the fake base fingerprint, not tiny_model's
    with pytest.raises(ConfigError, match="evaluated the adapter on another base model"):
        reg.register("agent", lora_adapter, rep, lineage, base_model=tiny_model)
    # a report that does not say which base it ran on cannot be shown to be this one's
    with pytest.raises(ConfigError, match=r"does not record the base model it evaluated \(base_id\)"):
        reg.register("agent", lora_adapter, {**rep, "base_id": None}, lineage, base_model=tiny_model)


def test_without_a_readable_base_the_report_is_bound_to_the_base_the_adapter_records(
    local_registry, make_adapter, report, lineage
):
    """An adapter whose base (``tiny-qwen2``) is no folder here and no --model: its report must have run on
    the base the adapter records it was trained on (train's base_model.json); one recording none is refused."""
    from sdarflow.models.identity import BASE_FILE

    reg = Registry(local_registry)
    adapter = make_adapter()  # records FAKE_BASE_ID
    with pytest.raises(ConfigError, match="evaluated the adapter on another base model"):
        reg.register("agent", adapter, {**report(0.5, 0.7, 0.4), "base_id": "fedcba9876543210"}, lineage)
    (adapter / BASE_FILE).unlink()
    with pytest.raises(
        ConfigError, match=r"records no base model fingerprint \(base_model.json\).*fix: pass --model"
    ):
        reg.register("agent", adapter, report(0.5, 0.7, 0.4), lineage)
    assert reg.list_names() == []


def test_an_older_sampled_base_fingerprint_is_refused_by_the_registry_alone(
    local_registry, lora_adapter, tiny_model, report, lineage, tmp_path, caplog
):
    """The registry binds only full-content fingerprints: a report, or an adapter, recording the base by an older
    build's sampled fingerprint is refused (it is blind to changed bytes between its windows); the stages that
    merely load an adapter accept such an adapter with a warning."""
    import shutil

    from sdarflow.models.identity import BASE_FILE, check_adapter, legacy_fingerprints

    sampled = legacy_fingerprints(str(tiny_model))[0]
    reg = Registry(local_registry)
    rep = bound(report(0.5, 0.7, 0.4), lora_adapter, sampled)
    with pytest.raises(ConfigError, match="or recorded it by an older sdarflow's sampled fingerprint"):
        reg.register("agent", lora_adapter, rep, lineage, base_model=tiny_model)
    old = tmp_path / "old-adapter"
    shutil.copytree(lora_adapter, old)
    (old / BASE_FILE).write_text(json.dumps({"fingerprint": sampled}))
    rep = bound(report(0.5, 0.7, 0.4), old, base_fingerprint(str(tiny_model)))
    with pytest.raises(ModelError, match="records its base model by an older fingerprint .*train it again"):
        reg.register("agent", old, rep, lineage, base_model=tiny_model)
    assert reg.list_names() == []
    check_adapter(str(old), str(tiny_model))  # generate and evaluate: a warning
    assert "older fingerprint" in caplog.text


def test_a_base_eval_report_of_another_base_model_is_refused(local_registry, make_adapter, tasks, lineage):
    base_report = {**tasks([1] * 10, adapter="base"), "base_id": "fedcba9876543210"}
    with pytest.raises(ConfigError, match="the base eval report is of another base model"):
        Registry(local_registry).register(
            "agent", make_adapter(), tasks([2] * 10), lineage, base_eval_report=base_report
        )


def test_production_evaluated_again_must_be_productions_adapter(local_registry, make_adapter, tasks, lineage):
    reg = Registry(local_registry)
    flat = [2] * 10
    reg.register("agent", make_adapter(), tasks(flat, flat), lineage)
    reg.promote("agent", 1, force=True, reason="test setup")
    reg.register("agent", *with_report(make_adapter(seed=1), tasks([3] * 10, flat)), lineage)
    # "production evaluated again" made with another adapter (the candidate's own, seed 1)
    again = bound(tasks([1] * 10, flat), make_adapter(seed=1))
    with pytest.raises(ConfigError, match="the report of agent v1 evaluated again evaluated another adapter"):
        reg.promote("agent", 2, current_report=(1, again))


def test_a_retried_register_task_finds_its_own_version(local_registry, make_adapter, report, lineage):
    """The register stage's retry check: the same lineage and adapter content is the version an earlier attempt
    published; the same lineage with other weights (an adapter retrained in place) or another lineage is not."""
    from sdarflow import storage
    from sdarflow.stages.register import _registered_before

    def manifest(folder):
        return {"files": [{"path": p.name, "sha256": storage.file_sha256(p)} for p in folder.iterdir()]}

    reg = Registry(local_registry)
    adapter, other = make_adapter(seed=1), make_adapter(seed=2)
    assert _registered_before(reg, "agent", dict(lineage), manifest(adapter)) is None  # none yet
    reg.register("agent", *with_report(adapter, report(0.5, 0.7, 0.4)), lineage)
    reg.register("agent", *with_report(other, report(0.5, 0.7, 0.4)), {**lineage, "round": 9})
    assert _registered_before(reg, "agent", dict(lineage), manifest(adapter)) == 1
    assert _registered_before(reg, "agent", dict(lineage), manifest(other)) is None
    assert _registered_before(reg, "agent", {**lineage, "round": 8}, manifest(adapter)) is None
