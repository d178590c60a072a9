"""The compiled KFP IR YAML (``sdarflow pipeline compile``) read back: task names, GPU limits, images, node
selectors and tolerations, S3 credentials only from a Secret, resource requests, retries, caching, parameters,
shards as ParallelFor + Collected, and the promotion pipeline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from factories import dag_tasks

from components import IMAGE, ROLLOUT_GPU_IMAGE, TRAIN_GPU_IMAGE
from sdarflow.cli import main

GPU = ("generate", "rescore", "train", "evaluate", "evaluate-base", "evaluate-production")
# evaluate-production-2: production's evaluation where the run does not promote (says "not needed" on a CPU)
CPU = (
    "prepare",
    "extract-skills",
    "register",
    "promote-candidate",
    "run-report",
    "skip-run",
    "evaluate-production-2",
)
CANARY = "canary-secret-value-that-must-not-leak"


def compile_spec(tmp_path: Path, *flags: str) -> tuple[dict, dict, str]:
    """(pipeline spec, platform spec, raw text) of a compile run with ``flags``."""
    out = tmp_path / "pipeline.yaml"
    assert main(["pipeline", "compile", "--output", str(out), "--allow-release-tags", *flags]) == 0
    text = out.read_text()
    docs = list(yaml.safe_load_all(text))
    return docs[0], (docs[1] if len(docs) > 1 else {}), text


def executor(spec: dict, task: dict) -> dict:
    component = spec["components"][task["componentRef"]["name"]]
    return spec["deploymentSpec"]["executors"][component["executorLabel"]]["container"]


def k8s_executor(spec: dict, platform: dict, task: dict) -> dict:
    label = spec["components"][task["componentRef"]["name"]]["executorLabel"]
    return platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"].get(label, {})


@pytest.fixture
def spec(tmp_path, monkeypatch):
    # A credential in the compiling environment must not end up in the spec.
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", CANARY)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", CANARY)
    return compile_spec(
        tmp_path,
        "--rounds",
        "1",
        "--gpus",
        "train=4",
        "--node-selector",
        "sdarflow.io/pool=gpu",
        "--toleration",
        "nvidia.com/gpu:NoSchedule",
        "--toleration",
        "dedicated=ml:NoExecute",
        "--pipeline-root",
        "s3://kfp-artifacts/sdar",
    )


def test_task_names_and_round_suffixes(tmp_path):
    spec, _, _ = compile_spec(tmp_path, "--rounds", "2")
    tasks = set(dag_tasks(spec))
    assert {"prepare", "generate", "extract-skills", "rescore", "train", "evaluate", "register"} <= tasks
    # KFP suffixes later rounds' task names; display names say the round
    assert {"generate-2", "extract-skills-2", "rescore-2", "train-2", "evaluate-2", "register-2"} <= tasks
    assert dag_tasks(spec)["train-2"]["taskInfo"]["name"] == "train (round 1)"
    # round 1 generates with round 0's adapter
    adapter = dag_tasks(spec)["generate-2"]["inputs"]["artifacts"]["adapter"]
    assert adapter["taskOutputArtifact"]["producerTask"] == "train"
    # registry versions follow the rounds: round 1 registers after round 0
    assert "register" in dag_tasks(spec)["register-2"]["dependentTasks"]


def test_data_flows_as_typed_artifacts_so_the_ui_shows_lineage(tmp_path):
    """Every stage's output is a typed artifact (trajectories, skills and rescored rows as Dataset, the adapter as
    Model) and the tasks that read it take it as an input artifact: the UI draws each round's lineage."""
    spec, _, _ = compile_spec(tmp_path, "--rounds", "2")
    tasks = dag_tasks(spec)

    def producer(task: str, name: str) -> tuple[str, str]:
        ref = tasks[task]["inputs"]["artifacts"][name]["taskOutputArtifact"]
        return ref["producerTask"], ref["outputArtifactKey"]

    kinds = {
        (component, name): a["artifactType"]["schemaTitle"]
        for component, c in spec["components"].items()
        for name, a in c.get("outputDefinitions", {}).get("artifacts", {}).items()
    }
    assert kinds[("comp-generate", "trajectories")] == "system.Dataset"
    assert kinds[("comp-extract-skills", "library")] == "system.Dataset"
    assert kinds[("comp-rescore", "rescored")] == "system.Dataset"
    assert kinds[("comp-train", "trained")] == "system.Model"
    assert kinds[("comp-evaluate", "evaluation")] == "system.Artifact"
    assert kinds[("comp-evaluate-base", "evaluation")] == "system.Artifact"
    # the gate pairs the candidate with production evaluated on the run's tasks: a OneOf of an If/Else, whose If
    # branch (the run promotes to production) evaluates on a GPU
    chosen = tasks["promote-candidate"]["inputs"]["parameters"]["production_evaluation"][
        "taskOutputParameter"
    ]
    branches = spec["components"][f"comp-{chosen['producerTask']}"]["dag"]["tasks"].values()
    conditions = {
        name: branch["triggerPolicy"]["condition"]
        for branch in branches
        for name in spec["components"][branch["componentRef"]["name"]]["dag"]["tasks"]
    }
    assert conditions["evaluate-production"].endswith("promote_to'] == 'production'")
    assert conditions["evaluate-production-2"].startswith("!(")  # the Else branch
    for suffix, before in (("", None), ("-2", "")):
        assert producer(f"extract-skills{suffix}", "trajectories") == (f"generate{suffix}", "trajectories")
        assert producer(f"rescore{suffix}", "skills") == (f"extract-skills{suffix}", "library")
        assert producer(f"train{suffix}", "rescored") == (f"rescore{suffix}", "rescored")
        assert producer(f"evaluate{suffix}", "adapter") == (f"train{suffix}", "trained")
        # every round is compared with the base model, evaluated once per run on the same tasks
        assert producer(f"evaluate{suffix}", "baseline") == ("evaluate-base", "evaluation")
        register = {
            name: producer(f"register{suffix}", name)
            for name in tasks[f"register{suffix}"]["inputs"]["artifacts"]
        }
        assert register == {
            "adapter": (f"train{suffix}", "trained"),
            "evaluation": (f"evaluate{suffix}", "evaluation"),
            "base_evaluation": ("evaluate-base", "evaluation"),
            "skills": (f"extract-skills{suffix}", "library"),
            "rescored": (f"rescore{suffix}", "rescored"),
            "trajectories": (f"generate{suffix}", "trajectories"),
        }
        if before is not None:  # round 1 continues from round 0's adapter, library and teacher gaps
            for task in ("generate-2", "rescore-2", "train-2"):
                assert producer(task, "adapter") == ("train", "trained"), task
            assert producer("extract-skills-2", "previous") == ("extract-skills", "library")
            assert producer("extract-skills-2", "rescored") == ("rescore", "rescored")
        else:  # round 0: no adapter to continue from (the run's start adapter comes through the config)
            assert "adapter" not in tasks["generate"]["inputs"].get("artifacts", {})
            assert "adapter" not in tasks["train"]["inputs"].get("artifacts", {})


def test_gpu_stages_get_accelerators_images_and_gpu_pool(spec):
    pipeline, platform, _ = spec
    tasks = dag_tasks(pipeline)
    for name in GPU:
        container = executor(pipeline, tasks[name])
        accel = container["resources"]["accelerator"]
        assert accel["resourceType"] == "nvidia.com/gpu"
        assert accel["resourceCount"] == ("4" if name == "train" else "1")
        expected = TRAIN_GPU_IMAGE if name in ("rescore", "train") else ROLLOUT_GPU_IMAGE
        assert container["image"] == expected
        k8s = k8s_executor(pipeline, platform, tasks[name])
        assert k8s["nodeSelector"]["labels"] == {"sdarflow.io/pool": "gpu"}
        assert {(t["key"], t["operator"], t.get("value"), t["effect"]) for t in k8s["tolerations"]} == {
            ("nvidia.com/gpu", "Exists", None, "NoSchedule"),
            ("dedicated", "Equal", "ml", "NoExecute"),
        }
    for name in CPU:
        container = executor(pipeline, tasks[name])
        assert "accelerator" not in container.get("resources", {})
        assert container["image"] == IMAGE
        k8s = k8s_executor(pipeline, platform, tasks[name])
        assert "nodeSelector" not in k8s and "tolerations" not in k8s


def test_s3_credentials_only_through_the_secret(spec):
    pipeline, platform, text = spec
    assert CANARY not in text
    tasks = dag_tasks(pipeline)
    for name in (*GPU, *CPU):
        entries = k8s_executor(pipeline, platform, tasks[name])["secretAsEnv"]
        mapped = {
            m["envVar"]: (e["secretName"], m["secretKey"], e["optional"])
            for e in entries
            for m in e["keyToEnv"]
        }
        assert mapped["AWS_ACCESS_KEY_ID"] == ("sdarflow-s3", "AWS_ACCESS_KEY_ID", False)
        assert mapped["AWS_SECRET_ACCESS_KEY"] == ("sdarflow-s3", "AWS_SECRET_ACCESS_KEY", False)
        assert mapped["AWS_ENDPOINT_URL"][2] is True  # optional: AWS S3 needs no endpoint
        # no container sets an AWS variable literally
        env = executor(pipeline, tasks[name]).get("env", [])
        assert not [e for e in env if e["name"].startswith("AWS_")]
    # the only places AWS key names appear are the secret mappings
    for line in text.splitlines():
        if "AWS_SECRET_ACCESS_KEY" in line:
            assert line.strip() in ("- envVar: AWS_SECRET_ACCESS_KEY", "secretKey: AWS_SECRET_ACCESS_KEY"), (
                line
            )


def test_requests_retries_caching_and_root(spec):
    pipeline, platform, _ = spec
    tasks = dag_tasks(pipeline)
    for name, task in tasks.items():
        resources = executor(pipeline, task)["resources"]
        assert float(resources["cpuRequest"]) > 0 and resources["resourceMemoryRequest"], name
        # limits too, equal to the requests: a namespace that requires them admits every task
        assert resources["resourceCpuLimit"] == resources["resourceCpuRequest"], name
        assert resources["resourceMemoryLimit"] == resources["resourceMemoryRequest"], name
        # caching off everywhere: every run writes its own folder and registers a new version
        assert not task.get("cachingOptions", {}).get("enableCache", False), name
    assert executor(pipeline, tasks["train"])["resources"]["resourceMemoryRequest"] == "192Gi"  # production
    # every task is retried: each stage returns what an earlier attempt published, train resumes from its
    # checkpoints, register finds its own version
    for name in (*GPU, "prepare", "extract-skills", "register"):
        policy = tasks[name]["retryPolicy"]
        assert policy["maxRetryCount"] == 2, name
        # Argo counts the window from the first attempt's start: it must hold three attempts and the backoffs
        deadline = int(k8s_executor(pipeline, platform, tasks[name])["activeDeadlineSeconds"])
        assert int(policy["backoffMaxDuration"].removesuffix("s")) == 3 * deadline + 60 + 120, name
    assert pipeline["defaultPipelineRoot"] == "s3://kfp-artifacts/sdar"


def test_timeouts_shared_memory_and_the_model_cache_volume(spec):
    """Every task has a deadline (a hung vLLM or NCCL pod must not hold its GPU forever); GPU tasks get a
    memory-backed /dev/shm; model-loading tasks keep the base model on an ephemeral volume, not the container
    layer."""
    from pipelines.kube import MODEL_CACHE_PATH, MODEL_CACHE_STAGES, KubeOptions

    production = KubeOptions.for_preset("production")  # the default preset
    pipeline, platform, _ = spec
    tasks = dag_tasks(pipeline)
    for name, task in tasks.items():
        stage = "evaluate" if name in GPU and name.startswith("evaluate") else name
        stage = "promote" if name in CPU[3:] else stage  # tasks wired with the promote task's settings
        k8s = k8s_executor(pipeline, platform, task)
        assert int(k8s["activeDeadlineSeconds"]) == production.timeout_s[stage], name
        shm = [v for v in k8s.get("emptyDirMounts", []) if v["mountPath"] == "/dev/shm"]
        if name in GPU:
            assert shm == [
                {"volumeName": "dshm", "mountPath": "/dev/shm", "medium": "Memory", "sizeLimit": "32Gi"}
            ]
        else:
            assert not shm, name
        # an emptyDir, writable by the images' non-root user (a fresh PVC is root's, and KFP sets no fsGroup)
        assert "genericEphemeralVolume" not in k8s and "pvcMount" not in k8s, name
        volumes = [v for v in k8s.get("emptyDirMounts", []) if v["volumeName"] == "model-cache"]
        env = {e["name"]: e["value"] for e in executor(pipeline, task).get("env", [])}
        if stage in MODEL_CACHE_STAGES:
            assert volumes == [
                {"volumeName": "model-cache", "mountPath": MODEL_CACHE_PATH, "sizeLimit": "100Gi"}
            ]
            assert env["SDARFLOW_CACHE"] == MODEL_CACHE_PATH
        else:
            assert not volumes and "SDARFLOW_CACHE" not in env, name


def test_flags_override_the_deadlines_and_volumes(tmp_path):
    pipeline, platform, _ = compile_spec(
        tmp_path, "--rounds", "1", "--timeout", "train=86400", "--shm-size", "64Gi", "--model-cache-size", ""
    )
    tasks = dag_tasks(pipeline)
    train = k8s_executor(pipeline, platform, tasks["train"])
    assert int(train["activeDeadlineSeconds"]) == 86400
    assert [v["volumeName"] for v in train["emptyDirMounts"]] == ["dshm"]  # --model-cache-size "": none
    assert train["emptyDirMounts"][0]["sizeLimit"] == "64Gi"


def test_the_run_id_reaches_the_audit_log_as_a_whole_placeholder(spec):
    """KFP resolves a placeholder only when it is a parameter's whole value: the run id goes in alone and the
    component composes the actor."""
    pipeline, _, _ = spec
    tasks = dag_tasks(pipeline)
    for name in ("register", "promote-candidate"):
        value = tasks[name]["inputs"]["parameters"]["kfp_run_id"]["runtimeValue"]["constant"]
        assert value == "{{$.pipeline_job_uuid}}", name


def test_ui_parameters_and_report_artifacts(spec):
    pipeline, _, _ = spec
    params = pipeline["root"]["inputDefinitions"]["parameters"]
    assert params["sdar_coef"]["defaultValue"] == 0.01 and params["gate_beta"]["defaultValue"] == 5.0
    assert params["method"]["defaultValue"] == "sdar"
    for name in ("base_model", "env", "group_size", "retrieval", "registry", "policy_name", "start_adapter"):
        assert name in params
    assert params["gate"]["defaultValue"] == {}  # the registry's gate policy
    assert params["data_cursor"]["defaultValue"] == "continue"  # a scheduled run moves on through the tasks
    assert "defaultValue" not in params["storage"] and "defaultValue" not in params["base_model"]
    for component in (f"comp-{name}" for name in GPU):
        artifacts = pipeline["components"][component]["outputDefinitions"]["artifacts"]
        kinds = {a["artifactType"]["schemaTitle"] for a in artifacts.values()}
        assert {"system.HTML", "system.Markdown", "system.Metrics"} <= kinds, component
    for component in ("comp-extract-skills", "comp-run-report"):  # a report, no metrics
        artifacts = pipeline["components"][component]["outputDefinitions"]["artifacts"]
        assert {"system.HTML", "system.Markdown"} <= {
            a["artifactType"]["schemaTitle"] for a in artifacts.values()
        }


def test_cpu_only_stage_and_no_secret(tmp_path):
    pipeline, platform, _ = compile_spec(tmp_path, "--rounds", "1", "--gpus", "evaluate=0", "--s3-secret", "")
    tasks = dag_tasks(pipeline)
    container = executor(pipeline, tasks["evaluate"])
    assert container["image"] == IMAGE and "accelerator" not in container["resources"]
    assert "tolerations" not in k8s_executor(pipeline, platform, tasks["evaluate"])
    assert "secretAsEnv" not in k8s_executor(pipeline, platform, tasks["train"])


def test_shards_fan_out_generate_and_collect(tmp_path):
    pipeline, platform, _ = compile_spec(tmp_path, "--rounds", "2", "--shards", "3")
    tasks = dag_tasks(pipeline)
    # each round runs the generate-shards sub-pipeline: a ParallelFor over the shards, collected
    assert {"generate-shards", "generate-shards-2"} <= set(tasks) and "generate" not in tasks
    adapter = tasks["generate-shards-2"]["inputs"]["parameters"]["adapter_uri"]
    assert adapter["taskOutputParameter"]["producerTask"] == "train"  # round 1 starts from round 0's adapter
    for fan_out in ("generate-shards", "generate-shards-2"):
        sub = pipeline["components"][tasks[fan_out]["componentRef"]["name"]]["dag"]
        (loop_name,) = sub["tasks"]
        loop = sub["tasks"][loop_name]
        assert loop["parameterIterator"]["items"]["raw"] == "[0, 1, 2]"
        assert sub["outputs"]["parameters"]["Output"]["valueFromParameter"]["producerSubtask"] == loop_name
        inner = pipeline["components"][loop["componentRef"]["name"]]["dag"]["tasks"]
        (name,) = inner
        gen = inner[name]
        assert name == "generate" and gen["retryPolicy"]["maxRetryCount"] == 2
        assert gen["inputs"]["parameters"]["shard"]["componentInputParameter"].startswith(
            "pipelinechannel--loop"
        )
        assert k8s_executor(pipeline, platform, gen)["secretAsEnv"]
        assert executor(pipeline, gen)["resources"]["accelerator"]["resourceCount"] == "1"
    # downstream stages read the union of the shards
    for name in ("extract-skills", "rescore", "register"):
        shards = tasks[name]["inputs"]["parameters"]["trajectory_shards"]
        assert shards["taskOutputParameter"]["producerTask"] == "generate-shards", name
        assert "trajectories" not in tasks[name]["inputs"].get("artifacts", {}), name


def test_promotion_pipeline_spec(tmp_path):
    pipeline, platform, _ = compile_spec(tmp_path, "--pipeline", "promote")
    assert pipeline["pipelineInfo"]["name"] == "sdar-promotion"
    params = pipeline["root"]["inputDefinitions"]["parameters"]
    assert {"name", "version", "stage", "force", "reason", "registry"} <= set(params)
    assert params["tighten"]["defaultValue"] == {}  # the registry's policy
    assert params["stage"]["defaultValue"] == "production" and params["force"]["defaultValue"] is False
    tasks = dag_tasks(pipeline)
    assert set(tasks) == {"promote"}
    assert k8s_executor(pipeline, platform, tasks["promote"])["secretAsEnv"]
    run_id = tasks["promote"]["inputs"]["parameters"]["kfp_run_id"]["runtimeValue"]["constant"]
    assert run_id == "{{$.pipeline_job_uuid}}"


def test_study_pipeline_spec(tmp_path, monkeypatch):
    """The study fans the cells out with a ParallelFor, collects them into the report task (HTML, Markdown and
    Metrics for the UI), and gets the same Kubernetes wiring as training: a cell is a training task."""
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", CANARY)
    flags = ["--pipeline", "study", "--methods", "grpo", "sdar", "--seeds", "0", "1", "--gpus", "train=2"]
    pipeline, platform, text = compile_spec(tmp_path, *flags, "--node-selector", "pool=gpu")
    assert pipeline["pipelineInfo"]["name"] == "sdar-study" and CANARY not in text
    params = pipeline["root"]["inputDefinitions"]["parameters"]
    assert {"out", "base_model", "rounds", "env", "preset", "stage_settings"} <= set(params)
    assert "defaultValue" not in params["out"] and "defaultValue" not in params["base_model"]
    tasks = dag_tasks(pipeline)
    assert set(tasks) == {"study-settings", "study-start", "study-base", "study-cells", "study-report"}
    # the start point (a pretrained base's warm start) is made once, before the base row and the cells
    for task in ("study-base", "study-cells"):
        source = tasks[task]["inputs"]["parameters"]["settings"]["taskOutputParameter"]["producerTask"]
        assert source == "study-start"
    assert executor(pipeline, tasks["study-start"])["image"] == TRAIN_GPU_IMAGE
    sub = pipeline["components"][tasks["study-cells"]["componentRef"]["name"]]["dag"]
    (loop_name,) = sub["tasks"]
    loop = sub["tasks"][loop_name]
    cells = json.loads(loop["parameterIterator"]["items"]["raw"])
    assert cells == [{"method": m, "seed": s} for m in ("grpo", "sdar") for s in (0, 1)]
    inner = pipeline["components"][loop["componentRef"]["name"]]["dag"]["tasks"]
    (cell,) = inner.values()
    container = executor(pipeline, cell)
    # every stage in one pod: the image with vLLM (and DeepSpeed), as the gpu preset rolls out with vLLM
    assert (
        container["image"] == ROLLOUT_GPU_IMAGE
        and container["resources"]["accelerator"]["resourceCount"] == "2"
    )
    assert k8s_executor(pipeline, platform, cell)["nodeSelector"]["labels"] == {"pool": "gpu"}
    assert executor(pipeline, tasks["study-base"])["image"] == ROLLOUT_GPU_IMAGE
    report = tasks["study-report"]
    assert report["inputs"]["parameters"]["cells"]["taskOutputParameter"]["producerTask"] == "study-cells"
    assert executor(pipeline, report)["image"] == IMAGE
    artifacts = pipeline["components"][report["componentRef"]["name"]]["outputDefinitions"]["artifacts"]
    assert {a["artifactType"]["schemaTitle"] for a in artifacts.values()} == {
        "system.HTML", "system.Markdown", "system.Metrics"
    }  # fmt: skip
    assert executor(pipeline, tasks["study-settings"])["image"] == IMAGE
    for task in (cell, tasks["study-base"], report):
        assert k8s_executor(pipeline, platform, task)["secretAsEnv"]
        assert not task.get("cachingOptions", {}).get("enableCache", False)


def test_study_pipeline_needs_grpo(tmp_path, capsys):
    out = str(tmp_path / "p.yaml")
    assert (
        main(
            [
                "pipeline",
                "compile",
                "--output",
                out,
                "--allow-release-tags",
                "--pipeline",
                "study",
                "--methods",
                "sdar",
            ]
        )
        == 2
    )
    assert "must include grpo" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--gpus", "trian=1"], "pipeline compile: gpus: unknown key(s) trian"),
        (["--gpus", "train=x"], "gpus.train = 'x' is not a valid int"),
        (["--toleration", "gpu:Sometimes"], "bad toleration"),
        (["--node-selector", "pool"], "is not KEY=VALUE"),
        (["--shards", "0"], "shards (0) must be >= 1"),
        (["--timeout", "train=0"], "timeout_s.train = 0 must be >= 1"),
        (["--timeout", "trian=60"], "timeout_s: unknown key(s) trian"),
    ],
)
def test_bad_compile_flags_fail_with_the_fix(tmp_path, capsys, flags, message):
    assert (
        main(["pipeline", "compile", "--output", str(tmp_path / "p.yaml"), "--allow-release-tags", *flags])
        == 2
    )
    assert message in capsys.readouterr().err


def test_the_pipelines_parameters_are_the_pipeline_configs():
    """The prepare component and the training pipeline, generated from PipelineConfig, compile to its fields with
    its defaults (shards is fixed at compile time; storage and base_model are required in the pipeline)."""
    import dataclasses

    from components.prepare import prepare
    from pipelines.training import build_training_pipeline
    from sdarflow.pipeline_config import PipelineConfig

    fields = {
        f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
        for f in dataclasses.fields(PipelineConfig)
    }
    assert set(prepare.component_spec.inputs) == set(fields)
    inputs = build_training_pipeline(1).component_spec.inputs
    assert set(inputs) == set(fields) - {"shards"}
    defaults = {name: spec.default for name, spec in inputs.items() if name not in ("storage", "base_model")}
    assert defaults == {name: fields[name] for name in defaults}


def test_the_pipelines_defaults_are_the_stages():
    """A setting the pipeline passes on to a stage defaults to what the stage itself defaults to, so a run from the
    KFP UI and `sdarflow <stage>` agree when nobody sets it."""
    import dataclasses

    from sdarflow.pipeline_config import _SHARED, KL_FROM_ENV, PipelineConfig
    from sdarflow.stages import config_class

    def defaults(cls) -> dict:
        return {
            f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
            for f in dataclasses.fields(cls)
        }

    pipeline = defaults(PipelineConfig)
    # a KFP parameter cannot be None: the pipeline's kl_coef -1 is the train stage's unset (its env preset's)
    assert pipeline["kl_coef"] == KL_FROM_ENV and defaults(config_class("train"))["kl_coef"] is None
    differ = [
        f"{stage}.{dst}: stage {stage_defaults[dst]!r}, pipeline {src} {pipeline[src]!r}"
        for stage, shared in _SHARED.items()
        for stage_defaults in [defaults(config_class(stage))]
        for src, dst in shared.items()
        if stage_defaults[dst] != pipeline[src] and src != "kl_coef"
    ]
    assert differ == []


def test_the_training_knobs_reach_the_stages(tmp_path):
    from sdarflow.pipeline_config import PipelineConfig, stage_config

    knobs = {"lr": 3e-5, "lora_rank": 16, "train_steps": 6, "kl_coef": 0.02, "entropy_coef": 0.0}
    pc = PipelineConfig(
        storage=str(tmp_path), base_model="m", run_id="r", rollout_engine="hf", train_engine="torch", **knobs
    )
    train = stage_config(pc, "train", 0)
    assert (train.lr, train.lora_rank, train.mini_batches, train.kl_coef, train.entropy_coef) == (
        3e-5,
        16,
        6,
        0.02,
        0.0,
    )
    assert train.engine == "torch"
    assert stage_config(pc, "generate", 0).engine == "hf" and stage_config(pc, "evaluate", 0).engine == "hf"
    assert stage_config(PipelineConfig(storage="s", base_model="m"), "train", 0).kl_coef is None  # the env's
    # each round's train publishes its checkpoints in the run's folder, so a retried task resumes there
    assert (train.save_every, train.checkpoint_uri) == (2, str(tmp_path / "runs/r/round=0/train-checkpoints"))
    pc.checkpoint_every = 0
    assert stage_config(pc, "train", 1).checkpoint_uri == ""
    # stage_settings win over the first-class parameters
    pc.stage_settings = {"train": {"lr": 1e-4}}
    assert stage_config(pc, "train", 0).lr == 1e-4


def test_training_options_and_the_format_guard_reach_the_stages(tmp_path):
    from sdarflow.errors import ConfigError
    from sdarflow.pipeline_config import PipelineConfig, stage_config

    pc = PipelineConfig(storage=str(tmp_path), base_model="m", options="scpo+ema", format_guard="repair")
    train, rescore = stage_config(pc, "train", 0), stage_config(pc, "rescore", 0)
    assert (train.credit, train.ema_decay, train.format_guard, rescore.teacher) == (
        "scpo",
        0.99,
        "repair",
        "ema",
    )
    plain = stage_config(PipelineConfig(storage="s", base_model="m"), "train", 0)
    assert (plain.credit, plain.ema_decay, plain.format_guard) == ("outcome", 0.0, "warn")
    pc.stage_settings = {"train": {"ema_decay": 0.9}}  # stage_settings win over the options
    assert stage_config(pc, "train", 0).ema_decay == 0.9
    with pytest.raises(
        ConfigError, match=r"pipeline: options names unknown or repeated option\(s\) \['scop'\]"
    ):
        PipelineConfig(storage="s", base_model="m", options="scop")


@pytest.mark.parametrize(
    "flags",
    [("--preset", "production"), ("--preset", "demo"), ("--pipeline", "promote"), ("--pipeline", "study")],
)
def test_every_ui_parameter_has_a_description(tmp_path, flags):
    spec, _, _ = compile_spec(tmp_path, *flags)
    params = spec["root"]["inputDefinitions"]["parameters"]
    assert len(params) >= 6
    assert [name for name, p in params.items() if not p.get("description", "").strip()] == []
    assert spec["pipelineInfo"].get("description")


def test_presets_set_the_ui_defaults(tmp_path):
    def defaults(preset: str) -> dict:
        spec, _, _ = compile_spec(tmp_path / preset, "--preset", preset)
        return {k: p.get("defaultValue") for k, p in spec["root"]["inputDefinitions"]["parameters"].items()}

    production = defaults("production")  # a 7B model's LoRA on 8 GPUs, as the SDAR reference's ALFWorld runs
    assert (
        production["tasks"],
        production["group_size"],
        production["eval_tasks"],
        production["eval_samples"],
    ) == (128, 8, 256, 8)
    assert (production["lr"], production["lora_rank"]) == (3e-6, 64)
    assert (production["rollout_engine"], production["train_engine"]) == ("vllm", "deepspeed")
    assert production["stage_settings"] == {"train": {"lora_alpha": 64}}
    demo = defaults("demo")  # what `make demo` runs
    assert (demo["tasks"], demo["group_size"], demo["eval_tasks"], demo["lr"], demo["train_steps"]) == (
        24,
        8,
        32,
        2e-3,
        8,
    )
    assert demo["method"] == production["method"] == "sdar"  # what no preset sets stays PipelineConfig's
    # the SDAR reference's step as a round: 16 tasks x 8, 50 turns, 512 tokens, 2 observations, weight decay 0.01
    reference = defaults("reference")
    assert (reference["tasks"], reference["group_size"], reference["max_turns"], reference["lr"]) == (
        16,
        8,
        50,
        3e-6,
    )
    assert reference["stage_settings"]["train"] == {
        "lora_alpha": 64,
        "weight_decay": 0.01,
        "carry_optimizer": True,
    }
    assert reference["stage_settings"]["generate"] == {"max_new_tokens": 512, "history_turns": 2}
    # its search step on search-qa: 128 x 8, 4 turns with 4 in the prompt, 4096-token teacher prompts
    search = defaults("reference-search")
    assert (search["env"], search["tasks"], search["group_size"], search["max_turns"]) == (
        "search-qa",
        128,
        8,
        4,
    )
    assert search["stage_settings"]["generate"] == {"max_new_tokens": 512, "history_turns": 4}
    assert search["stage_settings"]["rescore"] == {"max_prompt_tokens": 4096}
    assert (search["seed_skills"], reference["seed_skills"]) == ("reference", "")  # no ALFWorld library here
    assert search["stage_settings"]["train"] == reference["stage_settings"]["train"]
    with pytest.raises(SystemExit):
        compile_spec(tmp_path / "bad", "--preset", "huge")


def _gib(quantity: str) -> float:
    number, unit = float(quantity.rstrip("GMTi")), quantity.lstrip("0123456789.")
    return number * {"Mi": 1 / 1024, "Gi": 1, "Ti": 1024}[unit]


def _sizes(spec: dict, platform: dict, name: str) -> tuple[int, float, float, int]:
    """(GPUs, memory limit GiB, /dev/shm GiB, deadline seconds) of task ``name``."""
    task = dag_tasks(spec)[name]
    resources = executor(spec, task)["resources"]
    k8s = k8s_executor(spec, platform, task)
    shm = [v["sizeLimit"] for v in k8s.get("emptyDirMounts", []) if v["mountPath"] == "/dev/shm"]
    gpus = int(resources.get("accelerator", {}).get("resourceCount", 0))
    return (
        gpus,
        _gib(resources["resourceMemoryLimit"]),
        _gib(shm[0]) if shm else 0.0,
        int(k8s["activeDeadlineSeconds"]),
    )


def test_presets_size_the_cluster(tmp_path):
    """The 7B presets ask for what a 7B model's LoRA needs (production trains on 8 GPUs, reference on 2 as the
    reference's LoRA script), with deadlines several times the capacity plan's estimate of their round; the demo
    sizes run without GPUs on the CPU image; a memory-backed /dev/shm always fits inside its task's memory limit
    (it counts against it)."""
    from sdarflow import plan
    from sdarflow.sizes import PIPELINE_PRESETS

    stages = ("generate", "rescore", "train", "evaluate")
    train_gpus = {"production": 8, "reference": 2, "reference-search": 4}
    for preset in PIPELINE_PRESETS:
        spec, platform, _ = compile_spec(tmp_path / preset, "--rounds", "1", "--preset", preset)
        sizes = {s: _sizes(spec, platform, s) for s in stages}
        for stage, (gpus, memory, shm, _) in sizes.items():
            assert shm < memory and (shm > 0) == (gpus > 0), (preset, stage)
        if preset in ("demo", "smoke", "pretrained"):
            assert {gpus for gpus, *_ in sizes.values()} == {0}, preset
            assert _images(spec) == {IMAGE}
        if preset in train_gpus:
            ranks = train_gpus[preset]
            assert [sizes[s][0] for s in stages] == [1, 1, ranks, 1], preset
            # each rank's runtime in host memory (its bf16 weights go straight to its GPU)
            assert (sizes["train"][1] - sizes["train"][2]) / ranks >= 16
            settings = PIPELINE_PRESETS[preset]
            # the preset's turn limit (episodes of ALFWorld's family run about 30 turns of their 50) and prompts
            turns = min(settings["max_turns"] or 30, 30)
            prompt = settings["stage_settings"].get("rescore", {}).get("max_prompt_tokens", 2048)
            workload = dict(
                model_params=7e9, tasks=settings["tasks"], group_size=settings["group_size"], turns=turns,
                prompt_tokens=prompt, response_tokens=128, eval_tasks=settings["eval_tasks"],
                eval_samples=settings["eval_samples"], eval_turns=turns,
            )  # fmt: skip
            for stage, (gpus, _, _, deadline) in sizes.items():
                estimate = plan.estimate(plan.Workload(gpus=gpus, **workload), plan.PUBLISHED)
                assert deadline >= 4 * estimate["stages_seconds"][stage], (preset, stage)


def _images(spec: dict) -> set[str]:
    return {e["container"]["image"] for e in spec["deploymentSpec"]["executors"].values()}


def test_compile_pins_the_images_make_images_built(tmp_path, monkeypatch, caplog, capsys):
    """`make images` records its tags in images/built.json; compile (run where it is) pins them, a flag wins, a
    broken record is one line, and without either the release tags are used with a warning."""
    monkeypatch.chdir(tmp_path)
    built = {"image": "reg.example/sdarflow:0.1.0-abc", "train_image": "reg.example/train:0.1.0-abc",
             "rollout_image": "reg.example/rollout:0.1.0-abc"}  # fmt: skip
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "built.json").write_text(json.dumps(built))
    spec, _, _ = compile_spec(tmp_path, "--image", "reg.example/mine:1")
    assert _images(spec) == {"reg.example/mine:1", built["train_image"], built["rollout_image"]}
    (tmp_path / "images" / "built.json").write_text('{"image": "x"}')
    assert main(["pipeline", "compile", "--output", str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err
    assert "does not name the three images" in err and "fix: run `make images` again" in err
    (tmp_path / "images" / "built.json").unlink()
    # production (the default preset) refuses the release tags unless told; the other presets warn
    assert main(["pipeline", "compile", "--output", str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err
    assert (
        len(err.strip().splitlines()) == 1
        and "would run the release tags" in err
        and "--allow-release-tags" in err
    )
    assert not (tmp_path / "p.yaml").exists()
    with caplog.at_level("WARNING"):
        spec, _, _ = compile_spec(tmp_path)  # with --allow-release-tags
        assert main(["pipeline", "compile", "--output", str(tmp_path / "demo.yaml"), "--preset", "demo"]) == 0
    assert caplog.text.count("no images/built.json from `make images`: the tasks use the release tags") == 2
    assert _images(spec) == {IMAGE, TRAIN_GPU_IMAGE, ROLLOUT_GPU_IMAGE}


def test_a_kueue_queue_labels_every_task_and_the_study_limits_its_cells(tmp_path, capsys):
    """--queue puts every pod in a Kueue LocalQueue (so the namespace's quotas and priority classes apply) and
    --priority gives them a WorkloadPriorityClass; --parallelism caps how many study cells run at once; a queue or
    priority that is not a label value, or a priority without a queue, is one line."""
    pipeline, platform, _ = compile_spec(
        tmp_path, "--rounds", "1", "--queue", "team-a", "--priority", "batch"
    )
    for name, task in dag_tasks(pipeline).items():
        labels = k8s_executor(pipeline, platform, task).get("podMetadata", {}).get("labels", {})
        assert labels == {"kueue.x-k8s.io/queue-name": "team-a", "kueue.x-k8s.io/priority-class": "batch"}, (
            name
        )
    flags = [
        "--pipeline",
        "study",
        "--methods",
        "grpo",
        "sdar",
        "--seeds",
        "0",
        "1",
        "2",
        "--parallelism",
        "2",
    ]
    pipeline, _, _ = compile_spec(tmp_path, *flags)
    cells = pipeline["root"]["dag"]["tasks"]["study-cells"]
    (loop,) = pipeline["components"][cells["componentRef"]["name"]]["dag"]["tasks"].values()
    assert loop["iteratorPolicy"]["parallelismLimit"] == 2
    out = str(tmp_path / "bad.yaml")
    capsys.readouterr()
    assert main(["pipeline", "compile", "--output", out, "--queue", "team a"]) == 2
    assert "--queue 'team a' is not a Kubernetes label value" in capsys.readouterr().err
    assert main(["pipeline", "compile", "--output", out, "--queue", "q", "--priority", "high!"]) == 2
    assert "--priority 'high!' is not a Kubernetes label value" in capsys.readouterr().err
    assert main(["pipeline", "compile", "--output", out, "--priority", "high"]) == 2
    assert "fix: pass --queue with the LocalQueue too" in capsys.readouterr().err
    assert not Path(out).exists()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--memory", "train=64GB"],
            "--memory train: '64GB' is not a size in the forms sdarflow takes (those Kubernetes and KFP both "
            "accept); fix: e.g. 16Gi",
        ),
        (
            ["--cpu", "train=two"],
            "--cpu train: 'two' is not a CPU in the forms sdarflow takes (those Kubernetes and KFP both accept); "
            "fix: e.g. 2, 0.5 or 500m",
        ),
        (
            ["--shm-size", "16GiB"],
            "--shm-size: '16GiB' is not a size in the forms sdarflow takes",
        ),
        (
            ["--model-cache-size", "1.5Ti"],
            "--model-cache-size: '1.5Ti' is not a size in the forms sdarflow takes",
        ),
    ],
)
def test_a_quantity_the_api_server_or_kfp_would_refuse_is_one_line(tmp_path, capsys, flags, message):
    """Before: a bad --memory or --cpu ended as KFP's "unexpected ValueError", a bad --shm-size or
    --model-cache-size compiled into a spec whose pods the API server refuses when the run starts."""
    out = tmp_path / "bad.yaml"
    assert main(["pipeline", "compile", "--allow-release-tags", "--output", str(out), *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not out.exists()


def test_quantities_are_kubernetes_and_kfp_forms():
    from sdarflow.defaults import quantity
    from sdarflow.errors import ConfigError

    for good in ("2", "0.5", "500m", ".5"):
        quantity(good, "cpu", "CPU")
    for good in ("64Gi", "512Mi", "20G", "1024", "1Ti"):
        quantity(good, "memory")
    for bad in ("2 ", "-1", "1.5Gi", "64GB", "1K", "1k", "", "Gi"):
        with pytest.raises(ConfigError, match="is not a size in the forms sdarflow takes"):
            quantity(bad, "memory")
    for bad in ("2m5", "1Gi", "two", ""):
        with pytest.raises(ConfigError, match="is not a CPU in the forms sdarflow takes"):
            quantity(bad, "cpu", "CPU")


@pytest.mark.parametrize(
    "pipeline_flags", [["--rounds", "1"], ["--pipeline", "promote"], ["--pipeline", "study"]]
)
def test_an_image_pull_secret_reaches_every_task(tmp_path, capsys, pipeline_flags):
    """A private registry: --image-pull-secret (repeatable) puts the Secrets on every task of every pipeline; a
    name that is not a Secret's is one line and writes nothing."""
    flags = [*pipeline_flags, "--image-pull-secret", "regcred", "--image-pull-secret", "mirror.creds"]
    pipeline, platform, _ = compile_spec(tmp_path, *flags)
    k8s = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    for label in pipeline["deploymentSpec"]["executors"]:  # every container, nested DAGs' too
        secrets = k8s.get(label, {}).get("imagePullSecret", [])
        assert [s["secretName"] for s in secrets] == ["regcred", "mirror.creds"], label
    out = str(tmp_path / "bad.yaml")
    capsys.readouterr()
    assert main(["pipeline", "compile", "--output", out, "--image-pull-secret", "Reg_Cred"]) == 2
    assert "--image-pull-secret 'Reg_Cred' is not a Secret name" in capsys.readouterr().err
    assert not Path(out).exists()
