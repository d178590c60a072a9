"""Trajectory Parquet write/read throughput (sdarflow's real publish/read path) against the same bytes written and
read raw (the disk's limit) and against JSONL; plus the same Parquet path on S3 through a local moto server."""

from __future__ import annotations

import json
import logging
import os
import random
import tempfile
from pathlib import Path

import pyarrow as pa

from bench.common import median_time, write_result
from sdarflow import storage
from sdarflow.schema import TRAJECTORY_SCHEMA


def make_rows(n: int, seed: int = 0) -> pa.Table:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        p, r = rng.randint(150, 700), rng.randint(3, 30)
        rows.append(
            {
                "run_id": "bench",
                "round": 0,
                "task_id": f"t{i // 32}",
                "group_id": f"g{i // 32}",
                "traj_id": f"e{i // 8}",
                "turn": i % 8,
                "task_type": "cut+cook",
                "split": "train",
                "prompt_token_ids": [rng.randrange(32000) for _ in range(p)],
                "response_token_ids": [rng.randrange(32000) for _ in range(r)],
                "response_text": "take red apple",
                "rollout_logprobs": [-rng.random() for _ in range(r)],
                "reward": 0.0,
                "episode_return": 1.0,
                "success": True,
                "format_ok": True,
                "policy_version": "v1",
                "prompt_messages": "[]" * 50,
                "env": "textworld-cooking",
                "num_turns": 8,
            }
        )
    return pa.Table.from_pylist(rows, schema=TRAJECTORY_SCHEMA)


def run(quick: bool = True) -> dict:
    table = make_rows(2000 if quick else 10000)
    logical_mb = table.nbytes / 1e6
    work = Path(tempfile.mkdtemp(prefix="sdarflow-bench-"))
    counter = iter(range(10**6))

    def parquet_write() -> None:
        storage.write_table(
            table,
            str(work / f"pq{next(counter)}"),
            kind="trajectories",
            schema=TRAJECTORY_SCHEMA,
            config_hash="bench",
            inputs=[],
        )

    parquet_write()
    published = str(work / "pq0")
    parquet_bytes = sum(f.stat().st_size for f in Path(published).glob("*.parquet"))
    blob = os.urandom(int(table.nbytes))

    def raw_write() -> None:
        path = work / f"raw{next(counter)}"
        with open(path, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())

    def parquet_write_synced() -> None:
        parquet_write()
        os.sync()

    raw_path = work / "raw-read"
    raw_path.write_bytes(blob)
    rows = table.to_pylist()
    jsonl_path = work / "data.jsonl"

    def jsonl_write() -> None:
        with open(jsonl_path, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")

    jsonl_write()
    t = {
        "parquet_write": median_time(parquet_write_synced, repeats=5),
        "raw_write": median_time(raw_write, repeats=5),
        "jsonl_write": median_time(jsonl_write, repeats=3),
        "parquet_read": median_time(
            lambda: storage.read_table(published, kind="trajectories", schema=TRAJECTORY_SCHEMA), repeats=5
        ),
        "raw_read": median_time(lambda: raw_path.read_bytes(), repeats=5),
        "jsonl_read": median_time(lambda: [json.loads(x) for x in jsonl_path.open()], repeats=3),
    }
    mbps = {k: logical_mb / v for k, v in t.items()}
    result = {
        "rows": table.num_rows,
        "logical_mb": logical_mb,
        "parquet_mb_on_disk": parquet_bytes / 1e6,
        "mb_per_s": mbps,
        "fraction_of_peak": {
            "write": mbps["parquet_write"] / mbps["raw_write"],
            "read": mbps["parquet_read"] / mbps["raw_read"],
        },
        "speedup": {
            "write_vs_jsonl": mbps["parquet_write"] / mbps["jsonl_write"],
            "read_vs_jsonl": mbps["parquet_read"] / mbps["jsonl_read"],
        },
        "target": "parquet >= 50% of raw",
    }
    result["s3"] = _s3(table, logical_mb)
    rows_out = [("path", "MB/s (logical data)")] + [(k, f"{v:9.1f}") for k, v in mbps.items()]
    rows_out += [
        ("parquet/raw write", f"{result['fraction_of_peak']['write']:.2f}"),
        ("parquet/raw read", f"{result['fraction_of_peak']['read']:.2f}"),
    ]
    if result["s3"]:
        rows_out += [(f"s3 {k}", f"{v:9.1f}") for k, v in result["s3"]["mb_per_s"].items()]
    write_result("data_plane", result, rows_out)
    return result


def _s3(table: pa.Table, logical_mb: float) -> dict | None:
    """The same publish/read path against moto's S3 server on 127.0.0.1 (HTTP, in-process server)."""
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"]).create_bucket(Bucket="bench")
        counter = iter(range(10**6))
        uri = "s3://bench/pq"

        def write() -> None:
            storage.write_table(
                table,
                f"s3://bench/w{next(counter)}",
                kind="trajectories",
                schema=TRAJECTORY_SCHEMA,
                config_hash="bench",
                inputs=[],
            )

        storage.write_table(
            table, uri, kind="trajectories", schema=TRAJECTORY_SCHEMA, config_hash="b", inputs=[]
        )
        t_write = median_time(write, repeats=3)
        t_read = median_time(
            lambda: storage.read_table(uri, kind="trajectories", schema=TRAJECTORY_SCHEMA), repeats=3
        )
        return {"mb_per_s": {"parquet_write": logical_mb / t_write, "parquet_read": logical_mb / t_read}}
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()
