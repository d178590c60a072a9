"""``sdarflow pipeline trainjob``: a Kubeflow Trainer v2 TrainJob from the train stage's config, checked
structurally against the Trainer v2.2 API fields (the CRD schema is not available offline), with its core
Kubernetes parts (env, resources, node selector, tolerations) validated as a Pod by kubernetes-validate, and its
command checked to rebuild exactly the same train config through the sdarflow CLI."""

from __future__ import annotations

import dataclasses
import json
import re

import kubernetes_validate
import pytest
import yaml

from pipelines.kube import Toleration
from pipelines.trainjob import job_name, stage_flags, trainjob_manifest
from sdarflow import pipeline_config
from sdarflow.cli import build_parser
from sdarflow.pipeline_config import PipelineConfig
from sdarflow.stages.train import TrainConfig

K8S = "1.37.0"
# spec.trainer fields of trainer.kubeflow.org/v1alpha1 (pkg/apis/trainer/v1alpha1/trainjob_types.go, v2.2)
TRAINER_FIELDS = {"image", "command", "args", "env", "numNodes", "resourcesPerNode", "numProcPerNode"}
SPEC_FIELDS = {
    "runtimeRef",
    "initializer",
    "trainer",
    "runtimePatches",
    "suspend",
    "activeDeadlineSeconds",
    "managedBy",
}


def train_config(**overrides) -> TrainConfig:
    values = {
        "input": ["s3://sdarflow/runs/r1/round=1/rescore"],
        "model": "s3://sdarflow/models/base",
        "adapter": "s3://sdarflow/runs/r1/round=0/train",
        "output": "s3://sdarflow/runs/r1/round=1/train-multinode",
        "sdar_coef": 0.02,
        "lora_targets": ["q_proj", "v_proj"],
        "norm_by_std": False,
        "overwrite": True,
    }
    return TrainConfig.from_dict({**values, **overrides})


def as_pod(manifest: dict) -> dict:
    """The trainer's container and scheduling as a Pod, so the core v1 schemas check them strictly."""
    trainer = manifest["spec"]["trainer"]
    pod_spec = {
        "containers": [
            {
                "name": "node",
                "image": trainer["image"],
                "command": trainer["command"],
                "env": trainer.get("env", []),
                "resources": trainer["resourcesPerNode"],
            }
        ]
    }
    for patch in manifest["spec"].get("runtimePatches", []):
        (job,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        pod_patch = dict(job["template"]["spec"]["template"]["spec"])
        for container in pod_patch.pop(
            "containers", []
        ):  # a ContainerPatch merges into the runtime's container
            (target,) = [c for c in pod_spec["containers"] if c["name"] == container["name"]]
            target.update(container)
        pod_spec.update(pod_patch)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": manifest["metadata"]["name"]},
        "spec": pod_spec,
    }


def test_manifest_structure_and_core_schemas():
    cfg = train_config()
    manifest = trainjob_manifest(
        cfg,
        name="SDAR train/Run_1",
        image="ghcr.io/sdarflow/sdarflow-train-gpu:0.1.0",
        nodes=4,
        gpus_per_node=8,
        node_selector={"sdarflow.io/pool": "gpu"},
        namespace="sdarflow",
    )
    assert manifest["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and manifest["kind"] == "TrainJob"
    name = manifest["metadata"]["name"]
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 63
    spec = manifest["spec"]
    assert set(spec) <= SPEC_FIELDS and set(spec["trainer"]) <= TRAINER_FIELDS
    assert spec["runtimeRef"] == {
        "name": "torch-distributed",
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
    }
    trainer = spec["trainer"]
    assert trainer["numNodes"] == 4 and trainer["numProcPerNode"] == 8
    assert trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == 8
    assert trainer["command"][:4] == ["torchrun", "--module", "sdarflow.cli", "train"]
    (patch,) = spec["runtimePatches"]
    assert patch["manager"] == "sdarflow.io/pipeline-cli"
    (job,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert job["name"] == "node"
    kubernetes_validate.validate(as_pod(manifest), K8S, strict=True)
    # credentials by reference only
    env = {e["name"]: e for e in trainer["env"]}
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": "sdarflow-s3",
        "key": "AWS_SECRET_ACCESS_KEY",
    }
    assert all("value" not in e for e in trainer["env"] if e["name"].startswith("AWS_"))
    # limits = requests; NCCL's /dev/shm and the base model's copy on emptyDirs, each node once
    assert trainer["resourcesPerNode"]["limits"]["cpu"] == trainer["resourcesPerNode"]["requests"]["cpu"]
    pod = as_pod(manifest)["spec"]
    volumes = {v["name"]: v["emptyDir"] for v in pod["volumes"]}
    assert volumes == {
        "dshm": {"medium": "Memory", "sizeLimit": "16Gi"},
        "model-cache": {"sizeLimit": "200Gi"},
    }
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert mounts == {"dshm": "/dev/shm", "model-cache": env["SDARFLOW_CACHE"]["value"]}
    bare = as_pod(trainjob_manifest(cfg, name="t", image="i", gpus_per_node=0, model_cache_size=""))["spec"]
    assert "volumes" not in bare and "volumeMounts" not in bare["containers"][0]  # no GPU: no NCCL


@pytest.mark.parametrize("engine", ["auto", "torch"])
def test_command_rebuilds_the_same_train_config_on_deepspeed(engine):
    """Every rank runs the config it was given, except the engine: one process per GPU needs DeepSpeed."""
    cfg = dataclasses.replace(train_config(), engine=engine)
    manifest = trainjob_manifest(cfg, name="t", image="img", tolerations=[])
    argv = manifest["spec"]["trainer"]["command"][3:]
    args = build_parser().parse_args(argv)
    overrides = {
        k: v for k, v in vars(args).items() if k in TrainConfig.__dataclass_fields__ and v is not None
    }
    rebuilt = TrainConfig.load(None, **overrides)
    assert rebuilt.to_dict() == dataclasses.replace(cfg, engine="deepspeed").to_dict()
    assert rebuilt.config_hash() == manifest["metadata"]["annotations"]["sdarflow.io/config-hash"]
    (patch,) = manifest["spec"]["runtimePatches"]  # no selector or tolerations: security context and volumes
    (job,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert set(job["template"]["spec"]["template"]["spec"]) == {"securityContext", "containers", "volumes"}
    assert (
        "--sdar-coef" in argv and "--no-norm-by-std" in argv and "--gate-beta" not in argv
    )  # only changed settings


def test_cli_from_a_runs_pipeline_config(tmp_path):
    pc = PipelineConfig(
        storage=str(tmp_path / "store"), base_model="s3://sdarflow/models/base", sdar_coef=0.05
    )
    config_uri = pipeline_config.prepare(pc)
    out = tmp_path / "trainjob.yaml"
    from sdarflow.cli import main

    argv = ["pipeline", "trainjob", "--output", str(out), "--pipeline-config", config_uri, "--round", "1"]
    argv += ["--rescored", "s3://sdarflow/r/round=1/rescore", "--nodes", "2", "--gpus-per-node", "4"]
    argv += ["--toleration", "dedicated=ml:NoExecute", "--namespace", "sdarflow"]
    assert main(argv) == 0
    manifest = yaml.safe_load(out.read_text())
    command = manifest["spec"]["trainer"]["command"]
    assert command[command.index("--sdar-coef") + 1] == "0.05"
    assert command[command.index("--input") + 1] == "s3://sdarflow/r/round=1/rescore"
    assert command[command.index("--output") + 1].endswith("/round=1/train")
    assert "--checkpoint-uri" not in command  # a mirror would hold only rank 0's node's files
    assert manifest["metadata"]["name"].startswith("sdar-train-") and manifest["metadata"]["name"].endswith(
        "-r1"
    )
    pod = as_pod(manifest)
    assert pod["spec"]["tolerations"] == [
        {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoExecute"}
    ]
    kubernetes_validate.validate(pod, K8S, strict=True)


def test_trainjob_runs_the_train_image_make_images_built(tmp_path, monkeypatch):
    from sdarflow.cli import main

    cfg = tmp_path / "train.yaml"
    cfg.write_text(yaml.safe_dump(train_config().to_dict()))
    monkeypatch.chdir(tmp_path)  # where `make images` ran
    (tmp_path / "images").mkdir()
    built = {"image": "c", "train_image": "reg.example/sdarflow-train-gpu:0.1.0-abc", "rollout_image": "r"}
    (tmp_path / "images" / "built.json").write_text(json.dumps(built))
    assert main(["pipeline", "trainjob", "--output", "t.yaml", "--train-config", str(cfg)]) == 0
    assert (
        yaml.safe_load((tmp_path / "t.yaml").read_text())["spec"]["trainer"]["image"] == built["train_image"]
    )
    assert (
        main(["pipeline", "trainjob", "--output", "t.yaml", "--train-config", str(cfg), "--image", "x:1"])
        == 0
    )
    assert yaml.safe_load((tmp_path / "t.yaml").read_text())["spec"]["trainer"]["image"] == "x:1"


def test_trainjob_flags_need_one_source(tmp_path, capsys):
    from sdarflow.cli import main

    assert main(["pipeline", "trainjob", "--output", str(tmp_path / "t.yaml")]) == 2
    assert "exactly one of --train-config" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "expected"),
    [("Run_2026-01-01T00:00", "run-2026-01-01t00-00"), ("0abc", "sdar-0abc"), ("x" * 80, "x" * 63)],
)
def test_job_names_are_rfc1035_labels(text, expected):
    assert job_name(text) == expected


@pytest.mark.parametrize(
    ("field", "value", "kind"),
    [
        ("cpu", "32 cores", "CPU"),
        ("memory", "256GB", "size"),
        ("shm_size", "1.5Gi", "size"),
        ("model_cache_size", "x", "size"),
    ],
)
def test_a_quantity_the_api_server_would_refuse_is_one_line(field, value, kind):
    from sdarflow.errors import ConfigError

    with pytest.raises(
        ConfigError,
        match=f"pipeline trainjob: --{field.replace('_', '-')}: .* is not a {kind} in the forms sdarflow takes",
    ):
        trainjob_manifest(train_config(), name="n", image="i", **{field: value})


def test_stage_flags_and_tolerations_parse():
    assert stage_flags(TrainConfig()) == []
    assert Toleration.parse("pool=gpu:NoExecute") == Toleration("pool", "NoExecute", "gpu")
    assert Toleration.parse("nvidia.com/gpu") == Toleration("nvidia.com/gpu")


def test_a_kueue_queue_labels_the_trainjob():
    labels = trainjob_manifest(train_config(), name="t", image="img", queue="team-a")["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/queue-name"] == "team-a" and "kueue.x-k8s.io/priority-class" not in labels
    job = trainjob_manifest(train_config(), name="t", image="img", queue="team-a", priority="batch")
    assert job["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "batch"
    assert (
        "kueue.x-k8s.io/queue-name"
        not in trainjob_manifest(train_config(), name="t", image="img")["metadata"]["labels"]
    )


def test_an_image_pull_secret_reaches_the_trainjob_pods():
    job = trainjob_manifest(train_config(), name="t", image="img", image_pull_secrets=["regcred"])
    (patch,) = job["spec"]["runtimePatches"]
    pod = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"][
        "template"
    ]
    assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
