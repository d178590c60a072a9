"""``sdarflow pipeline smoke``: the one-task pipeline a team runs first, wired as the train task, and the checks
its pod runs (:mod:`sdarflow.cluster_check`) against real storage (moto's S3 server) and this machine."""

from __future__ import annotations

import os

import pytest
from factories import dag_tasks
from test_compile_spec import compile_spec, executor, k8s_executor

from sdarflow import cluster_check
from sdarflow.cluster_check import ClusterCheckFailed, check_cluster, raise_failed

ROOT_USER = os.getuid() == 0  # CI containers may run as root: the non-root check must then say so


def _by_name(checks) -> dict:
    return {c.name: c for c in checks}


def test_the_checks_on_s3_with_the_secrets_keys(s3_root):
    checks = _by_name(check_cluster(s3_root, gpus=0, run_id="r1"))
    assert checks["non-root user"].ok is not ROOT_USER
    assert checks["S3 credentials"].ok and "AWS_SECRET_ACCESS_KEY" in checks["S3 credentials"].seen
    trip = checks["storage write, read, delete"]
    assert trip.ok and f"{s3_root}/smoke/r1-" in trip.seen
    assert checks["model cache"].ok and checks["/dev/shm"].ok  # the test session's cache; no GPUs asked
    assert checks["GPUs"].ok and "0 asked" in checks["GPUs"].seen
    from sdarflow import storage

    assert storage.children(f"{s3_root}/smoke") == []  # the probe is gone: nothing left behind


def test_missing_credentials_and_no_gpus_fail_in_one_line_with_their_fixes(s3_root, monkeypatch):
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.delenv("SDARFLOW_CACHE")
    checks = check_cluster(s3_root, gpus=2, run_id="r2")
    failed = {c.name for c in checks if not c.ok}
    assert failed - {"non-root user"} == {
        "S3 credentials",
        "storage write, read, delete",
        "model cache",
        "GPUs",
    }
    with pytest.raises(ClusterCheckFailed) as err:
        raise_failed(checks)
    message = str(err.value)
    assert "\n" not in message and message.startswith("smoke: ")
    assert "S3 credentials failed (AWS_ACCESS_KEY_ID" in message and "k8s/README step 3" in message
    assert "GPUs failed (0 visible (none), 2 asked)" in message and "--node-selector" in message
    assert "--model-cache-size" in message
    table = cluster_check.markdown(checks)
    assert "| GPUs | FAILED |" in table and "| S3 credentials | FAILED |" in table


def test_smoke_compiles_one_task_wired_as_the_train_task(tmp_path):
    spec, platform, _ = compile_spec(tmp_path, "--rounds", "1", "--preset", "production")
    train = next(t for n, t in dag_tasks(spec).items() if n.startswith("train"))
    out = tmp_path / "smoke.yaml"
    from sdarflow.cli import main

    assert (
        main(
            [
                "pipeline",
                "smoke",
                "--output",
                str(out),
                "--image-pull-secret",
                "regcred",
                "--allow-release-tags",
            ]
        )
        == 0
    )
    import yaml

    smoke_spec, smoke_platform = list(yaml.safe_load_all(out.read_text()))
    ((name, task),) = smoke_spec["root"]["dag"]["tasks"].items()
    assert name == "smoke" and smoke_spec["root"]["inputDefinitions"]["parameters"]["storage"]
    ours, theirs = executor(smoke_spec, task), executor(spec, train)
    assert ours["image"] == theirs["image"] and ours["resources"] == theirs["resources"]
    wiring = k8s_executor(smoke_spec, smoke_platform, task)
    expected = k8s_executor(spec, platform, train)
    for key in ("emptyDirMounts", "secretAsEnv", "securityContext", "tolerations", "activeDeadlineSeconds"):
        assert wiring[key] == expected[key], key
    assert wiring["imagePullSecret"][0]["secretName"] == "regcred"
    assert task["inputs"]["parameters"]["gpus"]["runtimeValue"]["constant"] == 8


def test_the_smoke_pipeline_runs_in_the_local_runner(tmp_path, capfd):
    """The component end to end (KFP's local runner, the cluster wiring ignored): its checks run, and it fails
    only on the non-root check where this machine runs tests as root."""
    import kfp.local

    from pipelines.kube import KubeOptions
    from pipelines.smoke import build_smoke_pipeline

    kfp.local.init(runner=kfp.local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "kfp"))
    pipeline = build_smoke_pipeline(KubeOptions(gpus={"train": 0}, retries=0))  # no backoff waits
    store = str(tmp_path / "store")
    if ROOT_USER:
        with pytest.raises(RuntimeError):
            pipeline(storage=store)
        logs = capfd.readouterr()
        assert "smoke: non-root user failed (uid 0" in logs.out + logs.err
        assert "storage write, read, delete failed" not in logs.out + logs.err
    else:
        assert pipeline(storage=store).output == "all 6 checks passed"
