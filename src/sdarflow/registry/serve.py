"""Serving production adapters: a vLLM multi-LoRA launch command, Kubernetes manifests, and what a serving pod
fetches before vLLM starts.

One vLLM server holds the base model once and serves every production adapter as a LoRA module (clients pick one
with ``"model": "<adapter name>"``). The pod's initContainer (``sdarflow registry serve-fetch``) copies the base
model from object storage to an emptyDir, fetches the adapters (sha256-verified) and refuses any that was not
trained on that base, so the pod holds no volume another pod needs and a Deployment can roll: the new pod serves
before the old one stops. Credentials come only from a Secret through ``envFrom``; serving only reads.
"""

from __future__ import annotations

import json
import logging
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sdarflow import __version__, storage
from sdarflow.defaults import (
    ADAPTERS_ANNOTATION,
    REGISTRY_ANNOTATION,
    RUN_AS_UID,
    container_security_context,
    pod_security_context,
    quantity,
)
from sdarflow.errors import ConfigError, ModelError
from sdarflow.models.identity import lora_rank, max_lora_rank
from sdarflow.registry import intake
from sdarflow.registry.errors import RegistryError
from sdarflow.registry.layout import LINEAGE, validate_name
from sdarflow.registry.store import Registry

log = logging.getLogger(__name__)

# The vLLM release the rollout image installs (images/Dockerfile.rollout-gpu) and k8s/images pins: serving the
# adapters with another one would serve them with another sampler and kernels than they were evaluated with.
DEFAULT_IMAGE = "vllm/vllm-openai:v0.32.0"
DEFAULT_FETCH_IMAGE = f"ghcr.io/sdarflow/sdarflow:{__version__}"  # same image as components.IMAGE
# A key that can only read the bucket: serving never writes (k8s/README step 3 makes it).
SERVING_SECRET = "sdarflow-s3-read"
SERVING_CPU, SERVING_MEMORY = "8", "64Gi"
# The base model's copy on the node's disk (a 7B model in bf16 is ~15 GB), and vLLM's shared memory.
MODEL_STORAGE, SHM_SIZE = "50Gi", "2Gi"
FETCH_RESOURCES = {"cpu": "1", "memory": "2Gi"}
MODEL_DIR, ADAPTER_ROOT, MAX_RANK_FILE = "/models/base", "/adapters", "max-lora-rank"
# vLLM's image runs as root with its caches under /root; run as our non-root user, they go to a writable emptyDir
# (HOME for Triton and torch, XDG_CACHE_HOME for vLLM's and Hugging Face's), and the model comes from the volume.
SERVING_CACHE = "/cache"
SERVING_ENV = [
    {"name": "HF_HUB_OFFLINE", "value": "1"},
    {"name": "HOME", "value": SERVING_CACHE},
    {"name": "XDG_CACHE_HOME", "value": SERVING_CACHE},
]
# A new pod downloads the base model and loads it before it is ready: a rollout waits this long for it.
PROGRESS_DEADLINE_S = 1800
# A stopping pod keeps serving while the Service stops sending it requests (endpoints update in seconds), then has
# the rest of the grace period to finish the requests it holds.
DRAIN_S, GRACE_S = 10, 120


def adapter_path(root: str | Path, name: str, version: int | str) -> str:
    """Where a serving pod keeps ``name``'s ``version`` (a number, or the alias the pod resolves at start)."""
    return f"{str(root).rstrip('/')}/{name}/{version}"


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
        path = adapter_path(adapter_root, n, version)
        adapters.append(
            {"name": n, "version": version, "uri": info["uri"], "path": path, "lora_rank": info["lora_rank"]}
        )
    if not adapters:
        raise RegistryError(
            f"no production adapter in {registry.uri}; fix: promote one with "
            f"`sdarflow registry promote --registry {registry.uri} --policy-name NAME --version V`"
        )
    return adapters


def parse_adapter(text: str) -> tuple[str, str]:
    """``NAME[:VERSION]`` (a number, ``latest``, or an alias; default ``production``) as ``(name, version)``."""
    name, _, version = text.partition(":")
    return validate_name(name), version or "production"


def serving_files(
    registry: Registry | str | Path,
    base_model: str,
    adapters: Sequence[tuple[str, str]],
    *,
    model_dir: str | Path = MODEL_DIR,
    adapter_root: str | Path = ADAPTER_ROOT,
) -> list[dict[str, Any]]:
    """Put what a serving pod serves on its disk, checked: the base model (an ``s3://`` one copied to
    ``model_dir``, a local one read in place), and each ``(name, version or alias)`` fetched (sha256-verified) to
    ``<adapter_root>/<name>/<version as given>`` after checking that it was trained on that base (its base
    fingerprint and every tensor shape, as register checks it); then ``<adapter_root>/max-lora-rank``, vLLM's
    ``--max-lora-rank`` for them. Every name and alias is resolved before the base is copied, so an unknown one
    fails in seconds. Returns name, version, path and LoRA rank of each."""
    registry = registry if isinstance(registry, Registry) else Registry(registry)
    resolved = [(name, spec, registry.resolve(name, spec)) for name, spec in adapters]
    if not resolved:
        raise ConfigError("serve-fetch: no adapter to serve; fix: pass --adapter NAME[:VERSION]")
    base = base_model
    if base_model.startswith("s3://"):
        storage.download_dir(base_model, Path(model_dir), marker="config.json", what="base model")
        base = str(model_dir)
    served = []
    for name, spec, version in resolved:
        out = Path(adapter_path(adapter_root, name, spec))
        with storage.replacing_folder(out, LINEAGE, "registry serve-fetch") as staged:
            registry.fetch_adapter(name, version, dest=staged)
            config = json.loads((staged / "adapter_config.json").read_text())  # register checked it
            try:
                intake.checked_base(staged, config, base)
            except (ModelError, ConfigError) as err:
                why = str(err).split("; fix:")[0].replace(str(staged), str(out))
                raise ModelError(
                    f"{name} v{version} cannot be served on base model '{base_model}': {why}; fix: serve the base "
                    f"model it was trained on (`sdarflow registry show --registry {registry.uri} --policy-name "
                    f"{name} --version {version}` names it)"
                ) from err
            rank = lora_rank(config)
            if rank is None:
                raise ModelError(
                    f"{name} v{version} has no LoRA rank ('r'); fix: vLLM serves LoRA adapters only"
                )
        served.append({"name": name, "version": version, "path": str(out), "lora_rank": rank})
        log.info("serve-fetch: %s v%d (%s) at %s, trained on this base", name, version, spec, out)
    Path(adapter_root, MAX_RANK_FILE).write_text(f"{max_lora_rank([a['lora_rank'] for a in served])}\n")
    return served


def serve_config(
    registry: Registry | str | Path,
    base_model: str,
    name: str | None = None,
    *,
    image: str = DEFAULT_IMAGE,
    fetch_image: str = DEFAULT_FETCH_IMAGE,
    secret: str = SERVING_SECRET,
    app: str = "sdarflow-serve",
    port: int = 8000,
    namespace: str | None = None,
    run_as_user: int | None = RUN_AS_UID,
    node_selector: Mapping[str, str] | None = None,
    tolerations: Sequence[Mapping[str, str]] = (),
    priority_class: str | None = None,
    image_pull_secrets: Sequence[str] = (),
    model_storage: str = MODEL_STORAGE,
) -> dict[str, Any]:
    """``{"vllm": {"args", "command", "adapters", "max_lora_rank"}, "kubernetes": [Deployment, Service]}`` for
    the production versions (of ``name``, or of every name), pinned: after a promotion, apply the new output
    and the Deployment rolls (a new pod is ready before the old one stops; it needs a free GPU meanwhile)."""
    if not base_model.startswith("s3://"):
        raise ConfigError(
            f"serve-config: --base-model '{base_model}' is not on object storage; the serving pod copies the base "
            f"model the adapters were trained on and checks them against it; fix: upload it (k8s/README step 6) "
            f"and pass its s3:// URI"
        )
    quantity(model_storage, "serve-config: --model-storage")
    registry = registry if isinstance(registry, Registry) else Registry(registry)
    adapters = production_adapters(registry, name, ADAPTER_ROOT)
    max_rank = max_lora_rank([a["lora_rank"] for a in adapters])
    args = [
        "vllm",
        "serve",
        MODEL_DIR,
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
    pinned = [f"{a['name']}:{a['version']}" for a in adapters]
    labels = {"app.kubernetes.io/name": app, "app.kubernetes.io/part-of": "sdarflow"}
    metadata: dict[str, Any] = {"name": app, "labels": labels}
    if namespace:
        metadata["namespace"] = namespace
    fetch = ["sdarflow", "registry", "serve-fetch", "--registry", registry.uri, "--base-model", base_model]
    fetch += ["--model-dir", MODEL_DIR, "--adapter-root", ADAPTER_ROOT]
    fetch += [arg for spec in pinned for arg in ("--adapter", spec)]
    adapters_mount = {"name": "adapters", "mountPath": ADAPTER_ROOT}
    models_mount = {"name": "models", "mountPath": str(Path(MODEL_DIR).parent)}
    pod: dict[str, Any] = {
        "initContainers": [
            {
                "name": "fetch",
                "image": fetch_image,
                "command": fetch,
                # Registry credentials (and AWS_ENDPOINT_URL) only from the Secret: never literal.
                "envFrom": [{"secretRef": {"name": secret}}],
                "resources": {"requests": FETCH_RESOURCES, "limits": FETCH_RESOURCES},
                "volumeMounts": [adapters_mount, models_mount],
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
                # Requests so the scheduler reserves the host memory vLLM needs to load the model, its CPU for
                # tokenization and the disk of the model's copy; limits equal to requests (no eviction surprises,
                # and a namespace that requires limits admits it).
                "resources": {
                    "requests": {
                        "cpu": SERVING_CPU,
                        "memory": SERVING_MEMORY,
                        "ephemeral-storage": model_storage,
                    },
                    "limits": {"nvidia.com/gpu": 1, "cpu": SERVING_CPU, "memory": SERVING_MEMORY},
                },
                "volumeMounts": [
                    {**adapters_mount, "readOnly": True},
                    {**models_mount, "readOnly": True},
                    {"name": "cache", "mountPath": SERVING_CACHE},
                    {"name": "shm", "mountPath": "/dev/shm"},
                ],
                "securityContext": container_security_context(),
                # Model load takes minutes: readiness, not liveness, gates traffic.
                "readinessProbe": {
                    "httpGet": {"path": "/health", "port": "http"},
                    "initialDelaySeconds": 30,
                    "periodSeconds": 10,
                },
                "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(DRAIN_S)]}}},
            }
        ],
        "terminationGracePeriodSeconds": GRACE_S,
        "volumes": [
            {"name": "adapters", "emptyDir": {}},
            {"name": "models", "emptyDir": {"sizeLimit": model_storage}},
            {"name": "cache", "emptyDir": {}},
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}},
        ],
        "securityContext": pod_security_context(run_as_user),  # Pod Security "restricted" admits it
        "automountServiceAccountToken": False,  # serving never calls the Kubernetes API
    }
    if node_selector:
        pod["nodeSelector"] = dict(node_selector)
    if tolerations:
        pod["tolerations"] = list(tolerations)
    if priority_class:
        pod["priorityClassName"] = priority_class
    if image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": n} for n in image_pull_secrets]
    annotations = {REGISTRY_ANNOTATION: registry.uri, ADAPTERS_ANNOTATION: ",".join(pinned)}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {**metadata, "annotations": annotations},
        "spec": {
            "replicas": 1,
            # Nothing on the pod is shared with another pod, so a rollout starts the new pod first and stops the
            # old one when the new one is ready: no downtime, one more GPU while it lasts.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "progressDeadlineSeconds": PROGRESS_DEADLINE_S,
            "selector": {"matchLabels": {"app.kubernetes.io/name": app}},
            "template": {"metadata": {"labels": labels, "annotations": annotations}, "spec": pod},
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
