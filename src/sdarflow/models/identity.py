"""What a model or adapter folder is, read from its files without loading it (and without torch): the base-model
fingerprint adapters record, the check that an adapter belongs to a base, tensor shapes from safetensors headers,
and a LoRA adapter's rank as vLLM needs it (rollouts, intake and serving all use ``lora_rank`` and
``max_lora_rank``, so an adapter served is an adapter sampled from)."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from sdarflow.errors import ModelError

log = logging.getLogger(__name__)

# Written beside adapter_config.json: which base model (by fingerprint) the adapter was trained on.
BASE_FILE = "base_model.json"


def adapter_files(names: Iterable[str]) -> list[str]:
    """The files that make an adapter what it computes: its PEFT config and weights (not a card, lineage, a carried
    optimizer or the registry's own files)."""
    return sorted(n for n in names if n == "adapter_config.json" or n.startswith("adapter_model"))


def adapter_id(sha256s: Mapping[str, str]) -> str:
    """An adapter's identity from its files' sha256 digests (file name -> digest; :func:`adapter_files` count):
    the sha256 of their sorted ``name:digest`` lines. A published artifact's manifest holds the digests, so a
    registered version's identity needs no weight read."""
    lines = "".join(f"{n}:{sha256s[n]}\n" for n in adapter_files(sha256s))
    return hashlib.sha256(lines.encode()).hexdigest()


def adapter_folder_id(folder: str | Path) -> str:
    """:func:`adapter_id` of a local adapter folder, its files hashed in full."""
    from sdarflow import storage

    root = Path(folder)
    return adapter_id(
        {n: storage.file_sha256(root / n) for n in adapter_files(p.name for p in root.iterdir())}
    )


def check_model_dir(path: str) -> Path:
    """``path`` as a local HF model folder whose config and tokenizer config load without the folder's own code
    (ModelError otherwise). A config's ``auto_map`` names Python shipped in the folder; transformers would ask on
    stdin whether to run it, so ``yes | sdarflow ...`` would import it: sdarflow never runs a model's code."""
    p = Path(path)
    if not (p / "config.json").is_file():
        raise ModelError(
            f"model folder '{path}' not found or has no config.json; fix: pass an HF model folder "
            f"(build the demo model with `sdarflow build-model --output DIR`)"
        )
    for name in ("config.json", "tokenizer_config.json"):
        try:
            config = json.loads((p / name).read_text()) if (p / name).is_file() else {}
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ModelError(
                f"model folder '{path}': {name} is not JSON ({err}); fix: re-export the model"
            ) from err
        if isinstance(config, dict) and config.get("auto_map"):
            raise ModelError(
                f"model folder '{path}' ships its own Python ({name} has auto_map), which sdarflow never runs; "
                f"fix: use a model whose architecture transformers has built in, or convert it to one"
            )
    return p


_SAMPLES, _WINDOW = 16, 4096  # weight bytes sampled per file for the fingerprint


def _model_files(path: str):
    """(filesystem, folder, config.json bytes, weight files as (name, size), safetensors first) of a model folder,
    local or ``s3://``: what the fingerprint and the shape check read, by ranges, without copying the model."""
    import pyarrow.fs as pafs

    from sdarflow import storage

    loc = storage.resolve(path)
    try:
        infos = loc.fs.get_file_info(pafs.FileSelector(loc.path, allow_not_found=True))
        found = {Path(i.path).name: i.size for i in infos if i.type == pafs.FileType.File}
        config = loc.fs.open_input_file(f"{loc.path}/config.json").read() if "config.json" in found else None
    except OSError as err:
        raise ModelError(
            f"model folder '{path}' cannot be read ({err}); fix: check the URI and credentials"
        ) from err
    if config is None:
        check_model_dir(path)  # raises: the one message for a folder without config.json
    weights = [
        (n, found[n]) for suffix in (".safetensors", ".bin") for n in sorted(found) if n.endswith(suffix)
    ]
    return loc.fs, loc.path, config, weights


def base_fingerprint(path: str) -> str:
    """Identity of a base model for adapter compatibility, not its (mount) path: config.json, every weight file's
    name and size, each safetensors header (tensor names, dtypes, shapes) and 16 evenly spaced 4 KiB windows of
    its weights. Two models with the same config but other weights differ; reading it costs ~64 KiB per file, so
    an ``s3://`` base is fingerprinted where it is."""
    fs, folder, config, weights = _model_files(path)
    digest = hashlib.sha256(config)
    for name, size in weights:
        digest.update(f"{name}:{size}".encode())
        with fs.open_input_file(f"{folder}/{name}") as f:
            start = 0
            if name.endswith(".safetensors") and size >= 8:
                header = int.from_bytes(f.read(8), "little")
                digest.update(f.read(min(header, size - 8)))
                start = min(size, 8 + header)
            for i in range(_SAMPLES):
                f.seek(start + max(0, size - start - _WINDOW) * i // (_SAMPLES - 1))
                digest.update(f.read(_WINDOW))
    return digest.hexdigest()[:16]


def config_fingerprint(path: str) -> str:
    """The fingerprint adapters recorded before it covered the weights (config.json only); still accepted."""
    return hashlib.sha256(_model_files(path)[2]).hexdigest()[:16]


def weight_shapes(path: str) -> dict[str, list[int]]:
    """Tensor name -> shape of every safetensors file of a model folder (local or ``s3://``), from the headers
    alone (8 bytes and a JSON header per file: no weights read); ModelError for a header that is not one."""
    fs, folder, _, weights = _model_files(path)
    shapes: dict[str, list[int]] = {}
    for name, size in weights:
        if not name.endswith(".safetensors"):
            continue
        fix = f"base weights '{path}/{name}' is not a valid safetensors file"
        with fs.open_input_file(f"{folder}/{name}") as f:
            length = int.from_bytes(f.read(8), "little") if size >= 8 else -1
            if not 0 < length <= size - 8:
                raise ModelError(
                    f"{fix} (header of {length} bytes in a {size}-byte file); fix: save it again"
                )
            try:
                header = json.loads(f.read(length))
                shapes.update({k: list(v["shape"]) for k, v in header.items() if k != "__metadata__"})
            except (ValueError, TypeError, KeyError, AttributeError) as err:
                raise ModelError(f"{fix} ({err}); fix: save it again") from err
    return shapes


def safetensors_shapes(path: Path, what: str) -> dict[str, list[int]]:
    """Tensor name -> shape, read from a safetensors header (no weights loaded); ModelError when it is corrupt."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), "pt") as f:
            return {name: list(f.get_slice(name).get_shape()) for name in f.keys()}
    except (SafetensorError, OSError) as err:
        first = str(err).strip().splitlines()[0]
        raise ModelError(
            f"{what} '{path}' is not a valid safetensors file ({first}); fix: save it again"
        ) from err


def check_adapter(adapter: str, base_path: str) -> dict:
    """The adapter's PEFT config, after checking it was trained on ``base_path`` (ModelError otherwise)."""
    try:
        config = json.loads((Path(adapter) / "adapter_config.json").read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ModelError(
            f"adapter '{adapter}' has no readable adapter_config.json ({err}); fix: pass a PEFT folder"
        ) from err
    base_file = Path(adapter) / BASE_FILE
    try:
        recorded = json.loads(base_file.read_text()).get("fingerprint") if base_file.is_file() else None
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as err:
        raise ModelError(
            f"adapter '{adapter}': {BASE_FILE} is not a JSON object with a fingerprint ({err}); fix: re-export the "
            f"adapter with the train stage"
        ) from err
    if recorded and recorded == config_fingerprint(base_path):
        log.warning(
            "adapter %s records only its base model's config (written before fingerprints covered the weights); "
            "retrain it to pin the base weights too",
            adapter,
        )
    elif recorded and recorded != base_fingerprint(base_path):
        raise ModelError(
            f"adapter '{adapter}' was trained on a different base model than '{base_path}' "
            f"(fingerprint {recorded} != {base_fingerprint(base_path)}); fix: pass the matching --model"
        )
    return config


# The values vLLM's --max-lora-rank accepts (vllm.config.lora.MaxLoRARanks); a rank is rounded up to one.
VLLM_LORA_RANKS: tuple[int, ...] = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def lora_rank(adapter_config: Mapping[str, Any]) -> int | None:
    """The largest LoRA rank (``r`` and any per-module ``rank_pattern``); None when the config declares none."""
    ranks = [adapter_config.get("r"), *dict(adapter_config.get("rank_pattern") or {}).values()]
    ints = [r for r in ranks if isinstance(r, int) and not isinstance(r, bool) and r > 0]
    return max(ints) if ints else None


def max_lora_rank(ranks: Iterable[int]) -> int:
    """vLLM's ``--max-lora-rank`` for these LoRA ranks: the largest, rounded up to a value vLLM accepts."""
    rank = max(ranks)
    for allowed in VLLM_LORA_RANKS:
        if rank <= allowed:
            return allowed
    raise ModelError(
        f"LoRA rank {rank} is above vLLM's maximum {VLLM_LORA_RANKS[-1]}; allowed --max-lora-rank values: "
        f"{', '.join(map(str, VLLM_LORA_RANKS))}; fix: train the adapter with a smaller r"
    )
