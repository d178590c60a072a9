"""Schema validation and storage: round trips on a local folder and on S3 (moto over HTTP), atomic publish."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from factories import reseal

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


def write(uri: str, t: pa.Table | None = None, overwrite: bool = False) -> dict:
    return storage.write_table(
        t if t is not None else table(),
        uri,
        kind="trajectories",
        schema=TRAJECTORY_SCHEMA,
        config_hash="abc",
        inputs=["in"],
        overwrite=overwrite,
    )


def rows(uri: str) -> int:
    return storage.read_table(uri, kind="trajectories", schema=TRAJECTORY_SCHEMA).num_rows


def listing(uri: str) -> set[str]:
    """Every file under ``uri``, relative to it."""
    loc = storage.resolve(uri)
    infos = loc.fs.get_file_info(pafs.FileSelector(loc.path, recursive=True))
    return {i.path[len(loc.path) + 1 :] for i in infos if i.type == pafs.FileType.File}


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
    write(b, pa.Table.from_pylist([turn_row(i) for i in range(2, 5)], schema=TRAJECTORY_SCHEMA))
    assert storage.read_table([a, b], kind="trajectories", schema=TRAJECTORY_SCHEMA).num_rows == 5


def test_a_turn_read_twice_is_refused(tmp_path):
    a = str(tmp_path / "a")
    write(a)
    with pytest.raises(
        SchemaError, match=r"turn 0 of episode e\d appears 2 times .*fix: pass each dataset once"
    ):
        storage.read_table([a, a], kind="trajectories", schema=TRAJECTORY_SCHEMA)


def test_refuses_dataset_without_manifest(root):
    uri = storage.join(root, "partial")
    storage.write_bytes(storage.join(uri, "part-00000.parquet"), b"junk")
    with pytest.raises(StorageError, match="no _manifest.json"):
        storage.read_table(uri, kind="trajectories", schema=TRAJECTORY_SCHEMA)


def test_refuses_republish_unless_overwrite(tmp_path):
    write(str(tmp_path / "d"))
    with pytest.raises(StorageError, match="already published"):
        write(str(tmp_path / "d"))


def test_overwrite_writes_beside_the_old_artifact_and_removes_it_after_the_swap(root, tmp_path):
    uri = storage.join(root, "d")
    write(uri, table(3))
    first = write(uri, table(5), overwrite=True)
    assert rows(uri) == 5 and first["prefix"].startswith(storage.GENERATION)
    assert listing(uri) == {"_manifest.json", f"{first['prefix']}/part-00000.parquet"}
    second = write(uri, table(2), overwrite=True)
    assert rows(uri) == 2 and second["prefix"] != first["prefix"]
    assert listing(uri) == {"_manifest.json", f"{second['prefix']}/part-00000.parquet"}
    # a folder artifact too, and its local view is the generation that holds the files
    src = tmp_path / "src"
    src.mkdir()
    (src / "adapter_config.json").write_text("{}")
    folder = storage.join(root, "adapter")
    storage.publish_dir(src, folder, kind="adapter")
    (src / "adapter_config.json").write_text('{"r": 8}')
    storage.publish_dir(src, folder, kind="adapter", overwrite=True)
    got = storage.fetch_dir(folder, kind="adapter", dest=None if root == str(tmp_path) else tmp_path / "c")
    assert (got / "adapter_config.json").read_text() == '{"r": 8}'
    assert listing(folder) == {
        "_manifest.json",
        f"{storage.read_manifest(folder)['prefix']}/adapter_config.json",
    }


def test_an_interrupted_overwrite_leaves_the_old_artifact_readable(root):
    uri = storage.join(root, "d")
    write(uri, table(3))
    with pytest.raises(RuntimeError), storage.publishing(uri, overwrite=True) as target:
        storage.write_bytes(target.file("part-00000.parquet"), b"half")
        raise RuntimeError("crash mid-write")
    assert rows(uri) == 3 and listing(uri) == {"_manifest.json", "part-00000.parquet"}
    # a pod killed mid-write runs no cleanup: its generation stays unread, and the next publish removes it
    killed = (
        "import os; from sdarflow import storage\n"
        f"target = storage.publishing({uri!r}, overwrite=True).__enter__()\n"
        "storage.write_bytes(target.file('part-00000.parquet'), b'half')\n"
        "os._exit(9)\n"
    )
    assert subprocess.run([sys.executable, "-c", killed]).returncode == 9
    assert rows(uri) == 3 and any(p.startswith(storage.GENERATION) for p in listing(uri))
    manifest = write(uri, table(4), overwrite=True)
    assert rows(uri) == 4
    assert listing(uri) == {"_manifest.json", f"{manifest['prefix']}/part-00000.parquet"}


@pytest.mark.parametrize("prefix", ["../x", "_gen-a/../../x", "/abs", "other", 7])
def test_a_manifest_prefix_outside_the_artifact_is_refused(tmp_path, prefix):
    uri = str(tmp_path / "d")
    manifest = write(uri)
    storage.write_json(storage.join(uri, storage.MANIFEST), {**manifest, "prefix": prefix})
    with pytest.raises(StorageError, match="is not a generation folder|prefix = 7 is not a text value"):
        rows(uri)


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


def test_only_an_expert_rows_rollout_log_probs_may_be_nan(tmp_path):
    """No policy sampled an expert walkthrough (generate --policy expert), so its rollout log-probs are NaN; a
    sampled row's may not be (it would reach rescore and the manifest)."""
    rows = [turn_row(i) for i in range(3)]
    rows[1] |= {"policy_version": "expert", "rollout_logprobs": [float("nan")] * 3}
    write(str(tmp_path / "ok"), pa.Table.from_pylist(rows, schema=TRAJECTORY_SCHEMA))
    rows[2]["rollout_logprobs"] = [-0.1, float("nan"), -0.2]
    with pytest.raises(
        SchemaError, match="row 2 has a 'rollout_logprobs' value that is not a log-probability"
    ):
        write(str(tmp_path / "bad"), pa.Table.from_pylist(rows, schema=TRAJECTORY_SCHEMA))


def test_a_part_changed_after_publishing_is_refused_by_its_checksum(tmp_path):
    """Each part's size and sha256 are in the manifest and checked on read: a part replaced by another valid one
    (the same rows, written again) is refused before its rows are read."""
    uri = str(tmp_path / "d")
    manifest = write(uri)
    assert all(len(entry["sha256"]) == 64 and entry["bytes"] > 0 for entry in manifest["files"])
    pq.write_table(table(), tmp_path / "d" / "part-00000.parquet", compression="snappy")
    with pytest.raises(StorageError, match=r"part-00000.parquet' does not match its recorded sha256"):
        storage.read_table(uri, kind="trajectories", schema=TRAJECTORY_SCHEMA)


def test_reader_validates_what_it_reads(tmp_path):
    """A dataset whose producer wrote a bad part (column dropped, not Parquet) under a manifest that matches it is
    refused with the dataset's name."""
    uri = str(tmp_path / "d")
    write(uri)
    pq.write_table(table().drop_columns(["success"]), tmp_path / "d" / "part-00000.parquet")
    reseal(tmp_path / "d")
    with pytest.raises(SchemaError, match=r"dataset .*/d: missing required column 'success'"):
        storage.read_table(uri, kind="trajectories", schema=TRAJECTORY_SCHEMA)
    (tmp_path / "d" / "part-00000.parquet").write_bytes(b"not parquet")
    reseal(tmp_path / "d")
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
    assert not (tmp_path / "copy2" / "a.json").exists()  # nor a temp file beside it
    assert not [p for p in (tmp_path / "copy2").iterdir() if p.name != "sub"]


def test_publish_and_fetch_stream_a_file_larger_than_memory_would_hold_twice(tmp_path):
    """Weights are copied and hashed in blocks: the Python heap's peak stays far below the file's size (reading
    it whole, as before, held all 24 MiB at once). On a local folder: moto's S3 server runs in this process, and
    its own copies would count."""
    import tracemalloc

    src = tmp_path / "src"
    src.mkdir()
    weights = bytes(range(256)) * (24 * 4096)  # 24 MiB
    (src / "model.safetensors").write_bytes(weights)
    uri = str(tmp_path / "model")

    def peak_mib(fn) -> float:
        tracemalloc.start()
        try:
            fn()
            return tracemalloc.get_traced_memory()[1] / 2**20
        finally:
            tracemalloc.stop()

    assert peak_mib(lambda: storage.publish_dir(src, uri, kind="adapter")) < 8
    assert storage.read_manifest(uri, "adapter")["files"][0]["bytes"] == len(weights)
    assert peak_mib(lambda: storage.fetch_dir(uri, kind="adapter", dest=tmp_path / "copy")) < 8
    assert (tmp_path / "copy" / "model.safetensors").read_bytes() == weights
    assert peak_mib(lambda: storage.fetch_dir(uri, kind="adapter")) < 8  # verified in place, in blocks too


def test_a_copy_whose_source_breaks_names_the_source_and_leaves_nothing(tmp_path):
    from sdarflow.storage.files import _Reading, write_stream

    class Broken:
        def read(self, n: int) -> bytes:
            raise OSError("connection reset by peer")

    source = storage.resolve(str(tmp_path / "source"))
    (tmp_path / "copy").mkdir()
    with pytest.raises(StorageError, match=r"cannot read '.*source': connection reset by peer"):
        write_stream(str(tmp_path / "copy" / "model.safetensors"), _Reading(Broken(), source))
    assert not list((tmp_path / "copy").iterdir())  # no temp file, no partial file


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


def test_a_local_output_is_replaced_only_when_it_is_the_commands_own_and_only_once_complete(tmp_path):
    from sdarflow.errors import ConfigError

    out = tmp_path / "m"
    with storage.replacing_folder(out, "own.json", "cmd") as staged:  # absent: made
        (staged / "own.json").write_text("1")
    with pytest.raises(RuntimeError), storage.replacing_folder(out, "own.json", "cmd") as staged:
        (staged / "own.json").write_text("2")
        raise RuntimeError("killed halfway")
    assert (out / "own.json").read_text() == "1"  # a failed run leaves the earlier output as it was
    with storage.replacing_folder(out, "own.json", "cmd") as staged:  # its own earlier output: replaced
        (staged / "own.json").write_text("3")
    assert [p.name for p in tmp_path.iterdir()] == ["m"] and (out / "own.json").read_text() == "3"
    (out / "own.json").unlink()
    (out / "notes").write_text("mine")
    with pytest.raises(ConfigError, match="holds files cmd did not write"):
        with storage.replacing_folder(out, "own.json", "cmd"):
            raise AssertionError("refused before the block runs")
    assert [p.name for p in tmp_path.rglob("*")] == ["m", "notes"]


def _download(args: tuple[str, str]) -> bool:
    source, target = args
    from pathlib import Path

    return storage.download_dir(source, Path(target), marker="config.json", what="model")


def test_the_processes_of_a_node_download_a_folder_once(tmp_path):
    """Eight ranks on one node asking for the same base model at once: one copies it, the others find its copy,
    and a killed copier's leftovers are removed; a source without the marker is refused with nothing written."""
    import multiprocessing

    from sdarflow.errors import ConfigError

    source = tmp_path / "source"
    (source / "sub").mkdir(parents=True)
    (source / "config.json").write_text("{}")
    (source / "sub" / "weights.bin").write_bytes(b"w" * 100_000)
    target = tmp_path / "cache" / "model"
    (tmp_path / "cache" / ".model.partial-killed" / "sub").mkdir(parents=True)  # a copier killed mid-copy
    with multiprocessing.get_context("fork").Pool(8) as pool:
        copied = pool.map(_download, [(str(source), str(target))] * 8)
    assert sorted(copied) == [False] * 7 + [True]
    assert (target / "sub" / "weights.bin").read_bytes() == b"w" * 100_000
    assert sorted(p.name for p in target.parent.iterdir()) == [".model.lock", "model"]  # no partial copy left
    (tmp_path / "half").mkdir()  # not a finished copy, and not ours to delete
    with pytest.raises(ConfigError, match="'.*half' exists but holds no config.json .*; fix: remove it"):
        storage.download_dir(str(source), tmp_path / "half", marker="config.json", what="model")
    (source / "config.json").unlink()
    with pytest.raises(
        ConfigError, match="model '.*source' has no config.json; fix: upload the whole folder"
    ):
        storage.download_dir(str(source), tmp_path / "other", marker="config.json", what="model")
    assert not (tmp_path / "other").exists()
