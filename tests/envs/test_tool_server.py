"""The ``tool-use-http`` env against the reference tool server on 127.0.0.1: the same episodes as the in-process
``tool-use`` suite, call for call; the server refuses what the agent's own format refuses; a server that is not
there is one error that names the fix; and the rollout loop plays it through ``sdarflow generate``."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest

from sdarflow.cli import main
from sdarflow.envs import EnvError, get_suite
from sdarflow.envs.tool_server import ENDPOINT_ENV, make_server


@pytest.fixture(scope="module")
def server_url():
    server = make_server("127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _play(env, actions):
    env.reset()
    return [env.step(a) for a in actions]


def test_http_episodes_equal_the_in_process_ones(server_url):
    local, remote = get_suite("tool-use"), get_suite("tool-use-http", endpoint=server_url)
    for split in ("train", "test", "ood"):
        tasks = remote.tasks(split, 6)
        assert tasks == local.tasks(split, 6)  # the same tasks
        for task in tasks:
            env = local.make(task)
            env.reset()
            plan = []
            while (action := env.expert_action()) is not None:
                plan.append(action)
                env.step(action)
            # the expert's plan, then a failing call and a malformed one, on a fresh episode of each
            actions = [plan[0], '{"tool": "read_file", "args": {"path": "nope.txt"}}', "not json", *plan[1:]]
            want = [(s.observation, s.reward, s.done, s.won) for s in _play(local.make(task), actions)]
            got = [(s.observation, s.reward, s.done, s.won) for s in _play(remote.make(task), actions)]
            assert got == want
            assert want[-1][3], task.task_id  # the plan still solves it


def test_the_server_checks_calls_as_the_agent_format_does(server_url):
    def post(path, body):
        request = urllib.request.Request(server_url + path, data=json.dumps(body).encode(), method="POST")
        try:
            with urllib.request.urlopen(request) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    _, opened = post("/sessions", {"world": {"files": {"a/b.txt": "x"}}})
    session = opened["session"]
    assert post(f"/sessions/{session}/call", {"tool": "read_file", "args": {"path": "a/b.txt"}}) == (
        200, {"result": {"content": "x"}, "finished": False},
    )  # fmt: skip
    # a private method is not a tool, and a tool takes exactly its args
    code, body = post(f"/sessions/{session}/call", {"tool": "_init__", "args": {}})
    assert code == 400 and "unknown tool" in body["error"]
    assert (
        post(f"/sessions/{session}/call", {"tool": "read_file", "args": {"path": "x", "mode": "w"}})[0] == 400
    )
    assert post("/sessions/nope/call", {"tool": "finish", "args": {}})[0] == 404
    with urllib.request.urlopen(server_url + "/tools") as resp:
        assert "create_event" in json.loads(resp.read())["tools"]


def test_a_missing_server_is_one_error_with_the_fix(monkeypatch):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    suite = get_suite("tool-use-http", endpoint=f"http://127.0.0.1:{port}")
    with pytest.raises(EnvError, match=r"unreachable .*fix: start one \(`sdarflow envs tool-server"):
        suite.make(suite.tasks("train", 1)[0]).reset()
    monkeypatch.delenv(ENDPOINT_ENV, raising=False)
    with pytest.raises(EnvError, match=f"needs the tool server's URL in {ENDPOINT_ENV}"):
        get_suite("tool-use-http")


@pytest.mark.slow
def test_generate_plays_against_the_tool_server(server_url, tiny_model, tmp_path, monkeypatch, capsys):
    from sdarflow import storage
    from sdarflow.schema import TRAJECTORY_SCHEMA

    monkeypatch.setenv(ENDPOINT_ENV, server_url)
    out = tmp_path / "gen"
    argv = ["generate", "--model", str(tiny_model), "--env", "tool-use-http", "--split", "train", "--tasks", "2",
            "--group-size", "2", "--max-turns", "3", "--output", str(out)]  # fmt: skip
    assert main(argv) == 0
    rows = storage.read_table(str(out), kind="trajectories", schema=TRAJECTORY_SCHEMA).to_pylist()
    assert {r["env"] for r in rows} == {"tool-use-http"} and len({r["traj_id"] for r in rows}) == 4


def test_the_server_command_refuses_a_bad_or_busy_port(server_url, capsys):
    assert main(["envs", "tool-server", "--port", "99999"]) == 2
    assert "--port 99999 is not a TCP port; fix: 0 to 65535" in capsys.readouterr().err
    busy = server_url.rsplit(":", 1)[1]  # the module's server holds it
    assert main(["envs", "tool-server", "--port", busy]) == 2
    err = capsys.readouterr().err
    assert (
        f"cannot listen on 127.0.0.1:{busy}" in err
        and "fix: pick another --port" in err
        and err.count("\n") == 1
    )
