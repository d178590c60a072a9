"""Serving configuration for production adapters: a vLLM multi-LoRA launch command and Kubernetes manifests.

One vLLM server holds the base model once and serves every production adapter as a LoRA module (clients pick one
with ``"model": "<adapter name>"``). The Deployment's initContainer downloads the adapters from the registry
(``sdarflow registry fetch``) into a shared emptyDir; credentials come only from a Secret through ``envFrom``.
"""

from __future__ import annotations

import json
import logging
import shlex
from pathlib import Path
from typing import Any

from sdarflow import __version__
from sdarflow.defaults import RUN_AS_UID, S3_SECRET, container_security_context, pod_security_context
from sdarflow.errors import ModelError
from sdarflow.models.identity import max_lora_rank
from sdarflow.registry.errors import RegistryError
from sdarflow.registry.layout import validate_name
from sdarflow.registry.store import Registry

log = logging.getLogger(__name__)

# The vLLM release the rollout image installs (images/Dockerfile.rollout-gpu) and k8s/images pins: serving the
# adapters with another one would serve them with another sampler and kernels than they were evaluated with.
DEFAULT_IMAGE = "vllm/vllm-openai:v0.32.0"
DEFAULT_FETCH_IMAGE = f"ghcr.io/sdarflow/sdarflow:{__version__}"  # same image as components.IMAGE
SERVING_CPU, SERVING_MEMORY = "8", "64Gi"
# vLLM's image runs as root with its caches under /root; run as our non-root user, they go to a writable emptyDir
# (HOME for Triton and torch, XDG_CACHE_HOME for vLLM's and Hugging Face's), and the model comes from the volume.
SERVING_CACHE = "/cache"
SERVING_ENV = [
    {"name": "HF_HUB_OFFLINE", "value": "1"},
    {"name": "HOME", "value": SERVING_CACHE},
    {"name": "XDG_CACHE_HOME", "value": SERVING_CACHE},
]


def production_adapters(registry: Registry, name: str | None, adapter_root: str) -> list[dict[str, Any]]:
    """name, version, registry URI, mount path and LoRA rank of each production adapter (or of ``name``'s)."""
    names = [validate_name(name)] if name else registry.list_names()
    adapters = []
    for n in names:
        version = registry.aliases(n).get("production")
        if version is None:
            if name:
                raise RegistryError(
                    f"'{n}' has no production version; fix: `sdarflow registry promote` one first"
                )
            log.info("serve-config: skipping %s (no production version)", n)
            continue
        info = registry.show(n, version)
        if info["lora_rank"] is None:
            raise ModelError(
                f"{n} v{version} has no LoRA rank ('r') in adapter_config.json; vLLM serves LoRA adapters only; "
                f"fix: register a LoRA adapter"
            )
        path = f"{adapter_root.rstrip('/')}/{n}/{version}"
        adapters.append(
            {"name": n, "version": version, "uri": info["uri"], "path": path, "lora_rank": info["lora_rank"]}
        )
    if not adapters:
        raise RegistryError(
            f"no production adapter in {registry.uri}; fix: promote one with "
            f"`sdarflow registry promote --registry {registry.uri} --policy-name NAME --version V`"
        )
    return adapters


def serve_config(
    registry: Registry | str | Path,
    base_model: str,
    name: str | None = None,
    *,
    image: str = DEFAULT_IMAGE,
    fetch_image: str = DEFAULT_FETCH_IMAGE,
    secret: str = S3_SECRET,
    adapter_root: str = "/adapters",
    app: str = "sdarflow-serve",
    port: int = 8000,
    namespace: str | None = None,
    run_as_user: int | None = RUN_AS_UID,
) -> dict[str, Any]:
    """``{"vllm": {"args", "command", "adapters", "max_lora_rank"}, "kubernetes": [Deployment, Service]}``."""
    registry = registry if isinstance(registry, Registry) else Registry(registry)
    adapters = production_adapters(registry, name, adapter_root)
    max_rank = max_lora_rank([a["lora_rank"] for a in adapters])
    args = [
        "vllm",
        "serve",
        base_model,
        "--enable-lora",
        "--max-lora-rank",
        str(max_rank),
        # All adapters resident at once: a request for any of them never waits for a swap.
        "--max-loras",
        str(len(adapters)),
        "--lora-modules",
        *[f"{a['name']}={a['path']}" for a in adapters],
        "--host",
        "0.0.0.0",
        "--port",
        str(port),
    ]
    # A Deployment (initContainer fetches adapters, vLLM container on one GPU) and a ClusterIP Service
    labels = {"app.kubernetes.io/name": app, "app.kubernetes.io/part-of": "sdarflow"}
    metadata: dict[str, Any] = {"name": app, "labels": labels}
    if namespace:
        metadata["namespace"] = namespace
    mount = {"name": "adapters", "mountPath": adapter_root}
    fetch = " && ".join(
        shlex.join(
            ["sdarflow", "registry", "fetch", "--registry", registry.uri, "--policy-name", a["name"]]
            + ["--version", str(a["version"]), "--output", a["path"]]
        )
        for a in adapters
    )
    pod = {
        # fetches (sha256-verified) every adapter version into the shared volume
        "initContainers": [
            {
                "name": "fetch-adapters",
                "image": fetch_image,
                "command": ["sh", "-c", fetch],
                # Registry credentials (and AWS_ENDPOINT_URL) only from the Secret: never literal.
                "envFrom": [{"secretRef": {"name": secret}}],
                "volumeMounts": [mount],
                "securityContext": container_security_context(),
            }
        ],
        "containers": [
            {
                "name": "vllm",
                "image": image,
                "command": args,
                "env": SERVING_ENV,
                "ports": [{"name": "http", "containerPort": port}],
                # Requests so the scheduler reserves the host memory vLLM needs to load the model and its CPU for
                # tokenization; limit = request for memory (no eviction surprises).
                "resources": {
                    "requests": {"cpu": SERVING_CPU, "memory": SERVING_MEMORY},
                    "limits": {"nvidia.com/gpu": 1, "memory": SERVING_MEMORY},
                },
                "volumeMounts": [{**mount, "readOnly": True}, {"name": "cache", "mountPath": SERVING_CACHE}],
                "securityContext": container_security_context(),
                # Model load takes minutes: readiness, not liveness, gates traffic.
                "readinessProbe": {
                    "httpGet": {"path": "/health", "port": "http"},
                    "initialDelaySeconds": 30,
                    "periodSeconds": 10,
                },
            }
        ],
        "volumes": [{"name": "adapters", "emptyDir": {}}, {"name": "cache", "emptyDir": {}}],
        "securityContext": pod_security_context(run_as_user),  # Pod Security "restricted" admits it
    }
    annotations = {
        "sdarflow.io/registry": registry.uri,
        "sdarflow.io/adapters": ",".join(f"{a['name']}:{a['version']}" for a in adapters),
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {**metadata, "annotations": annotations},
        "spec": {
            "replicas": 1,
            # The base model's volume is ReadWriteOnce: a rolling update's second pod could never mount it.
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {"app.kubernetes.io/name": app}},
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {
            "type": "ClusterIP",
            "selector": {"app.kubernetes.io/name": app},
            "ports": [{"name": "http", "port": port, "targetPort": "http"}],
        },
    }
    result = {
        "vllm": {
            "args": args,
            "command": shlex.join(args),
            "adapters": adapters,
            "max_lora_rank": max_rank,
        },
        "kubernetes": [deployment, service],
    }
    # A JSON round trip unshares the dicts and lists used in several places, so YAML dumps have no &anchors.
    return json.loads(json.dumps(result))
