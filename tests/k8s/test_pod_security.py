"""Every pod we ship passes Pod Security ``restricted`` (the admission checks ported in ``pod_security.py``): the
tasks of every compiled pipeline (as a KFP 2.16 backend builds their pods), the kustomize overlays' workloads,
``registry serve-config``'s Deployment and ``pipeline trainjob``'s pods; and the namespace we create enforces
``restricted``, so applying it never lowers a team's label."""

from __future__ import annotations

import copy
import shutil
import subprocess

import pytest
import yaml
from pod_security import kfp_task_pod, pod_templates, restricted_violations
from test_compile_spec import compile_spec
from test_manifests import ROOT, is_component, kustomizations, manifest_files
from test_trainjob import as_pod, train_config

from pipelines.trainjob import trainjob_manifest
from sdarflow.sizes import PIPELINE_PRESETS

ADMITTED: dict = {
    "securityContext": {
        "runAsNonRoot": True,
        "runAsUser": 10001,
        "seccompProfile": {"type": "RuntimeDefault"},
    },
    "initContainers": [
        {
            "name": "init",
            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        }
    ],
    "containers": [
        {
            "name": "main",
            "ports": [{"containerPort": 8000}],
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]},
            },
        }
    ],
    "volumes": [
        {"name": "cache", "emptyDir": {}},
        {"name": "data", "persistentVolumeClaim": {"claimName": "d"}},
    ],
}


def _set(path: str, value):
    """A mutation of ADMITTED: ``path`` is dotted, list items by index (``containers.0.securityContext``)."""

    def mutate(pod: dict) -> None:
        *parents, leaf = path.split(".")
        node = pod
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
        if value is None:
            del node[leaf]
        else:
            node[leaf] = value

    return mutate


@pytest.mark.parametrize(
    ("mutate", "check"),
    [
        (_set("hostNetwork", True), "host namespaces"),
        (_set("containers.0.securityContext.privileged", True), "privileged"),
        (_set("containers.0.securityContext.capabilities.add", ["SYS_ADMIN"]), "non-default capabilities"),
        (_set("volumes", [{"name": "h", "hostPath": {"path": "/"}}]), "hostPath volumes"),
        (_set("containers.0.ports", [{"containerPort": 80, "hostPort": 80}]), "hostPort"),
        (_set("securityContext.seLinuxOptions", {"user": "root"}), "seLinuxOptions"),
        (_set("containers.0.securityContext.procMount", "Unmasked"), "procMount"),
        (_set("securityContext.sysctls", [{"name": "kernel.msgmax", "value": "1"}]), "forbidden sysctls"),
        (_set("volumes", [{"name": "n", "nfs": {"server": "s", "path": "/"}}]), "restricted volume types"),
        (_set("initContainers.0.securityContext.allowPrivilegeEscalation", None), "allowPrivilegeEscalation"),
        (_set("securityContext.runAsNonRoot", None), "runAsNonRoot"),
        (_set("containers.0.securityContext.runAsNonRoot", False), "runAsNonRoot"),
        (_set("containers.0.securityContext.runAsUser", 0), "runAsUser=0"),
        (_set("securityContext.seccompProfile", None), "seccompProfile"),
        (_set("containers.0.securityContext.seccompProfile", {"type": "Unconfined"}), "seccompProfile"),
        (_set("initContainers.0.securityContext.capabilities", None), "unrestricted capabilities"),
        (_set("containers.0.securityContext.capabilities.add", ["CHOWN"]), "unrestricted capabilities"),
        (_set("containers.0.securityContext.appArmorProfile", {"type": "Unconfined"}), "AppArmor"),
    ],
)
def test_each_restricted_check_forbids_what_upstream_forbids(mutate, check):
    assert restricted_violations(ADMITTED) == []
    pod = copy.deepcopy(ADMITTED)
    mutate(pod)
    found = restricted_violations(pod)
    assert any(check in reason for reason in found), found


def test_container_level_settings_satisfy_the_pod_level_checks():
    """runAsNonRoot and seccomp may be set on every container instead of the pod; one container without fails."""
    pod = copy.deepcopy(ADMITTED)
    pod_sc = pod.pop("securityContext")
    for c in pod["initContainers"] + pod["containers"]:
        c["securityContext"].update(runAsNonRoot=True, seccompProfile=pod_sc["seccompProfile"])
    assert restricted_violations(pod) == []
    del pod["containers"][0]["securityContext"]["seccompProfile"]
    assert restricted_violations(pod) == [
        "seccompProfile: pod or container main must set seccompProfile.type to RuntimeDefault or Localhost"
    ]
    annotated = {"container.apparmor.security.beta.kubernetes.io/main": "unconfined"}
    assert "AppArmor" in restricted_violations(ADMITTED, annotated)[0]


def _rendered(path) -> list[dict]:
    out = subprocess.run(
        ["kubectl", "kustomize", str(path.parent)], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (with kustomize) is not installed")
@pytest.mark.parametrize(
    "path",
    [k for k in kustomizations() if not is_component(k)],
    ids=lambda p: p.parent.relative_to(ROOT).as_posix(),
)
def test_every_overlay_is_admitted_by_a_restricted_namespace(path):
    docs = _rendered(path)
    for doc in docs:
        for name, spec, notes in pod_templates(doc):
            assert restricted_violations(spec, notes) == [], name
        if doc["kind"] == "Namespace":  # the strictest level: applying it never lowers a team's label
            labels = doc["metadata"]["labels"]
            assert labels["pod-security.kubernetes.io/enforce"] == "restricted", labels


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_manifest_file_is_admitted(path):
    """Files outside any kustomization too."""
    for doc in (d for d in yaml.safe_load_all(path.read_text()) if d):
        for name, spec, notes in pod_templates(doc):
            assert restricted_violations(spec, notes) == [], name


def test_serve_config_and_the_static_serving_pod_are_admitted(tmp_path, make_adapter, report):
    from sdarflow.registry import Registry, serve_config

    registry = Registry(tmp_path / "registry")
    version = registry.register("sdar-policy", make_adapter(rank=8), report(0.5, 0.7, 0.4), {"run_id": "r"})
    registry.promote("sdar-policy", version, force=True, reason="test setup")
    deployment, _ = serve_config(registry, "s3://b/base", "sdar-policy")["kubernetes"]
    platform_uid, _ = serve_config(registry, "s3://b/base", "sdar-policy", run_as_user=None)["kubernetes"]
    # OpenShift assigns the user
    assert "runAsUser" not in platform_uid["spec"]["template"]["spec"]["securityContext"]
    static = yaml.safe_load((ROOT / "serving" / "deployment.yaml").read_text())
    for doc in (deployment, platform_uid, static):
        ((name, spec, notes),) = pod_templates(doc)
        assert restricted_violations(spec, notes) == [], name


def test_trainjob_pods_are_admitted():
    manifest = trainjob_manifest(train_config(), name="t", image="img", tolerations=[])
    assert restricted_violations(as_pod(manifest)["spec"]) == []


def _executors(platform: dict) -> dict:
    return platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]


@pytest.mark.parametrize(
    "flags",
    [
        *(["--preset", p] for p in PIPELINE_PRESETS),
        *(["--pipeline", p] for p in ("promote", "study", "smoke")),
    ],
    ids=lambda f: "-".join(f).lstrip("-"),
)
def test_every_compiled_task_is_admitted_by_a_restricted_namespace(tmp_path, flags):
    spec, platform, _ = compile_spec(tmp_path, "--rounds", "1", *flags)
    executors = _executors(platform)
    assert set(executors) == set(spec["deploymentSpec"]["executors"])  # every task is wired
    for label, k8s in executors.items():
        assert restricted_violations(kfp_task_pod(k8s)) == [], label


def test_run_as_user_none_leaves_the_uid_to_the_platform(tmp_path):
    _, platform, _ = compile_spec(tmp_path, "--rounds", "1", "--run-as-user", "none")
    for label, k8s in _executors(platform).items():
        assert k8s["securityContext"] == {"runAsNonRoot": True}, label
        assert restricted_violations(kfp_task_pod(k8s)) == [], label
    manifest = trainjob_manifest(train_config(), name="t", image="img", tolerations=[], run_as_user=None)
    pod = as_pod(manifest)["spec"]
    assert "runAsUser" not in pod["securityContext"] and restricted_violations(pod) == []


def test_without_our_security_context_a_kfp_task_is_refused():
    """The backend's own hardening is not enough: without runAsNonRoot on the task's container, refused."""
    found = restricted_violations(kfp_task_pod({}))
    assert found == ["runAsNonRoot != true: pod or container main must set runAsNonRoot=true"], found
