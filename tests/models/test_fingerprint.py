"""The base-model fingerprint covers every weight byte (issue: 16 sampled 4 KiB windows missed a change between
them), reads a file once per version of it (the sha256 cache), and works where the model is (``s3://``)."""

from __future__ import annotations

import os
import shutil

from sdarflow.models.identity import base_fingerprint, base_ids, legacy_fingerprints


def _flip_between_windows(path) -> None:
    """Change one weight byte halfway between the first two sampled windows, keeping the size, and move the
    modification time as any rewrite does (by a second, so a coarse clock cannot hide it)."""
    data = bytearray(path.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little")
    offset = start + (len(data) - start - 4096) // 15 // 2  # between window 0 and window 1
    data[offset] ^= 0xFF
    stat = path.stat()
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


def test_a_change_between_the_sampled_windows_changes_the_fingerprint(tiny_model, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(tiny_model, copy)
    before, sampled = base_fingerprint(str(copy)), legacy_fingerprints(str(copy))[0]
    assert before == base_fingerprint(str(tiny_model))  # the path is not the identity
    _flip_between_windows(copy / "model.safetensors")
    assert legacy_fingerprints(str(copy))[0] == sampled  # what the old fingerprint missed
    assert base_fingerprint(str(copy)) != before
    assert base_ids(str(copy)) == (base_fingerprint(str(copy)),)  # the legacy ones only for an older record
    assert base_ids(str(copy), sampled)[1:] == legacy_fingerprints(str(copy))


def test_the_sha256_of_a_file_version_is_read_once(tiny_model, tmp_path, monkeypatch):
    """The cache answers for an unchanged file (a planted digest shows it is not read again); a rewrite is read
    again even when it sets the old modification time back (the change time moves), and an unwritable cache only
    costs the next read."""
    monkeypatch.setenv("SDARFLOW_CACHE", str(tmp_path / "cache"))
    copy = tmp_path / "copy"
    shutil.copytree(tiny_model, copy)
    weights = copy / "model.safetensors"
    first = base_fingerprint(str(copy))
    (entry,) = (tmp_path / "cache" / "sha256").iterdir()
    entry.write_text("0" * 64)
    planted = base_fingerprint(str(copy))
    assert planted != first  # answered from the cache
    stat = weights.stat()
    _flip_between_windows(weights)
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    changed = base_fingerprint(str(copy))
    assert changed not in (first, planted)
    shutil.rmtree(tmp_path / "cache")
    (tmp_path / "cache").write_text("not a folder")  # unwritable
    assert base_fingerprint(str(copy)) == changed


def test_an_s3_base_has_the_fingerprint_of_its_local_copy(tiny_model, s3_root):
    from sdarflow import storage

    for f in sorted(tiny_model.iterdir()):
        if f.is_file():
            storage.write_bytes(f"{s3_root}/base/{f.name}", f.read_bytes())
    assert base_fingerprint(f"{s3_root}/base") == base_fingerprint(str(tiny_model))


def test_a_full_fine_tune_in_an_adapters_place_is_identified_by_what_it_computes(tiny_model, tmp_path):
    """evaluate's adapter_id of a full fine-tune: its config, weights and tokenizer files count; a report or a
    carried optimizer beside them does not."""
    from sdarflow.models.identity import adapter_folder_id

    model = tmp_path / "full"
    shutil.copytree(tiny_model, model)
    first = adapter_folder_id(model)
    (model / "train_summary.json").write_text("{}")
    (model / "optimizer.pt").write_bytes(b"state")
    assert adapter_folder_id(model) == first
    tokenizer = model / "tokenizer_config.json"
    tokenizer.write_text(tokenizer.read_text() + "\n")
    assert adapter_folder_id(model) != first
