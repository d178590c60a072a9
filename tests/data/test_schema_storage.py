"""Schema validation and storage: round trips on a local folder and on S3 (moto over HTTP), atomic publish."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sdarflow import storage
from sdarflow.errors import SchemaError, StorageError
from sdarflow.schema import RESCORED_SCHEMA, TRAJECTORY_SCHEMA, fingerprint


def turn_row(i: int = 0, n_tokens: int = 3) -> dict:
    return {
        "run_id": "r",
        "round": 0,
        "task_id": f"t{i}",
        "group_id": "g",
        "traj_id": f"e{i}",
        "turn": 0,
        "task_type": "cut",
        "split": "train",
        "prompt_token_ids": [1, 2, 3],
        "response_token_ids": list(range(n_tokens)),
        "response_text": "take apple",
        "rollout_logprobs": [-0.5] * n_tokens,
        "reward": 1.0,
        "episode_return": 1.0,
        "success": True,
        "format_ok": True,
        "policy_version": "base",
        "prompt_messages": "[]",
        "env": "textworld-cooking",
        "num_turns": 1,
    }


def table(n: int = 5) -> pa.Table:
    return pa.Table.from_pylist([turn_row(i) for i in range(n)], schema=TRAJECTORY_SCHEMA)


def write(uri: str, t: pa.Table | None = None) -> dict:
    return storage.write_table(
        t if t is not None else table(),
        uri,
        kind="trajectories",
        schema=TRAJECTORY_SCHEMA,
        config_hash="abc",
        inputs=["in"],
    )


@pytest.fixture(params=["local", "s3"])
def root(request, tmp_path) -> str:
    return str(tmp_path) if request.param == "local" else request.getfixturevalue("s3_root")


def test_round_trip_records_lineage(root):
    uri = storage.join(root, "runs/x/round=0/generate")
    manifest = write(uri)
    back = storage.read_table(uri, kind="trajectories", schema=TRAJECTORY_SCHEMA)
    assert back.equals(table())
    assert manifest["rows"] == 5 and manifest["config_hash"] == "abc" and manifest["inputs"] == ["in"]
    assert manifest["schema_fingerprint"] == fingerprint(TRAJECTORY_SCHEMA)


def test_union_of_shards(root):
    a, b = storage.join(root, "a"), storage.join(root, "b")
    write(a, table(2))
    write(b, table(3))
    assert storage.read_table([a, b], kind="trajectories", schema=TRAJECTORY_SCHEMA).num_rows == 5


def test_refuses_dataset_without_manifest(root):
    uri = storage.join(root, "partial")
    storage.write_bytes(storage.join(uri, "part-00000.parquet"), b"junk")
    with pytest.raises(StorageError, match="no _manifest.json"):
        storage.read_table(uri, kind="trajectories", schema=TRAJECTORY_SCHEMA)


def test_refuses_republish_unless_overwrite(tmp_path):
    write(str(tmp_path / "d"))
    with pytest.raises(StorageError, match="already published"):
        write(str(tmp_path / "d"))


def test_missing_and_mistyped_columns_are_named(tmp_path):
    with pytest.raises(SchemaError, match="missing required column 'reward'"):
        write(str(tmp_path / "a"), table().drop_columns(["reward"]))
    bad = table().set_column(table().schema.get_field_index("turn"), "turn", pa.array(["0"] * 5))
    with pytest.raises(SchemaError, match="column 'turn' has type string, expected int32"):
        write(str(tmp_path / "b"), bad)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_mismatched_list_lengths_are_refused(tmp_path):
    rows = [turn_row(i) for i in range(3)]
    rows[2]["rollout_logprobs"] = [-0.1]
    with pytest.raises(SchemaError, match="row 2 has 1 'rollout_logprobs' for 3 response tokens"):
        write(str(tmp_path / "c"), pa.Table.from_pylist(rows, schema=TRAJECTORY_SCHEMA))


def test_reader_validates_what_it_reads(tmp_path):
    """A dataset tampered with after publishing (column dropped) is refused with the dataset's name."""
    uri = str(tmp_path / "d")
    write(uri)
    pq.write_table(table().drop_columns(["success"]), tmp_path / "d" / "part-00000.parquet")
    with pytest.raises(SchemaError, match=r"dataset .*/d: missing required column 'success'"):
        storage.read_table(uri, kind="trajectories", schema=TRAJECTORY_SCHEMA)
    (tmp_path / "d" / "part-00000.parquet").write_bytes(b"not parquet")
    with pytest.raises(SchemaError, match="not valid Parquet"):
        storage.read_table(uri, kind="trajectories", schema=TRAJECTORY_SCHEMA)


def test_wrong_kind_is_refused(tmp_path):
    write(str(tmp_path / "d"))
    with pytest.raises(StorageError, match="holds a 'trajectories' artifact, expected 'rescored'"):
        storage.read_table(str(tmp_path / "d"), kind="rescored", schema=RESCORED_SCHEMA)


def test_failed_publish_leaves_nothing(tmp_path):
    uri = str(tmp_path / "out")
    with pytest.raises(RuntimeError), storage.publishing(uri):
        storage.write_bytes(storage.join(uri, "half.bin"), b"x")
        raise RuntimeError("crash mid-write")
    assert not (tmp_path / "out").exists()


def test_publish_dir_verifies_checksums(root, tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.json").write_text(json.dumps({"x": 1}))
    (src / "sub" / "b.bin").write_bytes(b"\x00\x01")
    uri = storage.join(root, "artifact")
    storage.publish_dir(src, uri, kind="adapter")
    got = storage.fetch_dir(uri, kind="adapter", dest=tmp_path / "copy")
    assert (got / "sub" / "b.bin").read_bytes() == b"\x00\x01"
    storage.write_bytes(storage.join(uri, "a.json"), b'{"x": 2}')  # tamper
    with pytest.raises(StorageError, match="does not match its recorded sha256"):
        storage.fetch_dir(uri, kind="adapter", dest=tmp_path / "copy2")


def test_unreachable_s3_is_one_clear_line(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens on the discard port
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    with pytest.raises(StorageError) as err:
        storage.read_table("s3://bucket/data", kind="trajectories", schema=TRAJECTORY_SCHEMA)
    message = str(err.value)
    assert "s3://bucket/data" in message and "AWS_ENDPOINT_URL" in message and "\n" not in message
    assert "y" not in message.split("fix:")[1].replace("your", "")  # no secret echoed


def test_bad_uris():
    with pytest.raises(StorageError, match="unsupported URI scheme"):
        storage.resolve("gs://bucket/x")
    with pytest.raises(StorageError, match="3\\+ chars"):
        storage.resolve("s3://ab/x")
