"""Serving follows promotions (``registry promote/rollback --roll-deployment``, the pipelines' promote steps):
through the real Kubernetes Python client against a local HTTP server that answers the two apps/v1 calls the
roll makes as the API server does (GET, and PATCH with a JSON merge patch, resourceVersion checked: 409 on a
stale one)."""

from __future__ import annotations

import copy
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from factories import bound

from sdarflow.cli import main
from sdarflow.errors import ConfigError
from sdarflow.registry import Registry, roll
from sdarflow.registry.roll import VERSIONS_ANNOTATION, parse_target

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
    """Deployments by path; ``status`` answers every request with that HTTP status instead; ``race`` changes the
    object once between a GET and the next PATCH (another writer)."""

    def __init__(self):
        self.objects: dict[str, dict] = {}
        self.status: int | None = None
        self.race = False
        self.patches: list[tuple[str, dict]] = []
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

            def _status(self, code: int, reason: str):
                self._send(
                    code,
                    {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "status": "Failure",
                        "reason": reason,
                        "code": code,
                    },
                )

            def do_GET(self):
                if server.status:
                    return self._status(server.status, "Forbidden")
                if self.path not in server.objects:
                    return self._status(404, "NotFound")
                self._send(200, server.objects[self.path])

            def do_PATCH(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                kind = self.headers["Content-Type"]
                assert kind in ("application/merge-patch+json", "application/strategic-merge-patch+json"), (
                    kind
                )
                obj = server.objects[self.path]
                if server.race:
                    server.race = False
                    obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
                wanted = body.get("metadata", {}).get("resourceVersion")
                if wanted and wanted != obj["metadata"]["resourceVersion"]:
                    return self._status(409, "Conflict")
                server.patches.append((kind, body))
                new = merge_patch(obj, body)
                new["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
                server.objects[self.path] = new
                self._send(200, new)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def add(self, path: str, adapters: str, **annotations: str) -> None:
        ns, name = path.split("/")[5], path.split("/")[7]
        self.objects[path] = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "namespace": ns, "resourceVersion": "7"},
            "spec": {
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {
                        "labels": {"app": name},
                        "annotations": {"sdarflow.io/adapters": adapters, **annotations},
                    },
                    "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.32.0"}]},
                },
            },
        }

    def template_annotations(self, path: str = DEPLOYMENT) -> dict:
        return self.objects[path]["spec"]["template"]["metadata"]["annotations"]


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


def promote(registry: Registry, *flags: str) -> int:
    argv = ["registry", "promote", "--registry", registry.uri, "--policy-name", NAME, "--version", "2"]
    return main([*argv, "--force", "--reason", "test", *flags])


def test_a_promotion_rolls_the_deployment_that_serves_the_alias_once(api, registry, capsys):
    api.add(DEPLOYMENT, f"{NAME}:production")
    assert promote(registry, "--roll-deployment", "sdarflow/sdarflow-serve") == 0
    out = capsys.readouterr().out
    assert "deployment sdarflow/sdarflow-serve rolls to sdar-policy:production v2" in out
    assert json.loads(api.template_annotations()[VERSIONS_ANNOTATION]) == {f"{NAME}:production": 2}
    assert api.objects[DEPLOYMENT]["metadata"]["resourceVersion"] == "8"
    # the namespace from the kubeconfig's context; the same version again patches nothing (a retried promotion)
    assert promote(registry, "--roll-deployment", "sdarflow-serve") == 0
    assert "already serves sdar-policy:production v2" in capsys.readouterr().out
    assert len(api.patches) == 1
    # a rollback rolls back, and the patch is the template annotation alone, against the version read
    argv = ["registry", "rollback", "--registry", registry.uri, "--policy-name", NAME, "--reason", "bad"]
    assert main([*argv, "--roll-deployment", "sdarflow/sdarflow-serve"]) == 0
    assert "rolls to sdar-policy:production v1 (was v2)" in capsys.readouterr().out
    assert json.loads(api.template_annotations()[VERSIONS_ANNOTATION]) == {f"{NAME}:production": 1}
    assert api.patches[-1][1] == {
        "metadata": {"resourceVersion": "8"},
        "spec": {
            "template": {"metadata": {"annotations": {VERSIONS_ANNOTATION: f'{{"{NAME}:production": 1}}'}}}
        },
    }


def test_other_adapters_versions_are_kept_and_a_concurrent_change_is_read_again(api, registry, capsys):
    api.add(
        DEPLOYMENT, f"other:production,{NAME}:production", **{VERSIONS_ANNOTATION: '{"other:production": 4}'}
    )
    api.race = True  # someone changes the Deployment between our read and our patch: 409, read again, patch
    assert promote(registry, "--roll-deployment", "sdarflow/sdarflow-serve") == 0
    assert json.loads(api.template_annotations()[VERSIONS_ANNOTATION]) == {
        "other:production": 4,
        f"{NAME}:production": 2,
    }
    assert api.patches[0][1]["metadata"] == {"resourceVersion": "8"}


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (
            lambda api: api.add(DEPLOYMENT, f"{NAME}:1"),
            "pins sdar-policy:1, so a new pod serves the same version",
        ),
        (
            lambda api: api.add(DEPLOYMENT, "other:production"),
            "serves ['other:production'], not sdar-policy:production",
        ),
        (
            lambda api: api.add(DEPLOYMENT, f"{NAME}:production", **{"sdarflow.io/registry": "s3://b/other"}),
            "serves the registry s3://b/other",
        ),
        (lambda api: None, "deployment sdarflow/sdarflow-serve not found; fix: apply serving first"),
        (
            lambda api: setattr(api, "status", 403),
            "may not read and patch it (HTTP 403); fix: apply k8s/serving's role",
        ),
    ],
    ids=["pinned", "not-served", "other-registry", "missing", "forbidden"],
)
def test_a_deployment_that_cannot_follow_is_refused_before_the_alias_moves(
    api, registry, capsys, setup, message
):
    setup(api)
    assert promote(registry, "--roll-deployment", "sdarflow/sdarflow-serve") == 2
    err = capsys.readouterr().err
    assert message in err and "fix:" in err and err.count("\n") == 1, err
    assert registry.resolve(NAME, "production") == 1 and not api.patches


def test_no_credentials_and_no_server_are_one_line_each(api, registry, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    assert promote(registry, "--roll-deployment", "sdarflow-serve") == 2
    err = capsys.readouterr().err
    assert "no Kubernetes credentials to roll serving with" in err and err.count("\n") == 1
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    api.httpd.shutdown()  # still listening, never answering: the request times out
    monkeypatch.setattr(roll, "REQUEST_TIMEOUT_S", (0.5, 0.5))
    assert promote(registry, "--roll-deployment", "sdarflow-serve") == 2
    err = capsys.readouterr().err
    assert (
        "the Kubernetes API is unreachable or did not answer (ReadTimeoutError)" in err
        and err.count("\n") == 1
    )
    api.httpd.server_close()  # nothing listens: refused
    assert promote(registry, "--roll-deployment", "sdarflow-serve") == 2
    err = capsys.readouterr().err
    assert (
        "the Kubernetes API is unreachable or did not answer (NewConnectionError)" in err
        and err.count("\n") == 1
    )
    assert registry.resolve(NAME, "production") == 1


@pytest.mark.parametrize("target", ["", "a/b/c", "ns/", "/name"])
def test_a_bad_target_is_refused(target):
    with pytest.raises(ConfigError, match=r"expected \[NAMESPACE/\]NAME"):
        parse_target(target)


def test_the_pipeline_promotion_rolls_and_its_config_is_checked(api, registry):
    from sdarflow.kfp_runtime import run_promotion
    from sdarflow.pipeline_config import PipelineConfig

    api.add(DEPLOYMENT, f"{NAME}:production")
    line = run_promotion(
        registry.uri, NAME, "2", force=True, reason="t", roll_deployment="sdarflow/sdarflow-serve"
    )
    assert line.endswith("deployment sdarflow/sdarflow-serve rolls to sdar-policy:production v2")
    assert json.loads(api.template_annotations()[VERSIONS_ANNOTATION]) == {f"{NAME}:production": 2}
    with pytest.raises(ConfigError, match="promote_to is empty; fix: promote_to production"):
        PipelineConfig(serve_deployment="sdarflow/sdarflow-serve").validate()
    with pytest.raises(ConfigError, match=r"expected \[NAMESPACE/\]NAME"):
        PipelineConfig(serve_deployment="a/b/c", promote_to="production").validate()
