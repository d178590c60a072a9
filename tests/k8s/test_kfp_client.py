"""``sdarflow pipeline upload|run|schedule`` through the real ``kfp.Client`` against a local HTTP server that
answers the KFP v2 REST endpoints they use (``/apis/v2beta1/...``, snake_case JSON as kfp_server_api 2.17.3
sends and reads it). No KFP server can run here: the test asserts the requests the server received."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from email.parser import BytesParser
from email.policy import HTTP
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
import yaml

from sdarflow.cli import main
from sdarflow.cli.pipeline import compile_pipeline

API = "/apis/v2beta1"


class FakeKFP:
    """In-memory pipelines, versions, experiments, runs and recurring runs; every request is recorded."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.pipelines: dict[str, dict] = {}  # id -> {"display_name", "versions": [version, ...]}
        self.experiments: dict[str, str] = {}  # id -> name
        self.lock = threading.Lock()
        self.tag_name = "2.16.0"

    def paths(self, method: str | None = None) -> list[str]:
        return [r["path"] for r in self.requests if method is None or r["method"] == method]

    def one(self, method: str, path: str) -> dict:
        (req,) = [r for r in self.requests if r["method"] == method and r["path"] == path]
        return req

    @staticmethod
    def _name_filter(query: dict) -> str | None:
        raw = query.get("filter", [None])[0]
        if not raw:
            return None
        (pred,) = json.loads(raw)["predicates"]
        assert pred["key"] == "display_name" and pred["operation"] in ("EQUALS", 1)
        return pred["stringValue"]

    @staticmethod
    def _spec(upload: bytes, content_type: str) -> dict:
        message = BytesParser(policy=HTTP).parsebytes(
            f"Content-Type: {content_type}\r\n\r\n".encode() + upload
        )
        (part,) = [
            p
            for p in message.iter_parts()
            if p.get_param("name", header="content-disposition") == "uploadfile"
        ]
        docs = [d for d in yaml.safe_load_all(part.get_payload(decode=True)) if d]
        # As the KFP API server stores a spec with Kubernetes settings
        return {"pipeline_spec": docs[0], "platform_spec": docs[1]} if len(docs) > 1 else docs[0]

    def _add_version(self, pipeline_id: str, name: str, spec: dict) -> dict:
        versions = self.pipelines[pipeline_id]["versions"]
        version = {
            "pipeline_id": pipeline_id,
            "pipeline_version_id": f"v-{sum(len(p['versions']) for p in self.pipelines.values()) + 1}",
            "display_name": name,
            "pipeline_spec": spec,
        }
        versions.append(version)
        return version

    def handle(self, method: str, path: str, query: dict, body: bytes, content_type: str) -> tuple[int, dict]:
        if (method, path) == ("GET", f"{API}/healthz"):
            return 200, {"multi_user": False}
        if (method, path) == ("GET", "/apis/v1beta1/healthz"):  # the v1 API's healthz says the version
            return 200, {"multi_user": False, "tag_name": self.tag_name, "commit_sha": "abc"}
        if (method, path) == ("GET", f"{API}/pipelines"):
            name = self._name_filter(query)
            found = [
                {"pipeline_id": pid, "display_name": p["display_name"]}
                for pid, p in self.pipelines.items()
                if name in (None, p["display_name"])
            ]
            return 200, {"pipelines": found, "total_size": len(found)} if found else {}
        if (method, path) == ("POST", f"{API}/pipelines/upload"):
            name = query["name"][0]
            pid = f"p-{len(self.pipelines) + 1}"
            self.pipelines[pid] = {"display_name": name, "versions": []}
            self._add_version(pid, name, self._spec(body, content_type))
            return 200, {"pipeline_id": pid, "display_name": name}
        if (method, path) == ("POST", f"{API}/pipelines/upload_version"):
            pid = query["pipelineid"][0]
            return 200, self._add_version(pid, query["name"][0], self._spec(body, content_type))
        if method == "GET" and path.startswith(f"{API}/pipelines/") and path.endswith("/versions"):
            pid = path.split("/")[-2]
            name = self._name_filter(query)
            assert query.get("sort_by") == ["created_at desc"]
            versions = [
                v for v in reversed(self.pipelines[pid]["versions"]) if name in (None, v["display_name"])
            ]
            return 200, {"pipeline_versions": versions[: int(query["page_size"][0])]}
        if (method, path) == ("GET", f"{API}/experiments"):
            name = self._name_filter(query)
            found = [
                {"experiment_id": e, "display_name": n} for e, n in self.experiments.items() if n == name
            ]
            return 200, {"experiments": found} if found else {}
        if (method, path) == ("POST", f"{API}/experiments"):
            eid = f"e-{len(self.experiments) + 1}"
            self.experiments[eid] = json.loads(body)["display_name"]
            return 200, {"experiment_id": eid, "display_name": self.experiments[eid]}
        if (method, path) == ("POST", f"{API}/runs"):
            return 200, {**json.loads(body), "run_id": "r-1", "state": "PENDING"}
        if (method, path) == ("POST", f"{API}/recurringruns"):
            return 200, {**json.loads(body), "recurring_run_id": "rr-1", "status": "ENABLED"}
        return 404, {"error": f"no route {method} {path}", "code": 5}


@pytest.fixture
def kfp_server(monkeypatch, tmp_path) -> Iterator[tuple[str, FakeKFP]]:
    import kfp.client.client as kfp_client

    # The client reads and writes ~/.config/kfp/context.json: keep it out of the user's home.
    monkeypatch.setattr(kfp_client.Client, "_LOCAL_KFP_CONTEXT", str(tmp_path / "kfp-context.json"))
    monkeypatch.delenv("KFP_TOKEN", raising=False)
    fake = FakeKFP()

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            url = urlparse(self.path)
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            query = parse_qs(url.query)
            content_type = self.headers.get("Content-Type", "")
            with fake.lock:
                fake.requests.append(
                    {
                        "method": self.command,
                        "path": url.path,
                        "query": query,
                        "body": body,
                        "type": content_type,
                    }
                )
                status, payload = fake.handle(self.command, url.path, query, body, content_type)
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _serve

        def log_message(self, *args) -> None:  # keep test output clean
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}", fake
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> str:
    return str(compile_pipeline(str(tmp_path_factory.mktemp("pkg") / "training.yaml"), "training", rounds=1))


def run_cli(capsys, *argv: str) -> tuple[int, dict | None, str]:
    code = main(["pipeline", *argv])
    captured = capsys.readouterr()
    return code, (json.loads(captured.out) if code == 0 else None), captured.err


REQUIRED = ("--param", "storage=s3://sdarflow/runs", "--param", "base_model=s3://sdarflow/models/base")


def test_upload_creates_the_pipeline_then_adds_versions(kfp_server, package, capsys):
    url, fake = kfp_server
    code, out, _ = run_cli(capsys, "upload", "--host", url, "--package", package)
    assert code == 0 and out == {"pipeline": "sdar-training", "pipeline_id": "p-1", "version_id": "v-1"}
    upload = fake.one("POST", f"{API}/pipelines/upload")
    assert upload["query"]["name"] == ["sdar-training"] and upload["type"].startswith("multipart/form-data")
    assert b"PIPELINE DEFINITION" in upload["body"]

    code, out, _ = run_cli(capsys, "upload", "--host", url, "--package", package)
    assert code == 0 and out["pipeline_id"] == "p-1" and out["version_id"] == "v-2"
    version = fake.one("POST", f"{API}/pipelines/upload_version")
    assert version["query"]["pipelineid"] == ["p-1"]
    assert version["query"]["name"][0].startswith("sdar-training-0.1.0-")


@pytest.mark.parametrize(
    ("tag", "refused"),
    [
        ("2.4.1", True),
        ("1.8.5", True),
        ("2.14.3", True),
        ("2.15.0", False),
        ("2.16.0", False),
        ("2.17.1", False),
    ],
)
def test_upload_checks_the_backend_version(kfp_server, package, capsys, caplog, tag, refused):
    url, fake = kfp_server
    fake.tag_name = tag
    code, _, err = run_cli(capsys, "upload", "--host", url, "--package", package)
    # 2.15 runs the pipelines, but without the tasks' security context: restricted namespaces reject the pods
    assert ("ignores the tasks' security context" in caplog.text) == (tag == "2.15.0")
    if refused:
        assert code == 2 and f"is {tag}, older than 2.15.0" in err and "--skip-version-check" in err
        assert len(err.strip().splitlines()) == 1
        assert f"{API}/pipelines/upload" not in fake.paths()
        assert run_cli(capsys, "upload", "--host", url, "--package", package, "--skip-version-check")[0] == 0
    else:
        assert code == 0 and fake.one("POST", f"{API}/pipelines/upload")


def test_run_from_a_package_sends_typed_parameters(kfp_server, package, capsys):
    url, fake = kfp_server
    code, out, _ = run_cli(
        capsys,
        "run",
        "--host",
        url,
        "--package",
        package,
        *REQUIRED,
        "--param",
        "sdar_coef=0.02",
        "--param",
        "tasks=16",
        "--param",
        "run_id=007",
        "--param",
        "stage_settings={train: {mini_batches: 2}}",
        "--service-account",
        "sdarflow-pipeline-runner",
        "--run-name",
        "first",
    )
    assert code == 0 and out == {"run_id": "r-1", "experiment_id": "e-1", "name": "first"}
    assert fake.paths() == [
        f"{API}/healthz",
        f"{API}/experiments",  # GET: look the experiment up by name
        f"{API}/experiments",  # POST: create it
        f"{API}/runs",
    ]
    created = json.loads(fake.one("POST", f"{API}/experiments")["body"])
    assert created["display_name"] == "sdarflow"
    run = json.loads(fake.one("POST", f"{API}/runs")["body"])
    assert run["experiment_id"] == "e-1" and run["display_name"] == "first"
    assert run["service_account"] == "sdarflow-pipeline-runner"
    assert run["pipeline_spec"]["pipeline_spec"]["pipelineInfo"]["name"] == "sdar-training"
    params = run["runtime_config"]["parameters"]
    assert params == {
        "storage": "s3://sdarflow/runs",
        "base_model": "s3://sdarflow/models/base",
        "sdar_coef": 0.02,
        "tasks": 16,
        "run_id": "007",  # a STRING parameter stays verbatim
        "stage_settings": {"train": {"mini_batches": 2}},
    }


def test_schedule_continues_from_production_without_catchup(kfp_server, package, capsys):
    url, fake = kfp_server
    assert run_cli(capsys, "upload", "--host", url, "--package", package)[0] == 0
    code, out, _ = run_cli(
        capsys,
        "schedule",
        "--host",
        url,
        "--pipeline",
        "sdar-training",
        "--cron",
        "0 0 3 * * *",
        *REQUIRED,
        "--param",
        "promote_to=production",
        "--service-account",
        "sdarflow-pipeline-runner",
    )
    assert code == 0 and out == {
        "recurring_run_id": "rr-1",
        "experiment_id": "e-1",
        "name": "sdarflow-retraining",
    }
    job = json.loads(fake.one("POST", f"{API}/recurringruns")["body"])
    assert job["trigger"] == {"cron_schedule": {"cron": "0 0 3 * * *"}}
    assert int(job["max_concurrency"]) == 1 and job["no_catchup"] is True and job["mode"] == "ENABLE"
    assert job["pipeline_version_reference"] == {"pipeline_id": "p-1", "pipeline_version_id": "v-1"}
    assert "pipeline_spec" not in job  # the uploaded version is referenced, not embedded
    assert job["runtime_config"]["parameters"]["start_adapter"] == "production"
    assert job["runtime_config"]["parameters"]["promote_to"] == "production"
    assert job["service_account"] == "sdarflow-pipeline-runner"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["schedule", "--cron", "0 3 * * *", *REQUIRED], "has 5 fields; KFP's cron has 6"),
        (["run", *REQUIRED, "--param", "lamda=0.1"], "unknown pipeline parameter(s) ['lamda']"),
        (["run", "--param", "storage=s3://x/y"], "missing required pipeline parameter(s) ['base_model']"),
        (["run", *REQUIRED, "--param", "tasks=many"], "tasks='many' is not a NUMBER_INTEGER"),
        (["schedule", "--cron", "0 0 3 * * *", *REQUIRED, "--param", "run_id=x"], "must not fix run_id"),
    ],
)
def test_bad_requests_fail_before_submitting(kfp_server, package, capsys, argv, message):
    url, fake = kfp_server
    code, _, err = run_cli(capsys, argv[0], "--host", url, "--package", package, *argv[1:])
    assert code == 2 and message in err
    assert not [p for p in fake.paths("POST")]  # nothing was created


def test_unknown_pipeline_name_says_how_to_upload(kfp_server, capsys):
    url, _ = kfp_server
    code, _, err = run_cli(capsys, "run", "--host", url, "--pipeline", "nope", *REQUIRED)
    assert code == 2 and "sdarflow pipeline upload" in err


def test_package_must_exist(kfp_server, capsys, tmp_path):
    url, _ = kfp_server
    code, _, err = run_cli(capsys, "upload", "--host", url, "--package", str(Path(tmp_path) / "missing.yaml"))
    assert code == 2 and "sdarflow pipeline compile" in err


@pytest.mark.parametrize("command", ["upload", "run"])
def test_an_unreachable_server_is_one_line(package, capsys, command):
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    extra = REQUIRED if command == "run" else ()
    code, _, err = run_cli(
        capsys, command, "--host", f"http://127.0.0.1:{port}", "--package", package, *extra
    )
    assert code == 2 and err.count("\n") == 1
    assert (
        f"the KFP server at http://127.0.0.1:{port} is unreachable (" in err and "Connection refused" in err
    )
    assert "--host" in err and "Traceback" not in err
