"""A base model on object storage, copied once per node to local disk for the stages that read its weights."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from sdarflow import storage
from sdarflow.config import StageConfig, cache_dir

log = logging.getLogger(__name__)

# Stages that read the base model's weights (register reads an s3:// base's fingerprint by ranges: no copy)
LOADS_MODEL = ("generate", "rescore", "train", "evaluate")


def local_model(uri: str) -> str:
    """A base model by name or URI on local disk: a known pretrained model's name (``models.gguf_import.KNOWN``)
    is imported once into the cache; a model on object storage is copied once to the cache; paths pass."""
    from sdarflow.models.gguf_import import KNOWN, known_model

    if uri in KNOWN and not Path(uri).exists():
        return str(known_model(uri))
    if not uri.startswith("s3://"):
        return uri
    target = cache_dir() / "models" / hashlib.sha256(uri.encode()).hexdigest()[:16]
    if storage.download_dir(uri, target, marker="config.json", what="base_model"):
        log.info("base model %s -> %s", uri, target)
    return str(target)


def with_local_model(cfg: StageConfig) -> StageConfig:
    """``cfg`` with an ``s3://`` base model copied to local disk, for the stages that read its weights (every
    TrainJob rank fetches its own copy)."""
    if cfg.stage in LOADS_MODEL and getattr(cfg, "model", ""):
        cfg.model = local_model(cfg.model)
    return cfg
