"""Every manifest under k8s/ validates against the Kubernetes 1.37 schemas (kubernetes-validate, offline, strict),
every kustomization references only files that exist, every overlay renders (``kubectl kustomize``, when kubectl
is installed) to objects that validate, and the serving Deployment matches ``sdarflow registry serve-config``."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2] / "k8s"
K8S = "1.37.0"
KUSTOMIZATION = "kustomization.yaml"


def kustomizations() -> list[Path]:
    return sorted(ROOT.rglob(KUSTOMIZATION))


def patch_files() -> set[Path]:
    """Strategic-merge patches are partial objects: they are checked in the rendered overlays instead."""
    out = set()
    for k in kustomizations():
        for patch in yaml.safe_load(k.read_text()).get("patches", []):
            out.add((k.parent / patch["path"]).resolve())
    return out


def manifest_files() -> list[Path]:
    return sorted(
        p for p in ROOT.rglob("*.yaml") if p.name != KUSTOMIZATION and p.resolve() not in patch_files()
    )


def test_there_is_something_to_check():
    names = {p.relative_to(ROOT).as_posix() for p in manifest_files()}
    for expected in (
        "namespace/namespace.yaml",
        "rbac/role.yaml",
        "rbac/serviceaccount.yaml",
        "rbac/rolebinding.yaml",
        "secrets/s3-secret.template.yaml",
        "serving/deployment.yaml",
        "serving/service.yaml",
        "overlays/minio/minio.yaml",
    ):
        assert expected in names
    assert {"base", "serving", "overlays/minio", "overlays/gpu", "overlays/kfp-standalone"} <= {
        k.parent.relative_to(ROOT).as_posix() for k in kustomizations()
    }


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_manifest_validates_strictly(path):
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert docs, path
    for doc in docs:
        kubernetes_validate.validate(doc, K8S, strict=True)


def is_component(path: Path) -> bool:
    """A kustomize Component (``k8s/images``): included by overlays, not rendered on its own."""
    return yaml.safe_load(path.read_text())["kind"] == "Component"


@pytest.mark.parametrize("path", kustomizations(), ids=lambda p: p.parent.relative_to(ROOT).as_posix())
def test_kustomization_references_exist(path):
    spec = yaml.safe_load(path.read_text())
    if is_component(path):
        assert spec["apiVersion"] == "kustomize.config.k8s.io/v1alpha1" and spec["images"]
        return
    assert spec["apiVersion"] == "kustomize.config.k8s.io/v1beta1" and spec["kind"] == "Kustomization"
    refs = list(spec.get("resources", [])) + [p["path"] for p in spec.get("patches", [])]
    assert refs, path
    for component in spec.get("components", []):
        assert is_component(path.parent / component / KUSTOMIZATION), (
            f"{path}: {component} is not a Component"
        )
    for ref in refs:
        target = (path.parent / ref).resolve()
        assert target.exists(), f"{path}: {ref} does not exist"
        if target.is_dir():
            assert (target / KUSTOMIZATION).is_file(), f"{path}: {ref} is a folder without {KUSTOMIZATION}"
        else:
            # a plain file must sit inside the kustomization's folder (kustomize's default load restrictor)
            assert path.parent.resolve() in target.parents, f"{path}: {ref} is outside its root"


def test_every_image_gets_its_tag_in_one_place():
    """Manifests name images without tags; k8s/images (a Component every image-using overlay includes) sets them."""
    pinned = {i["name"] for i in yaml.safe_load((ROOT / "images" / KUSTOMIZATION).read_text())["images"]}
    for path in manifest_files():
        for doc in [d for d in yaml.safe_load_all(path.read_text()) if d]:
            for container in _containers(doc):
                assert ":" not in container["image"], f"{path}: {container['image']} carries its own tag"
                assert container["image"] in pinned, (
                    f"{path}: {container['image']} is not pinned in k8s/images"
                )


def _containers(doc: dict) -> list[dict]:
    spec = doc.get("spec", {}).get("template", {}).get("spec", {})
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


def test_the_secret_template_holds_no_values():
    secret = yaml.safe_load((ROOT / "secrets" / "s3-secret.template.yaml").read_text())
    assert secret["metadata"]["name"] == "sdarflow-s3"
    assert set(secret["stringData"]) == {
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_ENDPOINT_URL",
        "AWS_DEFAULT_REGION",
    }
    assert secret["stringData"]["AWS_SECRET_ACCESS_KEY"].startswith("<")
    assert secret["stringData"]["AWS_ACCESS_KEY_ID"].startswith("<")
    root = yaml.safe_load((ROOT / "secrets" / "minio-root.template.yaml").read_text())
    assert root["metadata"]["name"] == "sdarflow-minio-root"
    assert all(v.startswith("<") for v in root["stringData"].values())
    for k in kustomizations():  # a template is never applied by a kustomization
        assert ".template.yaml" not in k.read_text()


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (with kustomize) is not installed")
@pytest.mark.parametrize(
    "path",
    [
        k for k in kustomizations() if not is_component(k)
    ],  # a Component renders inside the overlays including it
    ids=lambda p: p.parent.relative_to(ROOT).as_posix(),
)
def test_kustomization_renders_to_valid_objects(path):
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(path.parent)], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, K8S, strict=True)
    if path.parent == ROOT / "overlays" / "gpu":
        (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
        pod = deployment["spec"]["template"]["spec"]
        assert pod["nodeSelector"] and pod["tolerations"] and pod["containers"][0]["name"] == "vllm"
    if path.parent == ROOT / "overlays" / "kfp-standalone":
        assert {d["metadata"]["namespace"] for d in docs} == {"kubeflow"}
        # never owns KFP's namespace, and never caps the GPUs of every team's runs there (a quota counts them all)
        assert {d["kind"] for d in docs} == {"ServiceAccount", "Role", "RoleBinding"}
    if path.parent == ROOT / "overlays" / "profile":  # the profile controller owns the namespace
        assert {d["kind"] for d in docs} == {"ServiceAccount", "Role", "RoleBinding", "ResourceQuota"}
    if path.parent.parent == ROOT / "overlays" and path.parent.name not in ("minio", "kfp-standalone"):
        # the GPU cap where the pods run, in a namespace that is sdarflow's or the team's own
        (quota,) = [d for d in docs if d["kind"] == "ResourceQuota"]
        assert quota["spec"]["hard"]["requests.nvidia.com/gpu"]
    if path.parent == ROOT / "overlays" / "minio":
        # the pipeline's keys are a bucket-limited MinIO user; only MinIO and its setup Job see the admin keys
        admin = {
            d["metadata"]["name"]
            for d in docs
            for c in _containers(d)
            for e in c.get("env", [])
            if e.get("valueFrom", {}).get("secretKeyRef", {}).get("name") == "sdarflow-minio-root"
        }
        assert admin == {"minio", "minio-create-bucket"}
    for doc in docs:  # every image carries the tag k8s/images sets
        for container in _containers(doc):
            assert ":" in container["image"], container["image"]
    # where a namespace is set (not in the rbac building block), the binding's subject follows it
    for b in [d for d in docs if d["kind"] == "RoleBinding" and "namespace" in d["metadata"]]:
        assert b["subjects"][0]["namespace"] == b["metadata"]["namespace"]


def test_serving_matches_registry_serve_config(tmp_path, make_adapter, report):
    """The static Deployment/Service are serve-config's, with the version resolved at pod start and the
    registry and base model from the ConfigMap."""
    from sdarflow.registry import Registry, serve_config

    registry = Registry(tmp_path / "registry")
    version = registry.register("sdar-policy", make_adapter(rank=8), report(0.5, 0.7, 0.4), {"run_id": "r"})
    registry.promote("sdar-policy", version, force=True, reason="test setup")
    config = {"registry": registry.uri, "base_model": "s3://sdarflow/models/base"}
    generated = serve_config(registry, config["base_model"], "sdar-policy")["kubernetes"]
    gen_deploy, gen_service = generated
    deploy = yaml.safe_load((ROOT / "serving" / "deployment.yaml").read_text())
    service = yaml.safe_load((ROOT / "serving" / "service.yaml").read_text())

    assert service == gen_service
    assert deploy["metadata"]["name"] == gen_deploy["metadata"]["name"]
    assert deploy["metadata"]["labels"] == gen_deploy["metadata"]["labels"]
    for key in ("selector", "strategy", "progressDeadlineSeconds"):
        assert deploy["spec"][key] == gen_deploy["spec"][key], key
    pod, gen_pod = deploy["spec"]["template"]["spec"], gen_deploy["spec"]["template"]["spec"]
    (vllm,), (gen_vllm,) = pod["containers"], gen_pod["containers"]
    # the static command reads the rank the initContainer wrote (from the registry, as serve-config does)
    assert vllm["command"][:2] == ["sh", "-c"] and vllm["command"][2].startswith("exec ")
    script = vllm["command"][2].removeprefix("exec ").replace('"$(cat /adapters/max-lora-rank)"', "8")
    assert [a.replace("/production", f"/{version}") for a in shlex.split(script)] == gen_vllm["command"]
    for key in (
        "name",
        "env",
        "ports",
        "resources",
        "readinessProbe",
        "lifecycle",
        "securityContext",
        "volumeMounts",
    ):
        assert vllm[key] == gen_vllm[key], key
    for key in (
        "securityContext",
        "volumes",
        "automountServiceAccountToken",
        "terminationGracePeriodSeconds",
    ):
        assert pod[key] == gen_pod[key], key
    (fetch,), (gen_fetch,) = pod["initContainers"], gen_pod["initContainers"]
    for key in ("name", "resources", "volumeMounts", "securityContext"):
        assert fetch[key] == gen_fetch[key], key
    assert fetch["envFrom"] == [{"secretRef": {"name": "sdarflow-s3-read"}}] == gen_fetch["envFrom"]
    # Kubernetes expands $(VAR) in a command from the container's env: here, the ConfigMap's keys
    configmap = yaml.safe_load((ROOT / "serving" / KUSTOMIZATION).read_text())["configMapGenerator"][0]
    literals = dict(item.split("=", 1) for item in configmap["literals"])
    env = {e["name"]: literals[e["valueFrom"]["configMapKeyRef"]["key"]] for e in fetch["env"]}
    expanded = [env.get(a[2:-1], a) if a.startswith("$(") else a for a in fetch["command"]]
    assert literals["base_model"] == config["base_model"]
    assert expanded[:4] == gen_fetch["command"][:4] and expanded[5:] == [
        a.replace(f":{version}", ":production") for a in gen_fetch["command"][5:]
    ]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (with kustomize) is not installed")
@pytest.mark.parametrize(
    "path",
    [k for k in kustomizations() if not is_component(k) and k.parent.name not in ("base", "namespace")],
    ids=lambda p: p.parent.relative_to(ROOT).as_posix(),
)
def test_deleting_an_overlay_deletes_no_namespace_and_no_data(path):
    """`kubectl delete -k` deletes what the kustomization renders: only base/ and namespace/ may hold the Namespace,
    and no kustomization a claim (MinIO's data comes from its StatefulSet's volumeClaimTemplates)."""
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(path.parent)], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    kinds = {d["kind"] for d in yaml.safe_load_all(rendered) if d}
    assert not kinds & {"Namespace", "PersistentVolumeClaim"}, kinds
