"""What ``register`` accepts: a PEFT adapter folder, an eval report, lineage; checked before anything is written.

Staging copies the adapter next to the registry's own files (eval_report.json, lineage.json) in a temp folder,
hard-linking where possible, so the version is published in one manifest-last pass.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sdarflow import storage
from sdarflow.errors import ConfigError, ModelError
from sdarflow.registry.layout import EVAL_REPORT, LINEAGE, RESERVED_FILES


def _link_or_copy(src: str, dst: str) -> str:
    # Staging the version folder hard-links the adapter files when it can: adapters can be large.
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
    return dst


def load_report(eval_report: Mapping[str, Any] | str | Path) -> dict[str, Any]:
    report = dict(eval_report) if isinstance(eval_report, Mapping) else storage.read_json(str(eval_report))
    if not isinstance(report.get("splits"), Mapping):
        raise ConfigError(
            f"eval report {eval_report if not isinstance(eval_report, Mapping) else '(dict)'} has no 'splits' "
            f"mapping; fix: pass the eval_report.json written by `sdarflow evaluate`"
        )
    return report


def lora_rank(adapter_config: Mapping[str, Any]) -> int | None:
    """The largest LoRA rank (``r`` and any per-module ``rank_pattern``): vLLM's --max-lora-rank needs it."""
    ranks = [adapter_config.get("r"), *dict(adapter_config.get("rank_pattern") or {}).values()]
    ints = [r for r in ranks if isinstance(r, int) and not isinstance(r, bool) and r > 0]
    return max(ints) if ints else None


def check_adapter_dir(adapter_dir: Path) -> dict[str, Any]:
    """Refuse a folder that is not a PEFT adapter; return its adapter_config.json."""
    config_path = adapter_dir / "adapter_config.json"
    if not adapter_dir.is_dir() or not config_path.is_file():
        raise ModelError(
            f"'{adapter_dir}' is not a PEFT adapter folder (no adapter_config.json); "
            f"fix: pass the folder the train stage saved with save_pretrained"
        )
    if not any(adapter_dir.glob("adapter_model.*")):
        raise ModelError(
            f"'{adapter_dir}' has no adapter_model.safetensors (or .bin); fix: pass a complete adapter folder"
        )
    for reserved in RESERVED_FILES:
        if (adapter_dir / reserved).exists():
            raise ConfigError(
                f"adapter folder '{adapter_dir}' contains '{reserved}', which the registry writes itself; "
                f"fix: remove it from the folder (pass the report with --eval and lineage with --lineage)"
            )
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as err:
        raise ModelError(f"'{config_path}' is not valid JSON ({err.msg}); fix: re-save the adapter") from err
    if not isinstance(config, dict):
        raise ModelError(f"'{config_path}' is not a JSON object; fix: re-save the adapter")
    return config


def stage_version(
    adapter_dir: Path, report: Mapping[str, Any], lineage: Mapping[str, Any], staged: Path
) -> None:
    """Lay out a version folder at ``staged``: the adapter files plus eval_report.json and lineage.json."""
    shutil.copytree(adapter_dir, staged, copy_function=_link_or_copy)
    (staged / EVAL_REPORT).write_text(json.dumps(dict(report), indent=2, sort_keys=True))
    (staged / LINEAGE).write_text(json.dumps(dict(lineage), indent=2, sort_keys=True, default=str))
