"""``sdarflow pipeline``: compile the KFP pipelines to IR YAML (with their Kubernetes settings), upload them, run
them and schedule recurring runs on a KFP server, and write a multi-node Kubeflow Trainer TrainJob (examples:
docs/cluster.md). Heavy imports (kfp, the pipelines package) happen inside the handlers."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from pathlib import Path

from sdarflow.cli.common import (
    BUILT_IMAGES,
    IMAGE_KEYS,
    PRESET_NAMES,
    ReadsPath,
    built_images,
    emit,
    output_flag,
    pairs,
    pinned_image,
    run_as_user_flag,
    study_flags,
)
from sdarflow.defaults import S3_SECRET
from sdarflow.errors import ConfigError

log = logging.getLogger(__name__)

PIPELINES = ("training", "promote", "study", "smoke")
PACKAGE_FIX = "compile one first: sdarflow pipeline compile --output FILE.yaml"


def kube_options(args: argparse.Namespace):
    """``KubeOptions`` from the compile flags over the training preset's sizes (the other pipelines: defaults);
    images from the flags, else ``images/built.json``, else the release tags (with a warning)."""
    from pipelines.kube import KubeOptions, Toleration

    # the smoke pipeline's one task asks what the training pipeline's train task asks
    opts = KubeOptions.for_preset(args.preset if args.pipeline in ("training", "smoke") else None)
    built = built_images(BUILT_IMAGES)
    images = {k: getattr(args, k) or built.get(k) or getattr(opts, k) for k in IMAGE_KEYS}
    tolerations = opts.tolerations
    if args.toleration:
        # Any --toleration replaces the default one; '--toleration none' drops them all.
        tolerations = [Toleration.parse(t) for t in args.toleration if t != "none"]
    kube = KubeOptions.from_dict(
        {
            **images,
            "gpu_resource": args.gpu_resource,
            "gpus": {**opts.gpus, **pairs(args.gpus, "--gpus")},
            "node_selector": pairs(args.node_selector, "--node-selector"),
            "tolerations": tolerations,
            "s3_secret": args.s3_secret,
            "cpu": {**opts.cpu, **pairs(args.cpu, "--cpu")},
            "memory": {**opts.memory, **pairs(args.memory, "--memory")},
            "retries": args.retries,
            "timeout_s": {**opts.timeout_s, **pairs(args.timeout, "--timeout")},
            "shm_size": opts.shm_size if args.shm_size is None else args.shm_size,
            "model_cache_size": opts.model_cache_size
            if args.model_cache_size is None
            else args.model_cache_size,
            "pipeline_root": args.pipeline_root,
            "queue": args.queue,
            "priority": args.priority,
            "image_pull_secrets": args.image_pull_secret,
            "run_as_user": args.run_as_user,
            "parallelism": args.parallelism,
        }
    )
    # after the settings' checks, so a bad flag is the only line a failing compile prints
    if not built and not all(getattr(args, k) for k in IMAGE_KEYS):
        release = ", ".join(images[k] for k in IMAGE_KEYS)
        if args.preset == "production" and not args.allow_release_tags:
            raise ConfigError(
                f"pipeline compile: no {BUILT_IMAGES} from `make images` and not every --image flag, so the tasks "
                f"would run the release tags ({release}), which move with each release and which a private "
                f"registry or an allowed-registries policy refuses; fix: run `make images` in this folder, pass "
                f"--image, --train-image and --rollout-image, or --allow-release-tags"
            )
        log.warning(
            "pipeline compile: no %s from `make images`: the tasks use the release tags (%s); pin the images you "
            "pushed with `make images` or --image/--train-image/--rollout-image",
            BUILT_IMAGES,
            release,
        )
    return kube


def compile_pipeline(
    out: str,
    pipeline: str = "training",
    rounds: int = 2,
    shards: int = 1,
    kube=None,
    methods: list[str] | None = None,
    seeds: list[int] | None = None,
    preset: str | None = "production",
) -> Path:
    """Write the KFP IR YAML of the training, promotion or study pipeline to ``out``; ``preset`` sets the
    training pipeline's parameter defaults (``sdarflow.sizes.PIPELINE_PRESETS``)."""
    from kfp import compiler

    from pipelines.kube import KubeOptions

    kube = kube or KubeOptions()
    if pipeline == "training":
        from pipelines.training import build_training_pipeline

        func = build_training_pipeline(rounds, shards, kube, preset)
    elif pipeline == "promote":
        from pipelines.promotion import build_promotion_pipeline

        func = build_promotion_pipeline(kube)
    elif pipeline == "study":
        from pipelines.study import build_study_pipeline
        from sdarflow.study import DEFAULT_METHODS, DEFAULT_SEEDS

        func = build_study_pipeline(methods or list(DEFAULT_METHODS), seeds or list(DEFAULT_SEEDS), kube)
    elif pipeline == "smoke":
        from pipelines.smoke import build_smoke_pipeline

        func = build_smoke_pipeline(kube)
    else:
        raise ConfigError(f"unknown pipeline {pipeline!r}; allowed: {', '.join(PIPELINES)}")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(func, package_path=out)
    return Path(out)


def _cmd_compile(args: argparse.Namespace) -> int:
    kube = kube_options(args)
    path = compile_pipeline(
        args.out, args.pipeline, args.rounds, args.shards, kube, args.methods, args.seeds, args.preset
    )
    print(path)
    return 0


def _cmd_upload(args: argparse.Namespace) -> int:
    from pipelines.client import check_backend, connect, upload

    if not args.skip_version_check and args.host:
        check_backend(args.host)
    with contextlib.redirect_stdout(sys.stderr):
        result = upload(connect(args.host, args.namespace), args.package, args.name, args.version_name)
    emit(result)
    return 0


def _submit(args: argparse.Namespace, submit, **kwargs) -> int:
    """Start (``submit``: ``start_run`` or ``schedule``) the ``--package`` or ``--pipeline`` with ``--param``s."""
    from pipelines.client import check_params, connect, resolve_source

    # kfp.Client prints UI links on stdout: they go to stderr, so stdout holds only our JSON for scripts.
    with contextlib.redirect_stdout(sys.stderr):
        client = connect(args.host, args.namespace)
        source = resolve_source(client, args.package, args.pipeline, args.pipeline_version)
        params = check_params(source.spec, pairs(args.param, "--param"))
        kwargs |= {"experiment": args.experiment, "service_account": args.service_account}
        result = submit(client, source, params, **kwargs)
    emit(result)
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from pipelines.client import start_run

    return _submit(args, start_run, run_name=args.run_name)


def _cmd_schedule(args: argparse.Namespace) -> int:
    from pipelines.client import check_cron, schedule

    check_cron(args.cron)  # before any request: a bad cron is the commonest mistake
    return _submit(args, schedule, cron=args.cron, name=args.name, start_from=args.start_from)


def _cmd_trainjob(args: argparse.Namespace) -> int:
    import yaml

    from components import TRAIN_GPU_IMAGE
    from pipelines.kube import Toleration
    from pipelines.trainjob import trainjob_manifest
    from sdarflow import pipeline_config
    from sdarflow.stages.train import TrainConfig

    if bool(args.train_config) == bool(args.pipeline_config):
        raise ConfigError(
            "pipeline trainjob: pass exactly one of --train-config FILE or --pipeline-config URI; fix: drop one, "
            "or add one"
        )
    if args.train_config:
        cfg = TrainConfig.load(args.train_config)
        name = args.name or f"sdar-train-{Path(args.train_config).stem}"
    else:
        if not args.rescored:
            raise ConfigError(
                "--pipeline-config needs --rescored URI (the round's rescore output); fix: add --rescored"
            )
        pc = pipeline_config.load(args.pipeline_config)
        io = {"input": args.rescored, "adapter": args.adapter or ""}
        cfg = pipeline_config.stage_config(pc, "train", args.round, **io)
        name = args.name or f"sdar-train-{pc.run_id}-r{args.round}"
    specs = [t for t in args.toleration or [] if t != "none"]
    manifest = trainjob_manifest(
        cfg,
        name=name,
        image=args.image or pinned_image("train_image", TRAIN_GPU_IMAGE, "--image"),
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        gpu_resource=args.gpu_resource,
        cpu=args.cpu,
        memory=args.memory,
        runtime=args.runtime,
        namespace=args.namespace,
        s3_secret=args.s3_secret,
        node_selector=pairs(args.node_selector, "--node-selector"),
        tolerations=[Toleration.parse(t) for t in specs] if args.toleration else None,
        queue=args.queue,
        priority=args.priority,
        image_pull_secrets=args.image_pull_secret,
        run_as_user=args.run_as_user,
        shm_size=args.shm_size,
        model_cache_size=args.model_cache_size,
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(yaml.safe_dump(manifest, sort_keys=False))
    print(args.out)
    return 0


def _scheduling_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpu-resource", default="nvidia.com/gpu", help="extended resource name of a GPU")
    p.add_argument(
        "--node-selector", action="append", metavar="KEY=VALUE", help="GPU pool label [repeatable]"
    )
    p.add_argument(
        "--toleration",
        action="append",
        metavar="KEY[=VALUE][:EFFECT]",
        help="replaces the default nvidia.com/gpu:NoSchedule; 'none' for no tolerations [repeatable]",
    )
    p.add_argument("--s3-secret", default=S3_SECRET, help="Secret with AWS_* keys; '' = none (IRSA etc.)")
    p.add_argument(
        "--image-pull-secret",
        action="append",
        default=[],
        metavar="NAME",
        help="docker-registry Secret every pod pulls its image with, for a private registry [repeatable]",
    )
    run_as_user_flag(p)
    p.add_argument(
        "--queue",
        default="",
        help="Kueue LocalQueue of every task (the kueue.x-k8s.io/queue-name pod label), so the namespace's quotas "
        "and priority classes apply; '' = none",
    )
    p.add_argument(
        "--priority",
        default="",
        help="Kueue WorkloadPriorityClass of every task (the kueue.x-k8s.io/priority-class label; needs --queue): "
        "which queued workloads are admitted first and which preempted for them; '' = none",
    )


def _server_flags(p: argparse.ArgumentParser, source: bool = True) -> None:
    p.add_argument(
        "--host",
        default=os.environ.get("KF_PIPELINES_ENDPOINT"),
        help="KFP API URL, e.g. http://localhost:8080 (default $KF_PIPELINES_ENDPOINT); token from $KFP_TOKEN",
    )
    p.add_argument("--namespace", help="profile namespace (multi-user KFP)")
    if source:
        p.add_argument("--package", action=ReadsPath, fix=PACKAGE_FIX, help="compiled pipeline YAML")
        p.add_argument("--pipeline", help="or: an uploaded pipeline's name")
        p.add_argument("--pipeline-version", help="with --pipeline: this version (default: the newest)")
        p.add_argument(
            "--param", action="append", metavar="KEY=VALUE", help="pipeline parameter [repeatable]"
        )
        p.add_argument("--experiment", default="sdarflow", help="KFP experiment (created if missing)")
        p.add_argument("--service-account", help="Kubernetes ServiceAccount the run's pods use")


def _add_compile(c: argparse.ArgumentParser, smoke: bool = False) -> None:
    """``pipeline compile``'s flags; ``smoke``: ``pipeline smoke``'s, the same without the pipeline's shape."""
    output_flag(c, "the compiled KFP IR YAML", required=True)
    if smoke:
        c.set_defaults(pipeline="smoke", rounds=1, shards=1, methods=None, seeds=None)
    else:
        c.add_argument(
            "--pipeline", default="training", choices=PIPELINES, help="which pipeline (default training)"
        )
        c.add_argument("--rounds", type=int, default=2, help="RL rounds, unrolled at compile time")
        c.add_argument("--shards", type=int, default=1, help="parallel generate tasks per round")
    c.add_argument(
        "--preset",
        default="production",
        choices=("production", "reference", "reference-search", *PRESET_NAMES),
        help="the training pipeline's parameter defaults in the KFP UI and its tasks' GPUs, memory and deadlines: "
        "production (a 7B model's LoRA, train on 8 GPUs, vLLM and DeepSpeed: 128 tasks x 8 a round, 256 x 8 "
        "evaluated), reference (the SDAR reference's ALFWorld step as a round: 16 tasks x 8, 50 turns, 512 tokens, "
        "weight decay 0.01; train on 2 GPUs), reference-search (its search step on search-qa: 128 x 8, 4 turns, "
        "4096-token prompts; train on 4 GPUs) or a demo size (demo, smoke and pretrained run without GPUs; "
        "default production)",
    )
    if not smoke:
        study_flags(c, "--pipeline study: ")
    c.add_argument("--image", help="CPU image (default: components.IMAGE)")
    c.add_argument("--train-image", help="GPU image of rescore and train (default: the -train-gpu image)")
    c.add_argument(
        "--rollout-image", help="GPU image of generate and evaluate (default: the -rollout-gpu image)"
    )
    c.add_argument(
        "--allow-release-tags",
        action="store_true",
        help=f"with --preset production (the default), compile even without {BUILT_IMAGES} or the three --image "
        "flags: the tasks then run the release tags",
    )
    c.add_argument(
        "--gpus",
        action="append",
        metavar="STAGE=N",
        help="GPUs of generate|rescore|train|evaluate (default: the preset's, e.g. production's train 8; "
        "pipelines.kube.PRESET_RESOURCES)",
    )
    c.add_argument("--cpu", action="append", metavar="STAGE=CPU", help="CPU request of a task [repeatable]")
    c.add_argument("--memory", action="append", metavar="STAGE=SIZE", help="memory of a task [repeatable]")
    c.add_argument(
        "--retries",
        type=int,
        default=2,
        help="retries of generate, rescore, train (resuming from its checkpoints) and evaluate",
    )
    c.add_argument(
        "--timeout",
        action="append",
        metavar="STAGE=SECONDS",
        help="a task's deadline (default: the preset's, pipelines.kube.PRESET_RESOURCES) [repeatable]",
    )
    c.add_argument(
        "--shm-size", help="memory-backed /dev/shm of GPU tasks, for NCCL and vLLM (default: the preset's)"
    )
    c.add_argument(
        "--model-cache-size",
        help="size limit of the emptyDir holding the base model in model-loading tasks (default: the preset's, "
        "node ephemeral storage); '' = the container's disk",
    )
    c.add_argument("--pipeline-root", default="", help="where KFP keeps its artifacts, e.g. s3://bucket/kfp")
    c.add_argument(
        "--parallelism", type=int, default=0, help="--pipeline study: cells running at once (default 0: all)"
    )
    _scheduling_flags(c)
    c.set_defaults(func=_cmd_compile)


def _add_upload(u: argparse.ArgumentParser) -> None:
    _server_flags(u, source=False)
    u.add_argument(
        "--package", required=True, action=ReadsPath, fix=PACKAGE_FIX, help="compiled pipeline YAML"
    )
    u.add_argument("--name", help="pipeline name (default: the spec's, sdar-training or sdar-promotion)")
    u.add_argument("--version-name", help="version name (default: NAME-<sdarflow version>-<UTC time>)")
    u.add_argument(
        "--skip-version-check",
        action="store_true",
        help="upload to a KFP backend older than 2.15 (not supported)",
    )
    u.set_defaults(func=_cmd_upload)


def _add_run(r: argparse.ArgumentParser) -> None:
    _server_flags(r)
    r.add_argument("--run-name", help="run name (default: sdarflow-<UTC time>)")
    r.set_defaults(func=_cmd_run)


def _add_schedule(s: argparse.ArgumentParser) -> None:
    _server_flags(s)
    s.add_argument("--cron", required=True, help="6-field cron, seconds first: '0 0 3 * * *' = 03:00 daily")
    s.add_argument("--name", default="sdarflow-retraining", help="recurring run name")
    s.add_argument(
        "--start-from",
        default="production",
        help="start_adapter of each run: production (default), staging, latest, a version, or '' (new LoRA)",
    )
    s.set_defaults(func=_cmd_schedule)


def _add_trainjob(t: argparse.ArgumentParser) -> None:
    from pipelines.kube import KubeOptions

    output_flag(t, "the TrainJob manifest (YAML)", required=True)
    t.add_argument(
        "--train-config", action=ReadsPath, help="a train stage YAML (as for `sdarflow train --config`)"
    )
    t.add_argument(
        "--pipeline-config", action=ReadsPath, help="or: a run's pipeline.yaml URI (from its prepare task)"
    )
    t.add_argument("--round", type=int, default=0, help="with --pipeline-config: the RL round")
    t.add_argument("--rescored", action="append", help="with --pipeline-config: rescore output URI(s)")
    t.add_argument("--adapter", help="with --pipeline-config: adapter to continue (the previous round's)")
    t.add_argument("--name", help="TrainJob name (default: sdar-train-<run id>-r<round>)")
    t.add_argument("--namespace", help="namespace of the TrainJob")
    t.add_argument("--image", help="trainer image (default: the -train-gpu image)")
    t.add_argument("--nodes", type=int, default=2, help="nodes (pods) of the TrainJob (default 2)")
    t.add_argument("--gpus-per-node", type=int, default=8, help="GPUs (ranks) per node (default 8)")
    t.add_argument("--cpu", default="32", help="CPU request per node")
    t.add_argument("--memory", default="256Gi", help="memory per node")
    t.add_argument("--runtime", default="torch-distributed", help="ClusterTrainingRuntime name")
    t.add_argument(
        "--shm-size", default=KubeOptions.shm_size, help="memory-backed /dev/shm per node, for NCCL"
    )
    t.add_argument(
        "--model-cache-size",
        default=KubeOptions.model_cache_size,
        help="size limit of the emptyDir each node copies the base model to; '' = the container's disk",
    )
    _scheduling_flags(t)
    t.set_defaults(func=_cmd_trainjob)


SUBCOMMANDS = {
    "compile": ("write a pipeline's KFP IR YAML", _add_compile),
    "upload": ("upload a compiled pipeline (a new version if the name exists)", _add_upload),
    "run": ("start a run", _add_run),
    "schedule": ("create a recurring run (no catch-up, one at a time)", _add_schedule),
    "trainjob": ("write a Kubeflow Trainer TrainJob for a multi-node train stage", _add_trainjob),
    "smoke": (
        "write the one-task pipeline a team runs first: a pod wired as the train task's checks the cluster",
        lambda p: _add_compile(p, smoke=True),
    ),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the subcommands of ``sdarflow pipeline`` (the top-level CLI made ``p``)."""
    sub = p.add_subparsers(dest="pipeline_command", required=True)
    for name, (help_text, add) in SUBCOMMANDS.items():
        add(sub.add_parser(name, help=help_text))
