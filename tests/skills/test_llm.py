"""LLM-written skills: an OpenAI-compatible endpoint (a real HTTP server on 127.0.0.1 started here) and our own
engine on the tiny model; replies are validated, garbage is rejected with a logged reason, and the previous
library keeps its skills."""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from sdarflow import storage
from sdarflow.cli import main
from sdarflow.skills.library import SkillLibrary
from sdarflow.skills.llm import EngineChat, llm_extract, parse_reply

SKILL = "Here is the skill:\n```\n# Cutting\n1. Take the knife.\n2. Slice <item> with knife\n3. prepare meal\n4. eat meal\n```"
REFERENCE = str(Path(__file__).parent / "data" / "reference_library")


class ChatServer:
    """Answers ``POST /v1/chat/completions`` with ``reply`` (or ``status``) and records every request."""

    def __init__(self, reply: str = SKILL, status: int = 200):
        self.reply, self.status, self.requests = reply, status, []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's naming)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                if server.status != 200:
                    payload = {"error": {"message": "nope"}}
                else:
                    message = {"role": "assistant", "content": server.reply}
                    payload = {"object": "chat.completion", "choices": [{"index": 0, "message": message}]}
                data = json.dumps(payload).encode()
                self.send_response(server.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):  # keep test output clean
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def chat():
    servers = []

    def start(**kw) -> ChatServer:
        servers.append(ChatServer(**kw))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def llm_flags(server: ChatServer, *extra: str) -> list[str]:
    return ["--extractor", "llm", "--llm-base-url", server.url, "--llm-model", "m", *extra]


def extract(capsys, traj: str, out: str, *flags: str) -> tuple[int, dict | str]:
    code = main(["extract-skills", "--input", traj, "--output", out, "--min-support", "1", *flags])
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if code == 0 else captured.err.strip().splitlines()[-1]


def test_openai_endpoint_writes_skills(chat, episodes_dataset, tmp_path, capsys, monkeypatch):
    server = chat()
    monkeypatch.setenv("SDAR_TEST_KEY", "sekret-123")
    out = str(tmp_path / "lib")
    flags = ["--extractor", "llm", "--llm-base-url", server.url, "--llm-model", "tiny-chat"]
    code, result = extract(capsys, episodes_dataset, out, *flags, "--llm-api-key-env", "SDAR_TEST_KEY")
    assert code == 0, result
    assert len(server.requests) == 2  # one per task type
    req = server.requests[0]
    assert req["path"] == "/v1/chat/completions" and req["headers"]["Authorization"] == "Bearer sekret-123"
    assert req["body"]["model"] == "tiny-chat" and req["body"]["temperature"] == 0.0
    user = req["body"]["messages"][-1]["content"]
    assert "Successful episodes:" in user and "Failed episodes:" in user and "take egg; look" in user
    lib = SkillLibrary.load(out)
    cut = lib.for_task_type("cut")
    # the model wrote "slice the item with the knife", but one success sliced and one chopped: the cut verb
    # depends on the recipe, so the step is dropped, as the rule extractor would
    assert cut.steps == ["take the knife", "prepare meal", "eat meal"]
    assert cut.evidence["source"] == "llm:openai:tiny-chat" and cut.evidence["followed"] >= 1
    assert lib.general is not None and lib.general.evidence["source"] == "rule"
    # the key is read from the environment only: it appears in no artifact
    assert all("sekret" not in p.read_text() for p in Path(out).iterdir())


def test_garbage_reply_is_rejected_and_the_previous_skill_kept(
    chat, episodes_dataset, tmp_path, capsys, caplog
):
    server = chat(reply="1. ))) ### ;;\n2. \u2588\u2588\u2588\nok")
    out = str(tmp_path / "lib")
    flags = llm_flags(server, "--previous", REFERENCE, "--allow-unpublished")  # a hand-written library
    with caplog.at_level(logging.WARNING, logger="sdarflow.skills.llm"):
        code, result = extract(capsys, episodes_dataset, out, *flags)
    assert code == 0, result
    assert set(result["rejected"]) == {"cook", "cut"} and "need >= 2" in result["rejected"]["cut"]
    assert "LLM skill for cut rejected" in caplog.text
    lib = SkillLibrary.load(out)
    assert lib.for_task_type("cut").name == "cutting" and lib.for_task_type("cook").name == "cooking"
    assert storage.read_manifest(out, "skills")["rejected"] == result["rejected"]


def test_refused_request_names_the_key_variable(chat, episodes_dataset, tmp_path, capsys):
    server = chat(status=401)
    flags = llm_flags(server, "--llm-api-key-env", "MY_KEY")
    code, err = extract(capsys, episodes_dataset, str(tmp_path / "lib"), *flags)
    assert code == 2 and "HTTP 401" in err and "MY_KEY" in err
    assert not (tmp_path / "lib").exists()


@pytest.mark.parametrize("content", [{"text": "1. take knife"}, ["1. take knife"], 7])
def test_reply_content_that_is_not_text_is_one_line(chat, episodes_dataset, tmp_path, capsys, content):
    server = chat(reply=content)
    code, err = extract(capsys, episodes_dataset, str(tmp_path / "lib"), *llm_flags(server))
    assert code == 2 and f"answered a {type(content).__name__} as message content, not text" in err
    assert not (tmp_path / "lib").exists()


def test_unreachable_endpoint_and_missing_settings(episodes_dataset, tmp_path, capsys):
    flags = ["--extractor", "llm", "--llm-base-url", "http://127.0.0.1:9/v1", "--llm-model", "m"]
    code, err = extract(capsys, episodes_dataset, str(tmp_path / "lib"), *flags)
    assert code == 2 and "cannot reach LLM endpoint http://127.0.0.1:9/v1/chat/completions" in err
    code, err = extract(capsys, episodes_dataset, str(tmp_path / "lib"), "--extractor", "llm")
    assert code == 2 and "needs --llm-base-url and --llm-model" in err


@pytest.mark.parametrize(
    ("reply", "steps", "reason"),
    [
        (SKILL, ["take the knife", "slice <item> with knife", "prepare meal", "eat meal"], ""),
        ("- take knife\n- take knife\n* eat the meal", ["take knife", "eat the meal"], ""),
        ("take knife then eat", None, "no numbered or bulleted steps"),
        ("1. take knife\n2. x", None, "1 valid step(s), need >= 2"),
        ("1. <|im_end|> ass ;;\n2. 0 0 0 0 0 0 0", None, "0 valid step(s)"),
    ],
)
def test_parse_reply(reply, steps, reason):
    _, got, why = parse_reply(reply)
    assert got == steps and why.startswith(reason)


def test_own_engine_writes_or_rejects_with_a_reason(tiny_model, caplog):
    """The tiny policy as the skill writer. Its output is mostly gibberish: the contract is that every task type
    either gets a skill that passes validation or is rejected with a logged reason, never a malformed skill."""
    from sdarflow.models import load_policy
    from sdarflow.skills.extract import EpisodeActions

    eps = [
        EpisodeActions(
            "a", "cut", ("take knife", "slice carrot with knife", "prepare meal", "eat meal"), True
        ),
        EpisodeActions("b", "cut", ("take carrot", "eat carrot"), False),
        EpisodeActions("c", "cook", ("take egg", "cook egg with stove", "prepare meal"), True),
    ]
    backend = EngineChat(load_policy(str(tiny_model)))
    with caplog.at_level(logging.WARNING, logger="sdarflow.skills.llm"):
        lib, rejected = llm_extract(eps, backend, min_support=1, max_tokens=32)
    assert set(lib.skills) | {f"skill_{t}" for t in rejected} == {"skill_cut", "skill_cook"}
    for skill in lib.skills.values():
        assert parse_reply(skill.text)[1] == skill.steps and skill.evidence["source"].startswith(
            "llm:engine:"
        )
    for task_type, reason in rejected.items():
        assert reason and f"LLM skill for {task_type} rejected: {reason}" in caplog.text
