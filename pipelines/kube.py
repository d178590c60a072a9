"""Kubernetes wiring of pipeline tasks: per-stage images, GPU limits, node selectors and tolerations for the GPU
pool, S3 credentials from a Secret, CPU/memory requests, timeouts, retries, caching, a memory-backed ``/dev/shm``
for GPU tasks (NCCL and vLLM's workers share tensors through it; the container default is 64 MiB) and an
ephemeral volume for the base-model cache (not the container layer). Components stay free of it.

Everything here is compile-time: ``KubeOptions`` comes from ``sdarflow pipeline compile`` flags, and ``wire``
applies it to one task. The KFP local runner ignores it, so local runs and the cluster run the same DAG.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import ClassVar

from kfp import dsl, kubernetes

from components import IMAGE, ROLLOUT_GPU_IMAGE, TRAIN_GPU_IMAGE
from sdarflow.config import Checked, opt
from sdarflow.defaults import RUN_AS_UID, S3_SECRET, quantity, volume_sizes
from sdarflow.errors import ConfigError
from sdarflow.model_cache import LOADS_MODEL

GPU_STAGES = ("generate", "rescore", "train", "evaluate")
# Which GPU image a stage uses: rollouts (generate, evaluate) want vLLM; log-probs and training want DeepSpeed.
GPU_IMAGE_ROLE = {"generate": "rollout", "evaluate": "rollout", "rescore": "train", "train": "train"}
# Required Secret keys, then keys a Secret may omit (AWS S3 needs no endpoint; MinIO needs no region).
S3_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
S3_OPTIONAL_KEYS = ("AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION")
DEFAULT_CPU = {
    "prepare": "500m",
    "generate": "4",
    "extract-skills": "1",
    "rescore": "4",
    "train": "8",
    "evaluate": "4",
    "register": "1",
    "promote": "500m",
}
DEFAULT_MEMORY = {
    "prepare": "1Gi",
    "generate": "32Gi",
    "extract-skills": "4Gi",
    "rescore": "32Gi",
    "train": "64Gi",
    "evaluate": "32Gi",
    "register": "4Gi",
    "promote": "1Gi",
}
# Seconds a task may run before Kubernetes stops it (activeDeadlineSeconds): a hung vLLM engine or NCCL
# collective must not hold its GPU forever. Sized for the gpu preset with room to spare (PRESET_RESOURCES sizes the
# others); --timeout overrides.
DEFAULT_TIMEOUT_S = {
    "prepare": 600,
    "generate": 6 * 3600,
    "extract-skills": 2 * 3600,
    "rescore": 4 * 3600,
    "train": 12 * 3600,
    "evaluate": 6 * 3600,
    "register": 3600,
    "promote": 600,
}
# What each `pipeline compile --preset` (sdarflow.sizes.PIPELINE_PRESETS) asks of the cluster, per GPU stage, over
# the defaults above (sized for `gpu`: a small model, one GPU a stage). The CPU presets' tiny or 135M model runs
# without GPUs. `production` is a 7B model's LoRA: `sdarflow plan --model-params 7e9` on its round (128 tasks x 8,
# 256 x 8 evaluated on each split, ~30 turns of 2048 + 128 tokens) estimates, from published H100 rates, generate
# 0.6 h and rescore 1.6 h on one GPU, train 0.3 h on eight, evaluate 2.4 h on one: the deadlines are 4x or more.
# `reference` (16 tasks x 8 a round, the reference's step) trains on two GPUs as the reference's LoRA script does;
# its plan: generate 0.1 h, rescore 0.2 h, train 0.2 h, evaluate 0.6 h. `reference-search` (128 questions x 8, 4
# turns of 4096-token prompts) trains on four as the reference's search script; its plan: generate 0.16 h, rescore
# 0.42 h, evaluate 0.16 h on one GPU, train 0.16 h on four. Each train rank loads its bf16 base
# straight onto its GPU (stages.train.weights_placement), so host memory holds the ranks' runtimes and the
# memory-backed /dev/shm, not eight copies of the weights.
_CPU_ONLY = {
    "gpus": dict.fromkeys(GPU_STAGES, 0),
    "cpu": dict.fromkeys(GPU_STAGES, "2"),
    "memory": dict.fromkeys(GPU_STAGES, "8Gi"),
    "timeout_s": dict.fromkeys(GPU_STAGES, 2 * 3600),
    "model_cache_size": "10Gi",
}
_7B_VOLUMES = {"shm_size": "32Gi", "model_cache_size": "100Gi"}  # NCCL and vLLM; a 7B model's files and more
PRESET_RESOURCES: dict[str, dict] = {
    "demo": _CPU_ONLY,
    "smoke": _CPU_ONLY,
    "pretrained": _CPU_ONLY,
    "gpu": {},
    "production": {
        "gpus": {"generate": 1, "rescore": 1, "train": 8, "evaluate": 1},
        "cpu": {"generate": "16", "rescore": "8", "train": "64", "evaluate": "16"},
        "memory": {"generate": "96Gi", "rescore": "64Gi", "train": "192Gi", "evaluate": "96Gi"},
        "timeout_s": {"generate": 4 * 3600, "rescore": 8 * 3600, "train": 6 * 3600, "evaluate": 12 * 3600},
        **_7B_VOLUMES,
    },
    "reference": {
        "gpus": {"generate": 1, "rescore": 1, "train": 2, "evaluate": 1},
        "cpu": {"generate": "16", "rescore": "8", "train": "16", "evaluate": "16"},
        "memory": {"generate": "96Gi", "rescore": "64Gi", "train": "64Gi", "evaluate": "96Gi"},
        "timeout_s": {"generate": 2 * 3600, "rescore": 2 * 3600, "train": 2 * 3600, "evaluate": 4 * 3600},
        **_7B_VOLUMES,
    },
    "reference-search": {
        "gpus": {"generate": 1, "rescore": 1, "train": 4, "evaluate": 1},
        "cpu": {"generate": "16", "rescore": "8", "train": "32", "evaluate": "16"},
        "memory": {"generate": "96Gi", "rescore": "64Gi", "train": "96Gi", "evaluate": "96Gi"},
        "timeout_s": {"generate": 2 * 3600, "rescore": 2 * 3600, "train": 2 * 3600, "evaluate": 4 * 3600},
        **_7B_VOLUMES,
    },
}
KUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")


def kueue_labels(queue: str, priority: str = "") -> dict[str, str]:
    """The labels Kueue admits a workload by: its LocalQueue (so the namespace's quotas apply to the run's pods)
    and, with one, its WorkloadPriorityClass (which of the queue's workloads is admitted first and which are
    preempted for it); {} without a queue. ConfigError for a name that is not a label value, or a priority
    without a queue (only Kueue reads that label)."""
    for flag, value, example in (
        ("--queue", queue, "the LocalQueue's name, e.g. team-a"),
        ("--priority", priority, "the WorkloadPriorityClass's name, e.g. nightly"),
    ):
        if value and not _LABEL_VALUE.fullmatch(value):
            raise ConfigError(
                f"{flag} {value!r} is not a Kubernetes label value (at most 63 letters, digits, '-', '_' or '.', "
                f"starting and ending with a letter or digit); fix: {example}"
            )
    if priority and not queue:
        raise ConfigError(
            f"--priority {priority!r} is a Kueue WorkloadPriorityClass, which only a workload in a Kueue queue "
            f"has; fix: pass --queue with the LocalQueue too"
        )
    if not queue:
        return {}
    return {KUEUE_LABEL: queue, **({KUEUE_PRIORITY_LABEL: priority} if priority else {})}


_SECRET_NAME = re.compile(r"[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?")


def pull_secrets(names: list[str]) -> list[dict[str, str]]:
    """A pod spec's ``imagePullSecrets`` for the Secrets ``names`` ([] for none); ConfigError for a name that is
    not a Secret's (a DNS subdomain)."""
    bad = [n for n in names if not _SECRET_NAME.fullmatch(n)]
    if bad:
        raise ConfigError(
            f"--image-pull-secret {bad[0]!r} is not a Secret name (lowercase letters, digits, '-' and '.', at most "
            f"253); fix: the name of the docker-registry Secret, e.g. regcred"
        )
    return [{"name": n} for n in names]


# Stages that copy an s3:// base model to $SDARFLOW_CACHE (model_cache.local_model).
MODEL_CACHE_STAGES = LOADS_MODEL
MODEL_CACHE_PATH = "/var/cache/sdarflow"
TASKS = tuple(DEFAULT_CPU)
_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


@dataclass(frozen=True)
class Toleration:
    """A pod toleration; ``value`` None means operator ``Exists``."""

    key: str
    effect: str = "NoSchedule"
    value: str | None = None

    @classmethod
    def parse(cls, text: str) -> Toleration:
        """``KEY[=VALUE][:EFFECT]``, e.g. ``nvidia.com/gpu:NoSchedule`` or ``pool=gpu:NoExecute``."""
        match = re.fullmatch(r"([^=:\s]+)(?:=([^:\s]*))?(?::(\w+))?", text.strip())
        effect = (match.group(3) if match else None) or "NoSchedule"
        if not match or effect not in _EFFECTS:
            raise ConfigError(
                f"bad toleration {text!r}: expected KEY[=VALUE][:EFFECT] with EFFECT one of "
                f"{', '.join(_EFFECTS)}; fix: e.g. --toleration nvidia.com/gpu:NoSchedule"
            )
        return cls(key=match.group(1), value=match.group(2), effect=effect)

    def as_dict(self) -> dict[str, str]:
        """The pod spec's toleration: operator ``Exists`` without a value, else ``Equal``."""
        if self.value is None:
            return {"key": self.key, "operator": "Exists", "effect": self.effect}
        return {"key": self.key, "operator": "Equal", "value": self.value, "effect": self.effect}


@dataclass
class KubeOptions(Checked):
    """Compile-time Kubernetes settings. GPU stages with 0 GPUs run on the CPU image without GPU scheduling."""

    what: ClassVar[str] = "pipeline compile"

    image: str = opt(IMAGE, "the CPU image")
    train_image: str = opt(TRAIN_GPU_IMAGE, "the GPU image of rescore and train (DeepSpeed)")
    rollout_image: str = opt(ROLLOUT_GPU_IMAGE, "the GPU image of generate and evaluate (vLLM)")
    gpu_resource: str = opt("nvidia.com/gpu", "the extended resource a GPU is")
    gpus: dict[str, int] = opt(dict.fromkeys(GPU_STAGES, 1), "GPUs per stage", ge=0, keys=GPU_STAGES)
    node_selector: dict[str, str] = opt({}, "node labels GPU tasks are scheduled by")
    # GPU node pools are commonly tainted nvidia.com/gpu (GKE, AKS, the NVIDIA operator's docs): tolerate it.
    tolerations: list[Toleration] = opt([Toleration("nvidia.com/gpu")], "taints GPU tasks tolerate")
    s3_secret: str = opt(S3_SECRET, "the Secret holding the S3 credentials")
    cpu: dict[str, str] = opt(DEFAULT_CPU, "CPU request per task", keys=TASKS)
    memory: dict[str, str] = opt(DEFAULT_MEMORY, "memory request and limit per task", keys=TASKS)
    retries: int = opt(2, "retries of each task (a preempted node, an S3 hiccup)", ge=0)
    timeout_s: dict[str, int] = opt(DEFAULT_TIMEOUT_S, "seconds a task may run", ge=1, keys=TASKS)
    shm_size: str = opt("16Gi", "/dev/shm of GPU tasks (memory-backed, counted against the memory limit)")
    model_cache_size: str = opt("200Gi", "the ephemeral volume holding the base model; '' = none")
    pipeline_root: str = opt("", "where KFP keeps the run's artifacts; '' = the deployment's default")
    queue: str = opt("", "a Kueue LocalQueue: every pod gets the kueue.x-k8s.io/queue-name label; '' = none")
    priority: str = opt(
        "", "a Kueue WorkloadPriorityClass (with a queue): the kueue.x-k8s.io/priority-class label; '' = none"
    )
    image_pull_secrets: list[str] = opt(
        [], "docker-registry Secrets every pod pulls its image with (a private registry); [] = none"
    )
    parallelism: int = opt(0, "the study's cells running at once; 0 = all", ge=0)
    run_as_user: int | None = opt(
        RUN_AS_UID,
        "UID and GID every task runs as (non-root, so Pod Security restricted admits the pods); None: runAsNonRoot "
        "only, the platform assigns the user (OpenShift)",
        ge=1,
    )

    def validate(self) -> None:
        kueue_labels(self.queue, self.priority)  # a bad name fails now
        pull_secrets(self.image_pull_secrets)
        for task, value in self.cpu.items():
            quantity(value, f"{self.what}: --cpu {task}", "CPU")
        for task, value in self.memory.items():
            quantity(value, f"{self.what}: --memory {task}")
        volume_sizes(self.what, {"--shm-size": self.shm_size, "--model-cache-size": self.model_cache_size})

    @classmethod
    def for_preset(cls, preset: str | None) -> KubeOptions:
        """The defaults with ``preset``'s sizes (:data:`PRESET_RESOURCES`) merged in, stage by stage."""
        base = cls()
        sizes = PRESET_RESOURCES.get(preset or "", {})
        merged = {k: {**getattr(base, k), **v} if isinstance(v, dict) else v for k, v in sizes.items()}
        return dataclasses.replace(base, **merged)

    def gpus_for(self, stage: str) -> int:
        return self.gpus.get(stage, 0)

    def image_for(self, stage: str) -> str:
        if self.gpus_for(stage) == 0:
            return self.image
        return self.rollout_image if GPU_IMAGE_ROLE[stage] == "rollout" else self.train_image


RETRY_BACKOFF_S = 60  # before the first retry; doubled before each next one


def retry_window_s(timeout_s: int, retries: int) -> int:
    """How long after a task's first start a retry may still begin (Argo's ``retryStrategy.backoff.maxDuration``,
    counted from the first attempt's start, also caps each retry's deadline): every attempt's deadline plus the
    backoffs between them, so a task that fails after hours of work is still retried."""
    return (retries + 1) * timeout_s + sum(RETRY_BACKOFF_S * 2**i for i in range(retries))


def wire(task: dsl.PipelineTask, stage: str, opts: KubeOptions | None, display_name: str) -> dsl.PipelineTask:
    """Apply display name, caching, retries and (with ``opts``) the Kubernetes settings to one task."""
    task.set_display_name(display_name)
    # Off for every task: each run writes a new run folder and registers a new version, so a cache hit
    # would replay another run's URIs; the stochastic stages (generate, rescore, train, evaluate) must rerun.
    task.set_caching_options(False)
    if opts is None:
        return task
    # Every task is safe to redo (a preempted node, an S3 hiccup): the stages publish once per request and return
    # what an earlier attempt published (stages.common.once), train resumes from the checkpoints it publishes
    # (PipelineConfig.checkpoint_every), register finds the version an earlier attempt registered, and promoting
    # a stage to the version it points at is a no-op.
    timeout_s = opts.timeout_s.get(stage, DEFAULT_TIMEOUT_S[stage])
    if opts.retries:
        task.set_retry(
            opts.retries,
            backoff_duration=f"{RETRY_BACKOFF_S}s",
            backoff_factor=2.0,
            backoff_max_duration=f"{retry_window_s(timeout_s, opts.retries)}s",
        )
    kubernetes.set_timeout(task, timeout_s)
    if stage in MODEL_CACHE_STAGES and opts.model_cache_size:
        # An emptyDir, not a generic ephemeral PVC: the images run as UID 10001, a fresh PVC's root is owned by
        # root, and KFP cannot set the pod's fsGroup; an emptyDir is writable by any user and goes with the pod.
        kubernetes.empty_dir_mount(
            task, volume_name="model-cache", mount_path=MODEL_CACHE_PATH, size_limit=opts.model_cache_size
        )
        task.set_env_variable("SDARFLOW_CACHE", MODEL_CACHE_PATH)
    task.set_container_image(opts.image_for(stage))
    # KFP >= 2.16 adds the rest that Pod Security "restricted" checks (no privilege escalation, capabilities
    # dropped, RuntimeDefault seccomp; backend/src/v2/compiler/argocompiler/security_context.go) but not
    # runAsNonRoot on the task's own container, since user images may run as root: ours do not.
    kubernetes.set_security_context(
        task, run_as_user=opts.run_as_user, run_as_group=opts.run_as_user, run_as_non_root=True
    )
    cpu, memory = opts.cpu.get(stage, DEFAULT_CPU[stage]), opts.memory.get(stage, DEFAULT_MEMORY[stage])
    # Limits = requests: an over-eager rollout batch is OOM-killed in its own pod, not evicting its neighbours, and a
    # namespace whose policy requires limits admits the task's container (--cpu raises a throttled task's share).
    task.set_cpu_request(cpu).set_cpu_limit(cpu)
    task.set_memory_request(memory).set_memory_limit(memory)
    gpus = opts.gpus_for(stage)
    if gpus:
        task.set_accelerator_type(opts.gpu_resource).set_accelerator_limit(gpus)
        kubernetes.empty_dir_mount(
            task, volume_name="dshm", mount_path="/dev/shm", medium="Memory", size_limit=opts.shm_size
        )
        for key, value in sorted(opts.node_selector.items()):
            kubernetes.add_node_selector(task, label_key=key, label_value=value)
        for tol in opts.tolerations:
            kubernetes.add_toleration(task, **tol.as_dict())
    for key, value in kueue_labels(opts.queue, opts.priority).items():
        kubernetes.add_pod_label(task, key, value)
    if opts.image_pull_secrets:
        kubernetes.set_image_pull_secrets(task, list(opts.image_pull_secrets))
    if opts.s3_secret:
        # Credentials reach the pod only as env vars from the Secret: nothing secret is in the pipeline spec.
        kubernetes.use_secret_as_env(task, opts.s3_secret, {k: k for k in S3_KEYS})
        kubernetes.use_secret_as_env(task, opts.s3_secret, {k: k for k in S3_OPTIONAL_KEYS}, optional=True)
    return task
