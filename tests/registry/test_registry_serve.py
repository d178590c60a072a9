"""serve-config: the vLLM multi-LoRA command and the Kubernetes manifests for production adapters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from factories import bound, with_report

from sdarflow.errors import ConfigError, ModelError
from sdarflow.models.identity import BASE_FILE, base_fingerprint
from sdarflow.registry import Registry, RegistryError, serve_config
from sdarflow.registry.serve import serving_files

BASE = "s3://models/qwen"


@pytest.fixture
def reg(local_registry, make_adapter, report, lineage):
    reg = Registry(local_registry)
    reg.register("cook", *with_report(make_adapter(rank=4), report(0.5, 0.6, 0.4)), lineage)
    reg.register("cook", *with_report(make_adapter(rank=4), report(0.6, 0.7, 0.5)), lineage)
    reg.register("search", *with_report(make_adapter(rank=16), report(0.5, 0.6, 0.4)), lineage)
    reg.register(
        "draft", *with_report(make_adapter(rank=8), report(0.5, 0.6, 0.4)), lineage
    )  # never promoted
    for name, version in (
        ("cook", 1),
        ("cook", 2),
        ("search", 1),
    ):  # serving reads aliases; the gate is not tested
        reg.promote(name, version, force=True, reason="test setup")
    return reg


def test_vllm_command(reg):
    config = serve_config(reg, BASE)
    args = config["vllm"]["args"]
    assert args[:4] == ["vllm", "serve", "/models/base", "--enable-lora"]
    assert args[args.index("--max-lora-rank") + 1] == "16"
    modules = args[args.index("--lora-modules") + 1 : args.index("--host")]
    assert modules == ["cook=/adapters/cook/2", "search=/adapters/search/1"]
    assert [(a["name"], a["version"]) for a in config["vllm"]["adapters"]] == [("cook", 2), ("search", 1)]

    one = serve_config(reg.uri, BASE, "cook")
    # rank 4 is not a vLLM --max-lora-rank value: rounded up to 8.
    assert one["vllm"]["max_lora_rank"] == 8
    assert "cook=/adapters/cook/2" in one["vllm"]["command"] and "search" not in one["vllm"]["command"]


def test_kubernetes_manifests(reg):
    """A complete Deployment: the initContainer copies the base and fetches the pinned versions onto the pod's own
    volumes (nothing another pod holds, so it rolls with no downtime), with a read-only key's Secret."""
    deployment, service = serve_config(reg, BASE, image="vllm:x", secret="s3-read")["kubernetes"]
    assert deployment["apiVersion"] == "apps/v1" and service["apiVersion"] == "v1"
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 1, "cpu": "8", "memory": "64Gi"}
    assert container["resources"]["requests"] == {"cpu": "8", "memory": "64Gi", "ephemeral-storage": "50Gi"}
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    assert container["command"][:3] == ["vllm", "serve", "/models/base"] and container["image"] == "vllm:x"
    (init,) = pod["initContainers"]
    assert init["envFrom"] == [{"secretRef": {"name": "s3-read"}}]
    assert init["command"] == [
        *("sdarflow", "registry", "serve-fetch", "--registry", reg.uri, "--base-model", BASE),
        *("--model-dir", "/models/base", "--adapter-root", "/adapters"),
        *("--adapter", "cook:2", "--adapter", "search:1"),
    ]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["models"] == {"name": "models", "mountPath": "/models", "readOnly": True}
    assert mounts["shm"]["mountPath"] == "/dev/shm"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert all("emptyDir" in v for v in volumes.values())  # no claim: any node, any number of pods
    assert volumes["shm"]["emptyDir"]["medium"] == "Memory"
    # the versions are in the pod template: applying a new promotion's output changes it, and the pods roll
    template_annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert template_annotations["sdarflow.io/adapters"] == "cook:2,search:1"
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    text = yaml.safe_dump_all([deployment, service])
    assert "&id" not in text  # no YAML anchors from shared objects
    assert "AWS_SECRET_ACCESS_KEY" not in json.dumps([deployment, service])


def test_scheduling_options(reg):
    toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    deployment, _ = serve_config(
        reg,
        BASE,
        node_selector={"pool": "gpu"},
        tolerations=[toleration],
        priority_class="sdarflow-serving",
        image_pull_secrets=["regcred"],
    )["kubernetes"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "gpu"} and pod["tolerations"] == [toleration]
    assert pod["priorityClassName"] == "sdarflow-serving" and pod["imagePullSecrets"] == [{"name": "regcred"}]
    plain = serve_config(reg, BASE, model_storage="200Gi")["kubernetes"][0]["spec"]["template"]["spec"]
    assert plain["containers"][0]["resources"]["requests"]["ephemeral-storage"] == "200Gi"
    assert {"name": "models", "emptyDir": {"sizeLimit": "200Gi"}} in plain["volumes"]
    assert not {"nodeSelector", "tolerations", "priorityClassName", "imagePullSecrets"} & set(plain)


def test_a_base_model_the_pod_cannot_copy_is_refused(reg):
    with pytest.raises(ConfigError, match="'/models/qwen' is not on object storage; .* fix: upload it"):
        serve_config(reg, "/models/qwen")
    with pytest.raises(
        ConfigError, match="--model-storage: '50GB' is not a size in the forms sdarflow takes"
    ):
        serve_config(reg, BASE, model_storage="50GB")


@pytest.fixture
def served(tmp_path, tiny_model, lora_adapter, report, lineage):
    """A registry whose `agent` production version was trained on the tiny model, and the model on moto's S3."""
    reg = Registry(tmp_path / "registry")
    rep = bound(report(0.5, 0.7, 0.4), lora_adapter, base_fingerprint(str(tiny_model)))
    reg.register("agent", lora_adapter, rep, lineage, base_model=tiny_model)
    reg.promote("agent", 1, force=True, reason="test setup")
    return reg


def test_serving_files_copy_the_base_and_check_each_adapter(served, tiny_model, s3_root, tmp_path):
    from sdarflow import storage

    base = storage.join(s3_root, "models", "tiny")
    for f in Path(tiny_model).iterdir():
        if f.is_file():
            storage.write_bytes(storage.join(base, f.name), f.read_bytes())
    pod = tmp_path / "pod"
    out = serving_files(
        served, base, [("agent", "production")], model_dir=pod / "models/base", adapter_root=pod / "adapters"
    )
    assert out == [
        {"name": "agent", "version": 1, "path": str(pod / "adapters/agent/production"), "lora_rank": 8}
    ]
    assert base_fingerprint(str(pod / "models/base")) == base_fingerprint(str(tiny_model))
    assert (pod / "adapters/agent/production/adapter_model.safetensors").is_file()
    assert (pod / "adapters/max-lora-rank").read_text() == "8\n"
    # an init container's retry (the pod's emptyDirs kept): the finished base copy is kept, the adapter replaced
    weights = next((pod / "models/base").glob("*.safetensors"))
    copied_at = weights.stat().st_mtime_ns
    (pod / "adapters/agent/production/adapter_config.json").write_text("{}")  # a half-written earlier fetch
    again = serving_files(
        served, base, [("agent", "production")], model_dir=pod / "models/base", adapter_root=pod / "adapters"
    )
    assert again == out and weights.stat().st_mtime_ns == copied_at
    assert json.loads((pod / "adapters/agent/production/adapter_config.json").read_text())["r"] == 8


def test_an_adapter_trained_on_another_base_is_not_served(
    served, tiny_model, lora_adapter, tmp_path, report, lineage
):
    """A version whose recorded base fingerprint is not the served base's fails the pod before vLLM starts, and
    leaves no adapter folder behind."""
    import shutil

    other = tmp_path / "other"
    shutil.copytree(lora_adapter, other)
    (other / BASE_FILE).write_text(json.dumps({"fingerprint": "0123456789abcdef"}))
    config = json.loads((other / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = "elsewhere"  # registered unchecked: no base folder to check it with
    (other / "adapter_config.json").write_text(json.dumps(config))
    served.register("agent", *with_report(other, report(0.5, 0.7, 0.4)), lineage)
    served.promote("agent", 2, force=True, reason="test setup")
    root = tmp_path / "adapters"
    with pytest.raises(
        ModelError, match="agent v2 cannot be served on base model .*trained on a different base"
    ) as err:
        serving_files(served, str(tiny_model), [("agent", "production")], adapter_root=root)
    assert f"'{root / 'agent' / 'production'}'" in str(err.value) and ".staging" not in str(err.value)
    assert f"registry show --registry {served.uri} --policy-name agent --version 2" in str(err.value)
    assert not (root / "agent" / "production").exists() and not (root / "max-lora-rank").exists()


def test_an_unknown_version_fails_before_the_base_is_copied(served, tmp_path):
    with pytest.raises(RegistryError, match="staging"):
        serving_files(
            served,
            "s3://nowhere/base",
            [("agent", "staging")],
            model_dir=tmp_path / "m",
            adapter_root=tmp_path,
        )
    assert not (tmp_path / "m").exists()


def test_errors(reg, local_registry):
    with pytest.raises(RegistryError, match="'draft' has no production version"):
        serve_config(reg, BASE, "draft")
    with pytest.raises(RegistryError, match="no production adapter"):
        serve_config(Registry(local_registry + "-empty"), BASE)


def test_rank_above_vllm_maximum(local_registry, make_adapter, report, lineage):
    reg = Registry(local_registry)
    reg.register("big", *with_report(make_adapter(rank=1024), report(0.5, 0.6, 0.4)), lineage)
    reg.promote("big", 1, force=True, reason="test setup")
    with pytest.raises(ModelError, match="LoRA rank 1024 is above vLLM's maximum 512"):
        serve_config(reg, BASE)


def test_the_serving_image_is_the_pinned_vllm_release():
    """serve-config's default vLLM image is the release the rollout image installs and k8s/images pins, never a
    moving tag."""
    import re

    import yaml

    from sdarflow.registry.serve import DEFAULT_IMAGE

    root = Path(__file__).resolve().parents[2]
    pins = yaml.safe_load((root / "k8s" / "images" / "kustomization.yaml").read_text())["images"]
    (tag,) = [p["newTag"] for p in pins if p["name"] == "vllm/vllm-openai"]
    assert DEFAULT_IMAGE == f"vllm/vllm-openai:{tag}"
    dockerfile = (root / "images" / "Dockerfile.rollout-gpu").read_text()
    assert f"vllm=={tag.removeprefix('v')}" in re.sub(r"\s+", " ", dockerfile)
