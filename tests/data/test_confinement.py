"""Hostile data never reaches outside its folder: manifest entries, skill file names and symlinks that point out of
an artifact are refused in one line before anything is read or written, and manifests are checked against what
their files hold."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from factories import reseal
from test_schema_storage import table, write

from sdarflow import storage
from sdarflow.errors import SchemaError, StorageError
from sdarflow.schema import TRAJECTORY_SCHEMA
from sdarflow.skills.library import MAPPING, Skill, SkillLibrary

ESCAPES = ["../secret.txt", "a/../../secret.txt", "/etc/passwd", "C:/x", "a\\..\\b", "", ".", "a//b", "a/./b"]


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "secret.txt"
    path.write_text("do not read or overwrite")
    return path


@pytest.mark.parametrize("rel", ESCAPES)
def test_confined_refuses_every_escape(rel):
    with pytest.raises(StorageError, match=r"^entry x: path .*fix: "):
        storage.confined(rel, "entry x")


@pytest.mark.parametrize("rel", [None, 3, ["a"], {"a": 1}])
def test_confined_refuses_non_strings(rel):
    with pytest.raises(StorageError, match="is not a file name"):
        storage.confined(rel, "entry x")


def test_confined_keeps_ordinary_names():
    assert storage.confined("sub/part-00000.parquet", "x") == "sub/part-00000.parquet"
    assert storage.confined("..hidden", "x") == "..hidden"  # a name that starts with dots is still inside


def _tamper_manifest(folder: Path, **changes) -> None:
    manifest = json.loads((folder / storage.MANIFEST).read_text())
    manifest.update(changes)
    (folder / storage.MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.parametrize("rel", ["../secret.txt", "/etc/passwd"])
def test_dataset_manifest_cannot_point_outside(tmp_path, secret, rel):
    write(str(tmp_path / "d"))
    _tamper_manifest(tmp_path / "d", files=[{"path": rel, "rows": 5}])
    with pytest.raises(StorageError, match=r"_manifest.json': files\[0\]: file: path .* leaves its folder"):
        storage.read_table(str(tmp_path / "d"), kind="trajectories", schema=TRAJECTORY_SCHEMA)


def test_symlink_out_of_a_dataset_is_refused(tmp_path):
    outside = tmp_path / "elsewhere.parquet"
    pq.write_table(table(), outside)
    write(str(tmp_path / "d"))
    part = tmp_path / "d" / "part-00000.parquet"
    part.unlink()
    part.symlink_to(outside)
    with pytest.raises(StorageError, match="resolves outside .* through a symlink"):
        storage.read_table(str(tmp_path / "d"), kind="trajectories", schema=TRAJECTORY_SCHEMA)


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        ([], "is not a manifest"),
        ({"kind": "trajectories"}, "is not a manifest"),
        (
            {"kind": "trajectories", "files": ["part-00000.parquet"]},
            r"files\[0\]: 'part-00000.parquet' is not a mapping",
        ),
        (
            {"kind": "trajectories", "files": [{"path": "p", "rows": -1}]},
            r"files\[0\]: rows = -1 must be >= 0",
        ),
        (
            {"kind": "trajectories", "files": [{"path": "p", "bytes": "9"}]},
            r"files\[0\]: bytes = '9' is not a valid int",
        ),
        ({"kind": "trajectories", "files": [{"path": "p", "sha256": "xyz"}]}, "is not a sha256 digest"),
        ({"kind": "trajectories", "files": [], "rows": 1.5}, "rows = 1.5 is not a whole number"),
    ],
)
def test_malformed_manifests_are_one_line(tmp_path, manifest, message):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / storage.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(StorageError, match=message) as err:
        storage.read_table(str(tmp_path / "d"), kind="trajectories", schema=TRAJECTORY_SCHEMA)
    assert "\n" not in str(err.value) and "fix: " in str(err.value)


def test_rows_and_schema_must_match_the_manifest(tmp_path):
    write(str(tmp_path / "d"))
    pq.write_table(table(3), tmp_path / "d" / "part-00000.parquet")  # truncated, and its checksum with it
    reseal(tmp_path / "d")
    with pytest.raises(SchemaError, match="its files hold 3 rows, its manifest says 5"):
        storage.read_table(str(tmp_path / "d"), kind="trajectories", schema=TRAJECTORY_SCHEMA)
    write(str(tmp_path / "e"))
    _tamper_manifest(tmp_path / "e", schema_fingerprint="0" * 16)
    with pytest.raises(SchemaError, match="written with schema 0000000000000000"):
        storage.read_table(str(tmp_path / "e"), kind="trajectories", schema=TRAJECTORY_SCHEMA)


@pytest.fixture(params=["local", "s3"])
def root(request, tmp_path) -> str:
    return str(tmp_path / "store") if request.param == "local" else request.getfixturevalue("s3_root")


def _published(root: str, tmp_path: Path) -> tuple[str, dict]:
    """A published one-file adapter and its manifest."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(b"\x00\x01")
    uri = storage.join(root, "adapter")
    storage.publish_dir(src, uri, kind="adapter")
    return uri, storage.read_json(storage.join(uri, storage.MANIFEST))


def test_fetch_never_writes_outside_its_destination(root, tmp_path, secret):
    uri, manifest = _published(root, tmp_path)
    manifest["files"].append({"path": "../secret.txt"})
    storage.write_json(storage.join(uri, storage.MANIFEST), manifest)
    dest = tmp_path / "fetched"
    with pytest.raises(StorageError, match="leaves its folder"):
        storage.fetch_dir(uri, kind="adapter", dest=dest)
    assert secret.read_text() == "do not read or overwrite"


def test_fetch_checks_sizes(root, tmp_path):
    uri, manifest = _published(root, tmp_path)
    del manifest["files"][0]["sha256"]
    manifest["files"][0]["bytes"] = 5
    storage.write_json(storage.join(uri, storage.MANIFEST), manifest)
    with pytest.raises(StorageError, match="does not match"):
        storage.fetch_dir(uri, kind="adapter", dest=tmp_path / "copy")


def _library(folder: Path, mapping: dict) -> Path:
    folder.mkdir()
    (folder / "skill_cut.md").write_text("1. take knife\n")
    (folder / MAPPING).write_text(json.dumps(mapping))
    return folder


@pytest.mark.parametrize("rel", ["../secret.txt", "SECRET_ABS"])
def test_skill_mapping_cannot_name_files_outside(tmp_path, secret, rel):
    rel = str(secret) if rel == "SECRET_ABS" else rel
    lib = _library(tmp_path / "lib", {"skill_files": {"skill_cut": "skill_cut.md", "evil": rel}})
    with pytest.raises(StorageError, match=r"skill_files\['evil'\]: path .* leaves its folder"):
        SkillLibrary.load(lib)
    assert secret.read_text() == "do not read or overwrite"


def test_skill_symlink_out_is_refused(tmp_path, secret):
    lib = _library(tmp_path / "lib", {"skill_files": {"skill_cut": "skill_cut.md", "evil": "evil.md"}})
    (lib / "evil.md").symlink_to(secret)
    with pytest.raises(StorageError, match="resolves outside .* through a symlink"):
        SkillLibrary.load(lib)


def test_library_save_writes_only_inside(tmp_path, secret):
    lib = SkillLibrary(skills={"evil": Skill("evil", "x", file="../secret.txt")})
    with pytest.raises(StorageError, match="leaves its folder"):
        lib.save(tmp_path / "out")
    assert secret.read_text() == "do not read or overwrite"


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        ({"skill_files": ["skill_cut.md"]}, r"skill_files = \['skill_cut.md'\] is not a mapping"),
        ({"task_to_skill": {"cut": 3}}, "task_to_skill.cut = 3 is not a list"),
        ({"task_keywords": {"cut": 3}}, "task_keywords.cut = 3 is not a list"),
    ],
)
def test_malformed_mappings_are_one_line(tmp_path, mapping, message):
    with pytest.raises(StorageError, match=message):
        SkillLibrary.load(_library(tmp_path / "lib", mapping))


def test_binary_skill_file_is_one_line(tmp_path):
    lib = _library(tmp_path / "lib", {"skill_files": {"skill_cut": "skill_cut.md"}})
    (lib / "skill_cut.md").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(StorageError, match="is not readable UTF-8 text"):
        SkillLibrary.load(lib)


def test_symlink_loops_and_non_utf8_manifests_are_one_line(tmp_path):
    write(str(tmp_path / "d"))
    part = tmp_path / "d" / "part-00000.parquet"
    part.unlink()
    (tmp_path / "d" / "loop").symlink_to(tmp_path / "d" / "part-00000.parquet")
    part.symlink_to(tmp_path / "d" / "loop")
    with pytest.raises(StorageError, match="cannot be resolved"):
        storage.read_table(str(tmp_path / "d"), kind="trajectories", schema=TRAJECTORY_SCHEMA)
    write(str(tmp_path / "e"))
    (tmp_path / "e" / storage.MANIFEST).write_bytes(b'{"kind": "\xff"}')
    with pytest.raises(StorageError, match="is not UTF-8 text"):
        storage.read_table(str(tmp_path / "e"), kind="trajectories", schema=TRAJECTORY_SCHEMA)


def test_nested_skill_files_round_trip(tmp_path):
    lib = SkillLibrary(skills={"cut": Skill("cut", "1. take knife\n", file="sub/cut.md")})
    lib.save(tmp_path / "lib")
    assert SkillLibrary.load(tmp_path / "lib").skills["cut"].text == "1. take knife\n"
