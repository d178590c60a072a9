"""What a model or adapter folder is, read from its files without loading it (and without torch): the base-model
fingerprint adapters record, the check that an adapter belongs to a base, tensor shapes from safetensors headers,
and a LoRA adapter's rank as vLLM needs it (rollouts, intake and serving all use ``lora_rank`` and
``max_lora_rank``, so an adapter served is an adapter sampled from)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from sdarflow.errors import ModelError

log = logging.getLogger(__name__)

# Written beside adapter_config.json: which base model (by fingerprint) the adapter was trained on.
BASE_FILE = "base_model.json"
# the files of a full fine-tune that make it what it computes, besides its weights (*.safetensors)
FULL_MODEL_FILES = frozenset(
    {
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
    }
)


def adapter_files(names: Iterable[str]) -> list[str]:
    """The files that make an adapter what it computes: its PEFT config and weights (not a card, lineage, a carried
    optimizer or the registry's own files)."""
    return sorted(n for n in names if n == "adapter_config.json" or n.startswith("adapter_model"))


def files_id(sha256s: Mapping[str, str]) -> str:
    """The identity of a set of files from their sha256 digests (file name -> digest): the sha256 of their sorted
    ``name:digest`` lines."""
    lines = "".join(f"{n}:{sha256s[n]}\n" for n in sorted(sha256s))
    return hashlib.sha256(lines.encode()).hexdigest()


def adapter_id(sha256s: Mapping[str, str]) -> str:
    """An adapter's identity from its files' sha256 digests (file name -> digest; :func:`adapter_files` count):
    :func:`files_id` of those. A published artifact's manifest holds the digests, so a registered version's
    identity needs no weight read."""
    return files_id({n: sha256s[n] for n in adapter_files(sha256s)})


def adapter_folder_id(folder: str | Path) -> str:
    """:func:`adapter_id` of a local adapter folder, its files hashed in full; of a full fine-tune in an adapter's
    place (:func:`is_full_fine_tune`), the same over its config, weights and tokenizer."""
    from sdarflow import storage

    root = Path(folder)
    names = [p.name for p in root.iterdir()]
    if is_full_fine_tune(str(root)):  # what it computes: config, weights and how text becomes tokens
        names = [n for n in names if n in FULL_MODEL_FILES or n.endswith(".safetensors")]
    else:
        names = adapter_files(names)
    return files_id({n: storage.file_sha256(root / n) for n in names})


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


_SAMPLES, _WINDOW = 16, 4096  # the sampled fingerprint's windows per weight file


def _model_files(path: str):
    """(filesystem, folder, config.json bytes, weight files as (name, size, mtime_ns), safetensors first) of a model
    folder, local or ``s3://``: what the fingerprints and the shape check read, by ranges, without copying it."""
    import pyarrow.fs as pafs

    from sdarflow import storage

    loc = storage.resolve(path)
    try:
        infos = loc.fs.get_file_info(pafs.FileSelector(loc.path, allow_not_found=True))
        found = {Path(i.path).name: (i.size, i.mtime_ns) for i in infos if i.type == pafs.FileType.File}
        config = loc.fs.open_input_file(f"{loc.path}/config.json").read() if "config.json" in found else None
    except OSError as err:
        raise ModelError(
            f"model folder '{path}' cannot be read ({err}); fix: check the URI and credentials"
        ) from err
    if config is None:
        check_model_dir(path)  # raises: the one message for a folder without config.json
    weights = [
        (n, *found[n]) for suffix in (".safetensors", ".bin") for n in sorted(found) if n.endswith(suffix)
    ]
    return loc.fs, loc.path, config, weights


def _file_sha256(fs, path: str, size: int, mtime_ns: int | None) -> str:
    """sha256 of a whole weight file, cached under ``cache_dir()/sha256`` by its path, size and modification time
    (and, on a local disk, its inode and change time, which a copy that keeps the modification time, ``cp -p`` or
    ``rsync -a``, does not keep): a 7B model's 15 GB are read once per machine and version of the files. Caching is
    best effort: an unwritable cache only costs the next read."""
    import pyarrow.fs as pafs

    from sdarflow.config import cache_dir

    local = ""
    if isinstance(fs, pafs.LocalFileSystem):
        st = os.stat(path)
        local = f":{st.st_ino}:{st.st_ctime_ns}"
    key = hashlib.sha256(f"{type(fs).__name__}:{path}:{size}:{mtime_ns}{local}".encode()).hexdigest()[:32]
    entry = cache_dir() / "sha256" / key
    if mtime_ns is not None and entry.is_file():
        cached = entry.read_text().strip()
        if len(cached) == 64 and all(c in "0123456789abcdef" for c in cached):
            return cached
    from sdarflow import storage

    with fs.open_input_stream(path) as f:
        value = storage.copy_hashing(f)[1]
    if mtime_ns is not None:  # a filesystem without modification times is read every time
        try:
            entry.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=entry.parent, prefix=f".{key}.")
            with os.fdopen(fd, "w") as out:
                out.write(value)
            os.replace(tmp, entry)
        except OSError as err:
            log.warning(
                "could not cache the sha256 of %s in %s (%s); it is read again next time", path, entry, err
            )
    return value


def base_fingerprint(path: str) -> str:
    """Identity of a base model for adapter compatibility, not its (mount) path: the sha256 of config.json and of
    every weight file's name, size and whole-content sha256 (cached per file version, :func:`_file_sha256`), so
    two models that differ in any weight byte differ. An ``s3://`` base is hashed where it is, streamed."""
    fs, folder, config, weights = _model_files(path)
    digest = hashlib.sha256(config)
    for name, size, mtime_ns in weights:
        digest.update(f"{name}:{size}:{_file_sha256(fs, f'{folder}/{name}', size, mtime_ns)}\n".encode())
    return digest.hexdigest()[:16]


def legacy_fingerprints(path: str) -> tuple[str, ...]:
    """The fingerprints older builds recorded for this base, still accepted (with a warning) where an adapter or a
    report carries one: 16 evenly spaced 4 KiB windows of each weight file (blind to a change between them), and
    config.json alone (before fingerprints covered the weights)."""
    fs, folder, config, weights = _model_files(path)
    digest = hashlib.sha256(config)
    for name, size, _ in weights:
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
    return digest.hexdigest()[:16], hashlib.sha256(config).hexdigest()[:16]


def base_ids(path: str, recorded: str | None = None) -> tuple[str, ...]:
    """The fingerprints a record of this base may carry: :func:`base_fingerprint` first, then (read only when
    ``recorded``, the fingerprint a record carries, is not the current one) the legacy ones."""
    current = base_fingerprint(path)
    return (current,) if recorded in (None, current) else (current, *legacy_fingerprints(path))


def weight_shapes(path: str) -> dict[str, list[int]]:
    """Tensor name -> shape of every safetensors file of a model folder (local or ``s3://``), from the headers
    alone (8 bytes and a JSON header per file: no weights read); ModelError for a header that is not one."""
    fs, folder, _, weights = _model_files(path)
    shapes: dict[str, list[int]] = {}
    for name, size, _ in weights:
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


def check_adapter(adapter: str, base_path: str, *, strict: bool = False) -> dict:
    """The adapter's PEFT config, after checking it was trained on ``base_path`` (ModelError otherwise;
    ``strict``: :func:`check_trained_on`'s)."""
    try:
        config = json.loads((Path(adapter) / "adapter_config.json").read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ModelError(
            f"adapter '{adapter}' has no readable adapter_config.json ({err}); fix: pass a PEFT folder"
        ) from err
    check_trained_on(adapter, base_path, strict=strict)
    return config


def is_full_fine_tune(folder: str) -> bool:
    """Whether ``folder``, given where an adapter goes, is a whole model (an HF model folder, not a PEFT one): what
    train publishes with ``--lora-rank 0``, which :func:`check_trained_on` ties to its base."""
    path = Path(folder)
    return not (path / "adapter_config.json").is_file() and (path / "config.json").is_file()


def recorded_base(folder: str | Path, what: str = "adapter") -> str | None:
    """The base model fingerprint the ``what`` ``folder`` records in ``BASE_FILE`` (the train stage writes it);
    None when it records none."""
    base_file = Path(folder) / BASE_FILE
    try:
        recorded = json.loads(base_file.read_text()).get("fingerprint") if base_file.is_file() else None
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as err:
        raise ModelError(
            f"{what} '{folder}': {BASE_FILE} is not a JSON object with a fingerprint ({err}); fix: re-export the "
            f"{what} with the train stage"
        ) from err
    return str(recorded) if recorded else None


def check_trained_on(folder: str, base_path: str, what: str = "adapter", *, strict: bool = False) -> None:
    """ModelError unless the ``what`` (adapter or full fine-tune) ``folder`` records ``base_path``'s fingerprint
    in ``BASE_FILE``; only an adapter from before fingerprints were recorded may lack it. An older build's
    fingerprint (:func:`legacy_fingerprints`) is accepted with a warning, or refused when ``strict`` (the registry:
    a sampled fingerprint cannot show that every weight byte is the base's)."""
    recorded = recorded_base(folder, what)
    if not recorded:
        if what != "adapter":
            raise ModelError(
                f"{what} '{folder}' records no base model ({BASE_FILE}), so it cannot stand where an adapter of "
                f"'{base_path}' goes; fix: pass a model the train stage fine-tuned from it (--lora-rank 0)"
            )
        return
    ids = base_ids(base_path, recorded)
    if recorded not in ids:
        raise ModelError(
            f"{what} '{folder}' was trained on a different base model than '{base_path}' "
            f"(fingerprint {recorded} != {ids[0]}); fix: pass the matching --model"
        )
    if recorded == ids[0]:
        return
    if strict:
        raise ModelError(
            f"{what} '{folder}' records its base model by an older fingerprint ({recorded}: sampled weights or the "
            f"config alone), which cannot show it was trained on every weight byte of '{base_path}'; fix: train it "
            f"again with this sdarflow"
        )
    log.warning(
        "%s %s records its base model by an older fingerprint (sampled weights or the config alone), "
        "blind to some weight changes; retrain it to pin every weight byte",
        what,
        folder,
    )


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
