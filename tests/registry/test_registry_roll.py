"""Serving follows promotions (``registry promote/rollback --roll-deployment``, the pipelines' promote steps):
through the real Kubernetes Python client against a local HTTP server that answers the apps/v1 calls the roll
makes as the API server does (GET; PATCH as a strategic merge patch, which for annotations merges as RFC 7386,
with ``dryRun=All``, and with resourceVersion as a precondition: 409 on a stale one). In-cluster credentials (the
pod's service account over HTTPS) are not exercised here."""

from __future__ import annotations

import copy
import json
import shlex
import shutil
import subprocess
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml
from factories import bound

from sdarflow.cli import main
from sdarflow.defaults import VERSIONS_ANNOTATION
from sdarflow.errors import ConfigError
from sdarflow.registry import Registry, roll
from sdarflow.registry.roll import parse_target

NAME = "sdar-policy"
DEPLOYMENT = "/apis/apps/v1/namespaces/sdarflow/deployments/sdarflow-serve"


def merge_patch(target, patch):
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


class FakeApiServer:
    """Deployments by path. ``status`` answers every request with that HTTP status instead, ``patch_status`` every
    PATCH and ``apply_status`` every PATCH but a dry run (RBAC passes, the write fails); ``race`` changes the
    object once between a GET and the next PATCH (another writer). A dry run (``?dryRun=All``) changes nothing."""

    def __init__(self):
        self.objects: dict[str, dict] = {}
        self.status: int | None = None
        self.patch_status: int | None = None
        self.apply_status: int | None = None
        self.race = False
        self.dry_run_status: tuple[int, str] | None = None  # (code, message) for dry runs only
        self.patches: list[tuple[str, dict]] = []
        self.dry_runs = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, code: int, body: dict):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _status(self, code: int):
                status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code}
                self._send(code, {**status, "reason": HTTPStatus(code).phrase.replace(" ", "")})

            def do_GET(self):
                path = urlsplit(self.path).path
                if server.status:
                    return self._status(server.status)
                if path not in server.objects:
                    return self._status(404)
                self._send(200, server.objects[path])

            def do_PATCH(self):
                url = urlsplit(self.path)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                kind = self.headers["Content-Type"]
                # the client sends a dict body as a strategic merge patch; for annotations it merges as RFC 7386
                assert kind == "application/strategic-merge-patch+json", kind
                dry = parse_qs(url.query).get("dryRun") == ["All"]
                if dry and server.dry_run_status:
                    code, message = server.dry_run_status
                    return self._send(
                        code, {"kind": "Status", "status": "Failure", "code": code, "message": message}
                    )
                if server.status or server.patch_status or (server.apply_status and not dry):
                    return self._status(server.status or server.patch_status or server.apply_status)
                if url.path not in server.objects:
                    return self._status(404)
                obj = server.objects[url.path]
                if dry:
                    server.dry_runs += 1
                    return self._send(200, merge_patch(obj, body))
                if server.race:
                    server.race = False
                    obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
                wanted = body.get("metadata", {}).get("resourceVersion")
                if wanted and wanted != obj["metadata"]["resourceVersion"]:
                    return self._status(409)
                server.patches.append((kind, body))
                new = merge_patch(obj, body)
                new["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
                server.objects[url.path] = new
                self._send(200, new)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def add(self, adapters: str, registry: str | None, path: str = DEPLOYMENT, **annotations: str) -> None:
        ns, name = path.split("/")[5], path.split("/")[7]
        annotations = {"sdarflow.io/adapters": adapters, **annotations}
        if registry is not None:
            annotations["sdarflow.io/registry"] = registry
        self.objects[path] = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "namespace": ns, "resourceVersion": "7"},
            "spec": {
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}, "annotations": annotations},
                    "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.32.0"}]},
                },
            },
        }

    def template_annotations(self, path: str = DEPLOYMENT) -> dict:
        return self.objects[path]["spec"]["template"]["metadata"]["annotations"]

    def recorded(self) -> dict:
        return {
            k: v["version"] for k, v in json.loads(self.template_annotations()[VERSIONS_ANNOTATION]).items()
        }


@pytest.fixture
def api(tmp_path, monkeypatch):
    server = FakeApiServer()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server.url}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [
                    {"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "sdarflow"}}
                ],
                "current-context": "x",
            }
        )
    )
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.setattr(roll, "SERVICE_ACCOUNT", tmp_path / "no-service-account")  # even inside a pod
    yield server
    server.httpd.shutdown()
    server.httpd.server_close()


@pytest.fixture
def registry(local_registry, make_adapter, tasks, lineage):
    """Two versions of sdar-policy, v1 in production."""
    reg = Registry(local_registry)
    for seed in (0, 1):
        adapter = make_adapter(seed=seed)
        reg.register(NAME, adapter, bound(tasks([2] * 20, [2] * 20), adapter), lineage)
    reg.promote(NAME, 1, force=True, reason="test setup")
    return reg


def promote(registry: Registry, *flags: str, version: str = "2") -> int:
    argv = ["registry", "promote", "--registry", registry.uri, "--policy-name", NAME, "--version", version]
    return main([*argv, "--force", "--reason", "test", *flags])


def rollback(registry: Registry, *flags: str) -> int:
    argv = ["registry", "rollback", "--registry", registry.uri, "--policy-name", NAME, "--reason", "bad"]
    return main([*argv, *flags])


ROLL = ("--roll-deployment", "sdarflow/sdarflow-serve")


@pytest.fixture
def served(api, registry, tmp_path):
    """k8s/serving's Deployment as `kubectl kustomize k8s/overlays/gpu` renders it, serving ``registry``."""
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl (with kustomize) is not installed")
    k8s = tmp_path / "k8s"
    shutil.copytree(Path(__file__).parents[2] / "k8s", k8s)
    kustomization = k8s / "serving" / "kustomization.yaml"
    kustomization.write_text(
        kustomization.read_text().replace("registry=s3://sdarflow/sdar/registry", f"registry={registry.uri}")
    )
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(k8s / "overlays" / "gpu")], capture_output=True, text=True, check=True
    ).stdout
    (deployment,) = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "Deployment"]
    deployment["metadata"]["resourceVersion"] = "7"
    api.objects[DEPLOYMENT] = deployment
    fetch = deployment["spec"]["template"]["spec"]["initContainers"][0]["command"]
    assert fetch[fetch.index("--adapter") + 1] == f"{NAME}:production"  # what the annotation says it serves
    return api


@pytest.fixture
def follows(api, registry):
    """A Deployment that serves the alias from ``registry`` (the annotations k8s/serving's template carries)."""
    api.add(f"{NAME}:production", registry.uri)
    return api


def test_each_move_of_the_alias_rolls_k8s_serving_and_a_retry_does_not(served, registry, capsys):
    api = served
    assert promote(registry, *ROLL) == 0
    out = capsys.readouterr().out
    assert "deployment sdarflow/sdarflow-serve rolls to sdar-policy:production v2" in out
    assert api.recorded() == {f"{NAME}:production": 2} and api.dry_runs == 1
    assert api.objects[DEPLOYMENT]["metadata"]["resourceVersion"] == "8"
    # the same promotion again moves nothing and rolls nothing; the namespace from the kubeconfig's context
    assert promote(registry, "--roll-deployment", "sdarflow-serve") == 0
    assert "already serves sdar-policy:production v2" in capsys.readouterr().out
    assert len(api.patches) == 1
    # `kubectl rollout undo` puts the template back to v1's; the alias still says v2 and pods fetch v2. A rollback
    # to v1 then moves the alias, and a move always rolls, although the template already names v1.
    api.template_annotations()[VERSIONS_ANNOTATION] = json.dumps(
        {f"{NAME}:production": {"version": 1, "at": "x"}}
    )
    assert rollback(registry, *ROLL) == 0
    assert "rolls to sdar-policy:production v1 (was v1)" in capsys.readouterr().out
    assert len(api.patches) == 2 and api.recorded() == {f"{NAME}:production": 1}
    kind, body = api.patches[-1]
    assert body["metadata"] == {"resourceVersion": "8"} and list(body["spec"]["template"]["metadata"]) == [
        "annotations"
    ]  # the annotation alone, against the version read
    assert list(body["spec"]["template"]["metadata"]["annotations"]) == [VERSIONS_ANNOTATION]


def test_other_adapters_versions_are_kept_and_a_concurrent_change_is_read_again(api, registry, capsys):
    other = json.dumps({"other:production": {"version": 4, "at": "t"}})
    api.add(f"other:production,{NAME}:production", registry.uri, **{VERSIONS_ANNOTATION: other})
    api.race = True  # someone changes the Deployment between our read and our patch: 409, read again, patch
    assert promote(registry, *ROLL) == 0
    assert api.recorded() == {"other:production": 4, f"{NAME}:production": 2}
    assert api.patches[0][1]["metadata"] == {"resourceVersion": "8"}


def _refused(api, registry, capsys, message):
    assert promote(registry, *ROLL) == 2
    err = capsys.readouterr().err
    assert message in err and "fix:" in err and err.count("\n") == 1, err
    assert registry.resolve(NAME, "production") == 1 and not api.patches


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (
            lambda api, uri: api.add(f"{NAME}:1", uri),
            "pins sdar-policy:1, so a new pod serves the same version",
        ),
        (
            lambda api, uri: api.add("other:production", uri),
            "serves ['other:production'], not sdar-policy:production",
        ),
        (lambda api, uri: api.add(f"{NAME}:production", "s3://b/other"), "serves the registry s3://b/other"),
        (lambda api, uri: api.add(f"{NAME}:production", None), "(not annotated: sdarflow.io/registry)"),
        (lambda api, uri: None, "deployment sdarflow/sdarflow-serve not found; fix: apply serving first"),
        (lambda api, uri: setattr(api, "status", 403), "may not read and patch it (HTTP 403); fix: bind"),
        # reading is allowed, patching is not: the dry run finds out before the alias moves
        (
            lambda api, uri: (api.add(f"{NAME}:production", uri), setattr(api, "patch_status", 403)),
            "may not read and patch it (HTTP 403)",
        ),
    ],
    ids=[
        "pinned",
        "not-served",
        "other-registry",
        "registry-unknown",
        "missing",
        "forbidden",
        "patch-forbidden",
    ],
)
def test_a_deployment_that_cannot_follow_is_refused_before_the_alias_moves(
    api, registry, capsys, setup, message
):
    setup(api, registry.uri)
    _refused(api, registry, capsys, message)


def test_a_webhook_that_takes_no_dry_run_does_not_block_the_roll(follows, registry, capsys, caplog):
    """The API server answers a dry run 400 when an admission webhook declares side effects; RBAC passed."""
    follows.dry_run_status = (400, 'admission webhook "policy.example.com" does not support dry run')
    assert promote(registry, *ROLL) == 0
    assert "rolls to sdar-policy:production v2" in capsys.readouterr().out
    assert "does not take dry runs" in caplog.text and follows.recorded() == {f"{NAME}:production": 2}


def test_a_paused_deployment_is_refused(follows, registry, capsys):
    follows.objects[DEPLOYMENT]["spec"]["paused"] = True
    _refused(
        follows,
        registry,
        capsys,
        "is paused, so a changed template does not roll it; fix: `kubectl -n sdarflow",
    )


def test_a_roll_that_fails_after_the_move_says_the_alias_moved_and_how_to_roll(follows, registry, capsys):
    follows.apply_status = 500  # the dry run passes, the write fails
    assert promote(registry, *ROLL) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1 and "sdar-policy:production points at v2 now, but serving did not roll: " in err
    )
    command = err.split("then run `")[1].split("`")[0]
    assert command.endswith("--version 2 --roll-deployment sdarflow/sdarflow-serve")
    assert registry.resolve(NAME, "production") == 2
    # the command it names moves nothing and rolls
    follows.apply_status = None
    assert main(shlex.split(command.removeprefix("sdarflow "))) == 0
    assert (
        "rolls to sdar-policy:production v2" in capsys.readouterr().out
        and follows.recorded()[f"{NAME}:production"] == 2
    )
    assert registry.resolve(NAME, "production") == 2


def test_a_history_that_cannot_be_read_after_the_move_still_says_the_alias_moved(follows, registry):
    """The alias moved; reading its history back (for the move's time) fails: the error is the same line."""
    roller = roll.ServingRoll("sdarflow/sdarflow-serve", registry, NAME, "production")
    registry.promote(NAME, 2, force=True, reason="test")
    aliases = registry._layout(NAME).aliases
    Path(aliases).write_text("{not json")
    with pytest.raises(ConfigError) as err:
        roller.roll(2)
    message = str(err.value)
    assert message.startswith("sdar-policy:production points at v2 now, but serving did not roll: ")
    assert (
        "is not valid JSON" in message and "--version 2 --roll-deployment sdarflow/sdarflow-serve`" in message
    )
    assert not follows.patches


def test_the_hint_after_a_failed_roll_rolls_even_where_the_template_names_that_version(
    follows, registry, capsys
):
    """`kubectl rollout undo` left the template naming v1 while the alias (and the pods) moved on to v2; a rollback
    to v1 moves the alias, its roll fails; the command the error names then rolls, although the template names v1."""
    assert promote(registry, *ROLL) == 0
    follows.template_annotations()[VERSIONS_ANNOTATION] = json.dumps(
        {f"{NAME}:production": {"version": 1, "at": "t"}}
    )
    follows.apply_status = 500
    assert rollback(registry, *ROLL) == 2
    command = capsys.readouterr().err.split("then run `")[1].split("`")[0]
    follows.apply_status = None
    assert main(shlex.split(command)[1:]) == 0
    assert "rolls to sdar-policy:production v1 (was v1)" in capsys.readouterr().out
    assert registry.resolve(NAME, "production") == 1
    # and once the template holds the alias's last move, the same command rolls nothing
    assert main(shlex.split(command)[1:]) == 0
    assert "already serves sdar-policy:production v1" in capsys.readouterr().out


def test_the_kubeconfig_wins_over_the_pods_service_account(follows, registry, tmp_path, monkeypatch, capsys):
    """kubectl's order: $KUBECONFIG (or ~/.kube/config) first, the service account only without one; in-cluster
    credentials (HTTPS to the API server) are not exercised here."""
    account = tmp_path / "service-account"
    account.mkdir()
    (account / "token").write_text("t")
    (account / "namespace").write_text("elsewhere")
    monkeypatch.setattr(roll, "SERVICE_ACCOUNT", account)
    assert promote(registry, "--roll-deployment", "sdarflow-serve") == 0  # the kubeconfig context's namespace
    assert "deployment sdarflow/sdarflow-serve rolls" in capsys.readouterr().out


def test_no_credentials_and_no_server_are_one_line_each(api, registry, tmp_path, monkeypatch, capsys):
    api.add(f"{NAME}:production", registry.uri)
    for kubeconfig in (tmp_path / "missing", tmp_path / "garbage"):
        (tmp_path / "garbage").write_text("clusters: [\n")
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        _refused(api, registry, capsys, "no usable Kubernetes credentials to roll serving with")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    api.httpd.shutdown()  # still listening, never answering: the request times out
    monkeypatch.setattr(roll, "REQUEST_TIMEOUT_S", (0.5, 0.5))
    _refused(api, registry, capsys, "the Kubernetes API is unreachable or did not answer (ReadTimeoutError)")
    api.httpd.server_close()  # nothing listens: refused
    _refused(
        api, registry, capsys, "the Kubernetes API is unreachable or did not answer (NewConnectionError)"
    )


@pytest.mark.parametrize("target", ["", "a/b/c", "ns/", "/name"])
def test_a_bad_target_is_refused(target):
    with pytest.raises(ConfigError, match=r"expected \[NAMESPACE/\]NAME"):
        parse_target(target)


def test_the_pipeline_promotion_rolls_and_its_config_is_checked(follows, registry):
    from sdarflow.kfp_runtime import run_promotion
    from sdarflow.pipeline_config import PipelineConfig, prepare

    line = run_promotion(
        registry.uri, NAME, "2", force=True, reason="t", roll_deployment="sdarflow/sdarflow-serve"
    )
    assert line.endswith("deployment sdarflow/sdarflow-serve rolls to sdar-policy:production v2")
    assert follows.recorded() == {f"{NAME}:production": 2}
    with pytest.raises(ConfigError, match="promote_to is empty; fix: promote_to production"):
        PipelineConfig(serve_deployment="sdarflow/sdarflow-serve").validate()
    # a run whose promotion could not roll serving fails when it starts, not after its training
    follows.objects[DEPLOYMENT]["spec"]["paused"] = True
    store = registry.uri.rsplit("/", 1)[0]
    pc = PipelineConfig(
        storage=store, base_model="b", registry=registry.uri, policy_name=NAME, promote_to="production",
        serve_deployment="sdarflow/sdarflow-serve", data_cursor="fixed",
    )  # fmt: skip
    with pytest.raises(ConfigError, match="is paused"):
        prepare(pc)
    del follows.objects[DEPLOYMENT]["spec"]["paused"]
    assert prepare(pc).endswith("pipeline.yaml")
    with pytest.raises(ConfigError, match=r"expected \[NAMESPACE/\]NAME"):
        PipelineConfig(serve_deployment="a/b/c", promote_to="production").validate()
