"""serve-config: the vLLM multi-LoRA command and the Kubernetes manifests for production adapters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from factories import with_report

from sdarflow.errors import ModelError
from sdarflow.registry import Registry, RegistryError, serve_config


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
    config = serve_config(reg, "/models/qwen")
    args = config["vllm"]["args"]
    assert args[:4] == ["vllm", "serve", "/models/qwen", "--enable-lora"]
    assert args[args.index("--max-lora-rank") + 1] == "16"
    modules = args[args.index("--lora-modules") + 1 : args.index("--host")]
    assert modules == ["cook=/adapters/cook/2", "search=/adapters/search/1"]
    assert [(a["name"], a["version"]) for a in config["vllm"]["adapters"]] == [("cook", 2), ("search", 1)]

    one = serve_config(reg.uri, "/models/qwen", "cook")
    # rank 4 is not a vLLM --max-lora-rank value: rounded up to 8.
    assert one["vllm"]["max_lora_rank"] == 8
    assert "cook=/adapters/cook/2" in one["vllm"]["command"] and "search" not in one["vllm"]["command"]


def test_kubernetes_manifests(reg):
    deployment, service = serve_config(reg, "/models/qwen", image="vllm:x", secret="s3-creds")["kubernetes"]
    assert deployment["apiVersion"] == "apps/v1" and service["apiVersion"] == "v1"
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 1, "memory": "64Gi"}
    assert container["resources"]["requests"] == {"cpu": "8", "memory": "64Gi"}
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert container["command"][:2] == ["vllm", "serve"] and container["image"] == "vllm:x"
    init = pod["initContainers"][0]
    assert init["envFrom"] == [{"secretRef": {"name": "s3-creds"}}]
    assert (
        "sdarflow registry fetch" in init["command"][-1]
        and "--output /adapters/cook/2" in init["command"][-1]
    )
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    text = yaml.safe_dump_all([deployment, service])
    assert "&id" not in text  # no YAML anchors from shared objects
    assert "AWS_SECRET_ACCESS_KEY" not in json.dumps([deployment, service])


def test_errors(reg, local_registry):
    with pytest.raises(RegistryError, match="'draft' has no production version"):
        serve_config(reg, "/models/qwen", "draft")
    with pytest.raises(RegistryError, match="no production adapter"):
        serve_config(Registry(local_registry + "-empty"), "/models/qwen")


def test_rank_above_vllm_maximum(local_registry, make_adapter, report, lineage):
    reg = Registry(local_registry)
    reg.register("big", *with_report(make_adapter(rank=1024), report(0.5, 0.6, 0.4)), lineage)
    reg.promote("big", 1, force=True, reason="test setup")
    with pytest.raises(ModelError, match="LoRA rank 1024 is above vLLM's maximum 512"):
        serve_config(reg, "/models/qwen")


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
