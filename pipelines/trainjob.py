"""A Kubeflow Trainer v2 ``TrainJob`` (``trainer.kubeflow.org/v1alpha1``) for a train stage too big for one pod.

Inside the pipeline the train stage runs on one node. For several nodes, ``sdarflow pipeline trainjob`` turns
the train stage's config into a TrainJob on the ``torch-distributed`` ClusterTrainingRuntime: every node runs
``torchrun --module sdarflow.cli train <flags>``; the runtime's torch plugin sets the ``PET_*`` variables that
torchrun reads (nodes, processes per node, rank, master address), so the flags carry only the stage config.

Fields written (checked against the Trainer v2.2 API types, ``pkg/apis/trainer/v1alpha1/trainjob_types.go``):
``spec.runtimeRef{name, apiGroup, kind}``, ``spec.trainer{image, command, env, numNodes, numProcPerNode,
resourcesPerNode}`` and, for GPU node pools, ``spec.runtimePatches[].trainingRuntimeSpec.template.spec.
replicatedJobs[name=node].template.spec.template.spec{securityContext, containers[name=node]{securityContext,
volumeMounts}, volumes, imagePullSecrets, nodeSelector, tolerations}`` (Trainer >= 2.2), so the pods pass Pod
Security "restricted" and get a memory-backed ``/dev/shm`` and a model cache volume.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from pipelines.kube import (
    MODEL_CACHE_PATH,
    S3_KEYS,
    S3_OPTIONAL_KEYS,
    KubeOptions,
    Toleration,
    kueue_labels,
    pull_secrets,
)
from sdarflow.config import StageConfig
from sdarflow.defaults import (
    RUN_AS_UID,
    S3_SECRET,
    container_security_context,
    pod_security_context,
    quantity,
    volume_sizes,
)
from sdarflow.errors import ConfigError

API_VERSION = "trainer.kubeflow.org/v1alpha1"
KIND = "TrainJob"
DEFAULT_RUNTIME = "torch-distributed"
# The runtime's trainer job and container are both named "node" in Kubeflow Trainer's built-in runtimes.
TRAINER_JOB = "node"
PATCH_MANAGER = "sdarflow.io/pipeline-cli"


def stage_flags(cfg: StageConfig) -> list[str]:
    """``sdarflow <stage>`` flags that rebuild ``cfg``: every field that differs from its default (the I/O URIs
    and the changed settings), so the command stays short and readable."""
    args: list[str] = []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        if value in ("", None, []) or value == default:
            continue
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, bool):
            args.append(flag if value else "--no-" + f.name.replace("_", "-"))
        elif isinstance(value, list):
            for item in value:
                args += [flag, str(item)]
        else:
            args += [flag, str(value)]
    return args


def job_name(text: str) -> str:
    """An RFC 1035 label (what the TrainJob admission rules require): lower case, <= 63, starts with a letter."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    name = name if name[:1].isalpha() else f"sdar-{name}"
    return name[:63].rstrip("-")


def trainjob_manifest(
    cfg: StageConfig,
    *,
    name: str,
    image: str,
    nodes: int = 2,
    gpus_per_node: int = 8,
    gpu_resource: str = "nvidia.com/gpu",
    cpu: str = "32",
    memory: str = "256Gi",
    runtime: str = DEFAULT_RUNTIME,
    namespace: str | None = None,
    s3_secret: str = S3_SECRET,
    node_selector: dict[str, str] | None = None,
    tolerations: list[Toleration] | None = None,
    queue: str = "",
    priority: str = "",
    image_pull_secrets: list[str] | None = None,
    run_as_user: int | None = RUN_AS_UID,
    shm_size: str = KubeOptions.shm_size,
    model_cache_size: str = KubeOptions.model_cache_size,
) -> dict[str, Any]:
    """The TrainJob for one train stage config (``TrainConfig``) on ``nodes`` x ``gpus_per_node`` GPUs. Its ranks
    train with DeepSpeed whatever ``cfg.engine`` says (the torch engine trains in one process)."""
    if cfg.stage != "train":
        raise ConfigError(
            f"a TrainJob runs the train stage, got a {cfg.stage!r} config; fix: pass a train config"
        )
    # No mirrored checkpoints: its rank 0 publishes only the files on its own node, and a TrainJob's ranks span
    # nodes (a shared --checkpoint-dir volume is what resumes a multi-node run).
    cfg = dataclasses.replace(cfg, engine="deepspeed", checkpoint_uri="")
    if nodes < 1 or gpus_per_node < 0:
        raise ConfigError(f"nodes ({nodes}) must be >= 1 and gpus_per_node ({gpus_per_node}) >= 0")
    quantity(cpu, "pipeline trainjob: --cpu", "CPU")
    quantity(memory, "pipeline trainjob: --memory")
    volume_sizes("pipeline trainjob", {"--shm-size": shm_size, "--model-cache-size": model_cache_size})
    metadata: dict[str, Any] = {
        "name": job_name(name),
        "labels": {
            "app.kubernetes.io/part-of": "sdarflow",
            "sdarflow.io/stage": "train",
            **kueue_labels(queue, priority),
        },
        "annotations": {"sdarflow.io/config-hash": cfg.config_hash()},
    }
    if namespace:
        metadata["namespace"] = namespace
    # Each node copies an s3:// base model once (its ranks take turns on a lock: storage.download_dir) to an
    # emptyDir of at most ``model_cache_size``, not to the container's layer.
    env = [{"name": "SDARFLOW_CACHE", "value": MODEL_CACHE_PATH}] if model_cache_size else []
    if s3_secret:
        # Credentials only by reference to the Secret, as in the pipeline: no key ever lands in the manifest.
        for key in (*S3_KEYS, *S3_OPTIONAL_KEYS):
            ref = {"name": s3_secret, "key": key}
            if key in S3_OPTIONAL_KEYS:
                ref["optional"] = True
            env.append({"name": key, "valueFrom": {"secretKeyRef": ref}})
    limits: dict[str, Any] = {
        "cpu": cpu,
        "memory": memory,
    }  # = requests: admitted where limits are required
    if gpus_per_node:
        limits[gpu_resource] = gpus_per_node
    trainer: dict[str, Any] = {
        "image": image,
        "command": ["torchrun", "--module", "sdarflow.cli", "train", *stage_flags(cfg)],
        "numNodes": nodes,
        # One process per GPU (DeepSpeed/torch.distributed ranks); one process on a CPU-only node.
        "numProcPerNode": max(gpus_per_node, 1),
        "resourcesPerNode": {"requests": {"cpu": cpu, "memory": memory}, "limits": limits},
    }
    if env:
        trainer["env"] = env
    spec: dict[str, Any] = {
        "runtimeRef": {"name": runtime, "apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime"},
        "trainer": trainer,
    }
    patch = _pod_patch(
        node_selector or {},
        tolerations if tolerations is not None else [Toleration("nvidia.com/gpu")],
        pull_secrets(image_pull_secrets or []),
        run_as_user,
        _volumes(shm_size if gpus_per_node else "", model_cache_size),
    )
    spec["runtimePatches"] = [
        {
            "manager": PATCH_MANAGER,
            "trainingRuntimeSpec": {
                "template": {
                    "spec": {
                        "replicatedJobs": [
                            {"name": TRAINER_JOB, "template": {"spec": {"template": {"spec": patch}}}}
                        ]
                    }
                }
            },
        }
    ]
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": spec}


def _volumes(shm_size: str, model_cache_size: str) -> list[tuple[dict[str, Any], str]]:
    """(volume, mount path) of the trainer container: a memory-backed ``/dev/shm`` for NCCL (GPU nodes) and the
    model cache, each only when sized."""
    volumes = []
    if shm_size:
        volumes.append(
            ({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm_size}}, "/dev/shm")
        )
    if model_cache_size:
        volumes.append(
            ({"name": "model-cache", "emptyDir": {"sizeLimit": model_cache_size}}, MODEL_CACHE_PATH)
        )
    return volumes


def _pod_patch(
    node_selector: dict[str, str],
    tolerations: list[Toleration],
    image_pull_secrets: list[dict[str, str]],
    run_as_user: int | None,
    volumes: list[tuple[dict[str, Any], str]],
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": TRAINER_JOB, "securityContext": container_security_context()}
    patch: dict[str, Any] = {
        "securityContext": pod_security_context(run_as_user),
        # the runtime's other containers (dataset and model initializers, when it has them) are the runtime's
        "containers": [container],
    }
    if volumes:
        patch["volumes"] = [volume for volume, _ in volumes]
        container["volumeMounts"] = [{"name": v["name"], "mountPath": path} for v, path in volumes]
    if image_pull_secrets:
        patch["imagePullSecrets"] = image_pull_secrets
    if node_selector:
        patch["nodeSelector"] = dict(node_selector)
    if tolerations:
        patch["tolerations"] = [t.as_dict() for t in tolerations]
    return patch
