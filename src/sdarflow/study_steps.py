"""The study pipeline's steps: what its components (``components/study.py``) call, the functions ``sdarflow study``
runs (``sdarflow.study``), one step per task."""

from __future__ import annotations

import dataclasses
import math

from sdarflow import storage
from sdarflow.errors import ConfigError
from sdarflow.study import (
    SETTINGS_FILE,
    StudySettings,
    cell_name,
    cell_uri,
    local_base,
    report,
    run_base,
    run_cell,
    start_of,
)


def run_step(
    step: str,
    settings: dict | str,
    method: str = "",
    seed: int = 0,
    *,
    html=None,
    markdown=None,
    metrics=None,
) -> str:
    """What the study pipeline's components call, with the settings as a dict or the URI ``check`` stored them at:
    ``check`` (validate, store ``study_settings.json`` in ``out``, return its URI), ``start`` (the cells' start
    point, ``start_of``; returns that URI again), ``base`` (evaluate the base model), ``cell`` (one method and seed)
    or ``report``; the same functions ``sdarflow study`` runs. ``base`` and
    ``cell`` return the cell's folder, ``report`` the study.json URI and fills the KFP UI artifacts."""
    from sdarflow.kfp_runtime import setup_logging

    setup_logging()
    if isinstance(settings, str):
        settings = storage.read_json(settings)
    s = StudySettings.from_dict(settings)  # KFP hands JSON numbers in lists over as floats: converted
    if step == "check":
        uri = storage.join(s.out, SETTINGS_FILE)
        storage.write_json(uri, dataclasses.asdict(s))
        return uri
    if step == "report":
        study = report(s)
        for artifact, name in ((html, "report.html"), (markdown, "report.md")):
            if artifact is not None:
                with open(artifact.path, "wb") as f:
                    f.write(storage.read_bytes(storage.join(s.out, name)))
        if metrics is not None:
            for row in study["table"]:
                for key in ("relative_pass@1", "relative_pass@k", "relative_ood_pass@1"):
                    value = row.get(key)
                    if isinstance(value, int | float) and math.isfinite(value):
                        metrics.log_metric(f"{row['method']}_{key}".replace("@", "_at_"), float(row[key]))
        return storage.join(s.out, "study.json")
    if not s.base_model:
        raise ConfigError("study pipeline: base_model is required; fix: pass an HF folder or s3:// URI")
    base = local_base(s)
    if step == "start":
        start_of(s, base)
        return storage.join(s.out, SETTINGS_FILE)  # what check stored: base and cells wait for this step
    if step == "base":
        run_base(s, base)
        return storage.join(s.out, "cells")
    if step == "cell":
        run_cell(s, base, method, seed)
        return cell_uri(s, cell_name(method, seed))
    raise ConfigError(f"study pipeline: unknown step {step!r}; allowed: check, start, base, cell, report")
