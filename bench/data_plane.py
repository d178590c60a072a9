"""Data plane: the share of a demo round's wall time spent in storage (every dataset, manifest, adapter and report
written and read through ``sdarflow.storage``), on a local folder and on S3 through a moto server on 127.0.0.1 (in
its own process).

The round is the demo's round 0 with every stage called directly (``bench.common.demo_round``); time inside
``sdarflow.storage``'s public functions is summed over the outermost calls (a read that also reads its manifest
counts once). What users feel is this share, not a throughput against a page-cache copy."""

from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

from bench.common import demo_model, demo_round, demo_settings, write_result
from sdarflow import storage

TARGET = 0.03


@contextlib.contextmanager
def storage_clock() -> Iterator[collections.Counter]:
    """Seconds spent in each public ``sdarflow.storage`` function while the block runs (outermost calls only)."""
    spent: collections.Counter = collections.Counter()
    depth = 0
    originals = {
        name: f
        for name, f in vars(storage).items()
        if inspect.isfunction(f) and f.__module__.startswith(storage.__name__ + ".")
    }

    def timed(name, f):
        @functools.wraps(f)
        def call(*args, **kwargs):
            nonlocal depth
            if depth:
                return f(*args, **kwargs)
            depth += 1
            t0 = time.perf_counter()
            try:
                return f(*args, **kwargs)
            finally:
                depth -= 1
                spent[name] += time.perf_counter() - t0

        return call

    for name, f in originals.items():
        setattr(storage, name, timed(name, f))
    try:
        yield spent
    finally:
        for name, f in originals.items():
            setattr(storage, name, f)


@contextlib.contextmanager
def moto_s3(bucket: str) -> Iterator[None]:
    """A moto S3 server on 127.0.0.1 in its own process (as a real store is: an in-process server would take the
    GIL from the stages it serves), with ``bucket``, and the AWS_* variables pointing at it."""
    import boto3
    import botocore.exceptions

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"])
        for attempt in range(100):  # the server starts in about a second
            try:
                client.create_bucket(Bucket=bucket)
                break
            except botocore.exceptions.EndpointConnectionError:
                if attempt == 99:
                    raise
                time.sleep(0.2)
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.terminate()
        server.wait(10)


def _share(model: str, root: str) -> dict:
    with storage_clock() as spent:
        seconds = sum(demo_round(demo_settings(model, root, "bench")).values())
    total = sum(spent.values())
    return {
        "round_seconds": seconds,
        "storage_seconds": total,
        "storage_share": total / seconds,
        "by_function": {k: round(v, 3) for k, v in spent.most_common()},
    }


def run(quick: bool = True) -> dict:
    model = demo_model()
    with tempfile.TemporaryDirectory() as tmp:
        local = _share(model, f"{tmp}/store")
    with moto_s3("bench"):
        s3 = _share(model, "s3://bench/store")
    result = {
        "model": model,
        "preset": "demo",
        "local": local,
        "s3_moto": s3,
        "storage_share": max(local["storage_share"], s3["storage_share"]),
        "target": f"storage_share <= {TARGET}",
    }
    rows = [("storage", "round (s)", "in storage (s)", "share")]
    rows += [
        (name, f"{r['round_seconds']:.1f}", f"{r['storage_seconds']:.2f}", f"{r['storage_share']:.2%}")
        for name, r in (("local folder", local), ("S3 (moto, 127.0.0.1)", s3))
    ]
    write_result("data_plane", result, rows, base=model)
    return result
