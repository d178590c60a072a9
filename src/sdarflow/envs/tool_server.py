"""Tools served over HTTP: the ``tool-use`` tasks with every call made to a tool server, as an agent's tools run in
production (a service, a sandbox, another team's API), and the reference server that hosts ``tool_api``'s tools.

The protocol, JSON over HTTP, one session per episode (any language can serve it)::

    GET    /tools                    -> {"tools": {name: [arg, ...]}}
    POST   /sessions {"world": {...}} -> {"session": id}                   the episode's starting state
    POST   /sessions/<id>/call {"tool": name, "args": {...}}
                                     -> {"result": {...}, "finished": bool} ``result`` has ``error`` on a failed call
    GET    /sessions/<id>/state      -> {"world": {...}}                   what the reward is computed from
    DELETE /sessions/<id>            -> {}

``sdarflow envs tool-server --port 8900`` runs the reference server; the ``tool-use-http`` suite reads its URL from
``SDARFLOW_TOOL_SERVER``. A server that does not answer is an :class:`EnvError` naming the URL and the fix.
"""

from __future__ import annotations

import json
import os
import threading
import urllib.error
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sdarflow.envs.base import EnvError, Task
from sdarflow.envs.tool_api import TOOLS, ToolAPI, ToolCallError, World, parse_call
from sdarflow.envs.tool_use import ToolUseEnv, ToolUseSuite

ENDPOINT_ENV = "SDARFLOW_TOOL_SERVER"
DEFAULT_PORT = 8900
MAX_BODY = 1 << 20  # a request body larger than 1 MiB is refused
MAX_SESSIONS = 100_000  # open episodes a server keeps; beyond, the oldest is dropped
TIMEOUT_S = 30.0


class RemoteToolAPI:
    """``ToolAPI``'s interface (``call``, ``finished``, ``world``) over one server session."""

    def __init__(self, endpoint: str, world: World) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.finished = False
        opened = _request(self.endpoint, "POST", "/sessions", {"world": world.to_json()})
        self.session = str(opened["session"])

    def call(self, tool: str, args: dict[str, str]) -> dict:
        path = f"/sessions/{self.session}/call"
        answer = _request(self.endpoint, "POST", path, {"tool": tool, "args": args})
        self.finished = bool(answer.get("finished"))
        return dict(answer["result"])

    @property
    def world(self) -> World:
        return World.from_json(_request(self.endpoint, "GET", f"/sessions/{self.session}/state")["world"])

    def close(self) -> None:
        _request(self.endpoint, "DELETE", f"/sessions/{self.session}")


def _request(endpoint: str, method: str, path: str, body: dict | None = None) -> dict[str, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        endpoint + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as resp:
            return json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as err:
        detail = err.read().decode(errors="replace")[:200]
        raise EnvError(f"tool server {endpoint}: {method} {path} answered {err.code}: {detail}") from None
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise EnvError(
            f"tool server {endpoint} is unreachable ({reason}); fix: start one (`sdarflow envs tool-server --port "
            f"{DEFAULT_PORT}`) and set {ENDPOINT_ENV} to its URL"
        ) from None
    except ValueError as err:
        raise EnvError(
            f"tool server {endpoint}: {method} {path} answered something that is not JSON ({err})"
        ) from None


class HttpToolUseEnv(ToolUseEnv):
    """A ``tool-use`` episode whose calls go to the tool server; reward as ``tool-use`` (the final state)."""

    def __init__(self, task: Task, max_turns: int, endpoint: str) -> None:
        super().__init__(task, max_turns)
        self.endpoint = endpoint

    def new_api(self) -> RemoteToolAPI:
        return RemoteToolAPI(self.endpoint, self.start)

    def close(self) -> None:
        if self.api is not None:
            self.api.close()
        super().close()


class HttpToolUseSuite(ToolUseSuite):
    """The ``tool-use`` tasks, split for split, played against the tool server at ``endpoint`` (default:
    ``$SDARFLOW_TOOL_SERVER``)."""

    name = "tool-use-http"

    def __init__(self, endpoint: str | None = None, max_turns: int | None = None) -> None:
        super().__init__(max_turns)
        self.endpoint = endpoint or os.environ.get(ENDPOINT_ENV, "")
        if not self.endpoint.startswith(("http://", "https://")):
            raise EnvError(
                f"tool-use-http needs the tool server's URL in {ENDPOINT_ENV} (got {self.endpoint!r}); fix: start "
                f"one (`sdarflow envs tool-server --port {DEFAULT_PORT}`) and export "
                f"{ENDPOINT_ENV}=http://127.0.0.1:{DEFAULT_PORT}"
            )

    def make(self, task: Task) -> HttpToolUseEnv:
        return HttpToolUseEnv(task, self.max_turns or self._spec(task.split).max_turns, self.endpoint)


class _Handler(BaseHTTPRequestHandler):
    apis: dict[str, ToolAPI]  # the server's open sessions, oldest first
    lock: threading.Lock

    def log_message(self, *args: Any) -> None:  # a line per request would flood a pod log
        pass

    def _reply(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict:
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 < length <= MAX_BODY:
            raise ValueError(f"a JSON body of 1 to {MAX_BODY} bytes is required")
        body = json.loads(self.rfile.read(length))
        if not isinstance(body, dict):
            raise ValueError("the body must be a JSON object")
        return body

    def _session(self) -> tuple[str, ToolAPI | None]:
        session = self.path.split("/")[2] if self.path.count("/") >= 2 else ""
        with self.lock:
            return session, self.apis.get(session)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if self.path == "/tools":
            return self._reply(200, {"tools": {name: list(args) for name, args in TOOLS.items()}})
        session, api = self._session()
        if api is None or self.path != f"/sessions/{session}/state":
            return self._reply(404, {"error": f"no such session or path: {self.path}"})
        self._reply(200, {"world": api.world.to_json()})

    def do_POST(self) -> None:  # noqa: N802
        try:
            body = self._body()
            if self.path == "/sessions":
                world, session = World.from_json(body.get("world") or {}), uuid.uuid4().hex
                with self.lock:
                    if len(self.apis) >= MAX_SESSIONS:
                        self.apis.pop(next(iter(self.apis)))  # the oldest: an episode that never closed
                    self.apis[session] = ToolAPI(world)
                return self._reply(200, {"session": session})
            session, api = self._session()
            if api is None or self.path != f"/sessions/{session}/call":
                return self._reply(404, {"error": f"no such session or path: {self.path}"})
            # the same contract as the agent's own calls: a known tool with exactly its args, all strings
            tool, args = parse_call(json.dumps({"tool": body.get("tool"), "args": body.get("args")}))
        except (ValueError, TypeError, AttributeError, ToolCallError) as err:
            return self._reply(400, {"error": str(err)[:200]})
        result = api.call(tool, args)
        self._reply(200, {"result": result, "finished": api.finished})

    def do_DELETE(self) -> None:  # noqa: N802
        session, api = self._session()
        with self.lock:
            self.apis.pop(session, None)
        self._reply(200 if api is not None else 404, {})


def make_server(host: str = "127.0.0.1", port: int = DEFAULT_PORT) -> ThreadingHTTPServer:
    """The reference tool server (not started: ``serve_forever()``; port 0 picks a free one)."""
    handler = type("ToolHandler", (_Handler,), {"apis": {}, "lock": threading.Lock()})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server
