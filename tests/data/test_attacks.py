"""Attacks by someone with write access to one folder or bucket prefix (a review's red-team findings), each a
regression test: nothing outside the artifact is deleted or read, a failed publish removes only what it wrote, a
registry's alias state cannot name a path, a run id is a folder name, and whatever else a file holds ends in one
line and exit code 2, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_schema_storage import rows, table, write

from sdarflow import storage
from sdarflow.cli import main
from sdarflow.errors import ConfigError, StorageError


def test_an_overwrite_never_deletes_through_a_symlinked_folder(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("secret")
    uri = str(tmp_path / "out")
    manifest = write(uri)
    (tmp_path / "out" / "sub").symlink_to(victim)
    storage.write_json(
        storage.join(uri, storage.MANIFEST), {**manifest, "attachments": [{"path": "sub/keep.txt"}]}
    )
    write(uri, table(2), overwrite=True)
    assert (victim / "keep.txt").read_text() == "secret" and rows(uri) == 2


def test_a_failed_first_publish_removes_only_what_it_wrote(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "notes.txt").write_text("the user's")
    with pytest.raises(RuntimeError), storage.publishing(str(folder)) as target:
        storage.write_bytes(target.file("half.bin"), b"x")
        raise RuntimeError("crash mid-write")
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]
    # and a publish that succeeds there leaves the user's file alone too
    manifest = write(str(folder))
    assert rows(str(folder)) == 5 and (folder / "notes.txt").read_text() == "the user's"
    assert manifest["prefix"].startswith(storage.GENERATION)


def test_a_published_folder_whose_file_links_out_is_refused_by_every_reader(tmp_path):
    outside = tmp_path / "outside.json"
    outside.write_text('{"splits": {}}')
    src = tmp_path / "src"
    src.mkdir()
    (src / "report.json").write_text('{"splits": {}}')
    uri = str(tmp_path / "artifact")
    storage.publish_dir(src, uri, kind="eval-report")
    (tmp_path / "artifact" / "report.json").unlink()
    (tmp_path / "artifact" / "report.json").symlink_to(outside)
    for read in (
        lambda: storage.read_member(uri, "report.json"),
        lambda: storage.fetch_dir(uri, kind="eval-report", dest=tmp_path / "copy"),
        lambda: storage.fetch_dir(uri, kind="eval-report"),
    ):
        with pytest.raises(StorageError, match="resolves outside"):
            read()


def test_an_entry_without_its_sha256_is_refused(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.json").write_text("{}")
    uri = str(tmp_path / "artifact")
    manifest = storage.publish_dir(src, uri, kind="adapter")
    files = [{"path": "a.json"}]
    storage.write_json(storage.join(uri, storage.MANIFEST), {**manifest, "files": files})
    with pytest.raises(StorageError, match="does not match its recorded sha256"):
        storage.fetch_dir(uri, kind="adapter", dest=tmp_path / "copy")
    storage.write_json(storage.join(uri, storage.MANIFEST), {**manifest, "files": files * 2})
    with pytest.raises(StorageError, match="lists a file more than once"):
        storage.read_manifest(uri)


@pytest.mark.parametrize("run_id", ["../../escaped", "/abs", "a/b", "..", ".hidden"])
def test_a_run_id_is_one_folder_name(tmp_path, run_id):
    from sdarflow.pipeline_config import PipelineConfig

    with pytest.raises(ConfigError, match="is not a folder name"):
        PipelineConfig.from_dict({"storage": str(tmp_path), "base_model": "m", "run_id": run_id})


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("deterministic", 2, "is not a valid bool"),
        ("deterministic", [1], "is not a valid bool"),
        ("input", {"a": 1}, "is not a list"),
        ("output", {"a": 1}, "is not a text value"),
        ("lora_targets", 5, "is not a list"),
        ("lr", "1_000", "is not a valid float"),
        ("micro_batch_tokens", " 3", "is not a valid int"),
        ("micro_batch_tokens", "٣", "is not a valid int"),
        ("seed", 2**64, "seed"),
    ],
)
def test_config_values_are_not_coerced_into_something_else(key, value, message):
    from sdarflow.stages.train import TrainConfig

    with pytest.raises(ConfigError, match=message):
        TrainConfig.from_dict({key: value})


def test_what_no_check_anticipated_is_still_one_line_and_verbose_shows_the_traceback(tmp_path, capsys):
    config = tmp_path / "generate.yaml"
    config.write_bytes(b"tasks: \xff\n")
    code = main(
        ["generate", "--config", str(config), "--model", str(tmp_path), "--output", str(tmp_path / "o")]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: unexpected UnicodeDecodeError") and "\n" not in err, err
    assert "--verbose" in err and not (tmp_path / "o").exists()
    with pytest.raises(UnicodeDecodeError):
        main(
            [
                "--verbose",
                "generate",
                "--config",
                str(config),
                "--model",
                str(tmp_path),
                "--output",
                str(tmp_path / "o"),
            ]
        )


def published_library(tmp_path: Path) -> str:
    from sdarflow.skills.library import Skill, SkillLibrary

    lib = SkillLibrary({"skill_cut": Skill("skill_cut", "# cut\nslice it", ["cut"], ["cut"], {"support": 3})})
    uri = str(tmp_path / "library")
    storage.publish_dir(lib.save(tmp_path / "made"), uri, kind="skills")
    return uri


def republish_mapping(uri: str, edit) -> None:
    """Edit the published mapping and record its new sha256, as someone with write access to the folder can."""
    import hashlib

    from sdarflow.skills.library import MAPPING

    path = Path(uri) / MAPPING
    mapping = json.loads(path.read_text())
    edit(mapping)
    path.write_text(json.dumps(mapping))
    manifest = storage.read_manifest(uri)
    for entry in manifest["files"]:
        if entry["path"] == MAPPING:
            entry.update(bytes=path.stat().st_size, sha256=hashlib.sha256(path.read_bytes()).hexdigest())
    storage.write_json(storage.join(uri, storage.MANIFEST), manifest)


def test_a_library_reads_only_the_files_its_manifest_lists(tmp_path):
    from sdarflow.skills.library import STATS
    from sdarflow.stages.common import load_skills

    uri = published_library(tmp_path)
    (Path(uri) / "extra.md").write_text("# slipped in")
    republish_mapping(uri, lambda m: m["skill_files"].update(extra="extra.md"))
    with pytest.raises(StorageError, match="names 'extra.md' for skill 'extra' but the file is missing"):
        load_skills(uri)
    republish_mapping(uri, lambda m: m["skill_files"].pop("extra"))
    (Path(uri) / STATS).write_text('{"arms": {"cut": {"skill_cut": {"pulls": 1, "reward_sum": 9.9}}}}')
    assert load_skills(uri).stats == {}  # unlisted: not read


def test_a_skill_or_index_too_large_for_any_prompt_is_refused_before_it_is_read(tmp_path):
    """A 23 MB skill was accepted and republished (rescoring 64 rows then took minutes at 4.6 GB)."""
    from sdarflow.skills.library import MAPPING, MAX_INDEX_BYTES, MAX_SKILL_BYTES, SkillLibrary

    published_library(tmp_path)
    folder = tmp_path / "made"
    skill = next(p for p in folder.glob("*.md"))
    skill.write_text("slice it. " * (MAX_SKILL_BYTES // 10 + 1))
    with pytest.raises(
        StorageError, match=f"is {skill.stat().st_size} bytes, more than the {MAX_SKILL_BYTES}"
    ):
        SkillLibrary.load(folder)
    skill.write_text("# cut\nslice it")
    assert SkillLibrary.load(folder).skills
    mapping = json.loads((folder / MAPPING).read_text())
    mapping["task_keywords"] = {"cut": ["knife"] * (MAX_INDEX_BYTES // 8)}
    (folder / MAPPING).write_text(json.dumps(mapping))
    with pytest.raises(StorageError, match=f"{MAPPING} is .* bytes, more than the {MAX_INDEX_BYTES}"):
        SkillLibrary.load(folder)


def test_a_json_file_too_big_to_be_ours_is_refused_before_it_is_read(tmp_path):
    """An eval report, lineage or manifest of gigabytes was read whole into memory: a JSON file (or a published
    JSON member, by its manifest's size) above MAX_JSON_BYTES is refused from its size alone."""
    from sdarflow.storage.files import MAX_JSON_BYTES

    big = tmp_path / "eval_report.json"
    with big.open("wb") as f:
        f.truncate(MAX_JSON_BYTES + 1)  # sparse: the size without the bytes
    with pytest.raises(
        StorageError, match=f"is {MAX_JSON_BYTES + 1} bytes, more than the {MAX_JSON_BYTES} read"
    ):
        storage.read_json(str(big))
    folder = tmp_path / "art"
    folder.mkdir()
    (folder / "report.json").write_text("{}")
    uri = str(tmp_path / "published")
    storage.publish_dir(folder, uri, kind="report")
    assert storage.read_member_json(uri, "report.json") == {}
    manifest = json.loads(Path(uri, storage.MANIFEST).read_text())
    manifest["files"][0]["bytes"] = (
        MAX_JSON_BYTES + 1
    )  # what a member says it holds is checked before reading
    Path(uri, storage.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(StorageError, match="report.json' is .* bytes, more than the"):
        storage.read_member_json(uri, "report.json")


@pytest.mark.parametrize(
    "stats",
    [
        {"arms": []},
        {"arms": {"cut": []}},
        {"arms": {"cut": {"skill_cut": {"pulls": "x", "reward_sum": 0.0}}}},
        {"arms": {"cut": {"skill_cut": {"pulls": 1, "reward_sum": float("nan")}}}},
        {"arms": {"cut": {"skill_cut": {"pulls": -1, "reward_sum": 0.0}}}},
    ],
)
def test_ucb_statistics_of_another_shape_are_refused(tmp_path, stats):
    from sdarflow.skills.library import STATS, SkillLibrary

    published_library(tmp_path)
    (tmp_path / "made" / STATS).write_text(json.dumps(stats))
    with pytest.raises(StorageError, match=f"{STATS}: .* fix: delete"):
        SkillLibrary.load(tmp_path / "made")


def test_what_kfp_and_python_callers_pass_is_still_accepted():
    """The strict coercion keeps the values real callers send: KFP's dict parameters carry numbers as floats
    (8.0, and a bool 1 as 1.0), Python callers pass tuples, YAML a lone string for a one-item list (never split
    at commas: an S3 key may hold one)."""
    from sdarflow.stages.train import TrainConfig

    cfg = TrainConfig.from_dict(
        {
            "micro_batch_tokens": 8.0,
            "deterministic": 1.0,
            "lora_targets": ("q_proj", "v_proj"),
            "input": "s3://bucket/runs/a,b",
        }
    )
    assert cfg.micro_batch_tokens == 8 and cfg.deterministic is True
    assert cfg.lora_targets == ["q_proj", "v_proj"] and cfg.input == ["s3://bucket/runs/a,b"]
