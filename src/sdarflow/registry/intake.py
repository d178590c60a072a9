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
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

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


_Probability = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False, strict=True)]
_Count = Annotated[int, Field(gt=0, strict=True)]


class _SplitReport(BaseModel):
    """One split of an eval report as the gate reads it (other keys are kept, unchecked)."""

    model_config = ConfigDict(extra="allow")
    pass_at_k: dict[str, _Probability]
    ci95: dict[str, tuple[_Probability, _Probability]] = {}
    n_tasks: _Count | None = None
    samples_per_task: _Count | None = None

    @model_validator(mode="after")
    def _consistent(self) -> _SplitReport:
        if not all(k.isdigit() and int(k) > 0 for k in self.pass_at_k) or "1" not in self.pass_at_k:
            raise ValueError(f"pass_at_k keys {sorted(self.pass_at_k)} must be k = 1, 2, ... and include 1")
        values = [self.pass_at_k[k] for k in sorted(self.pass_at_k, key=int)]
        if any(b < a - 1e-9 for a, b in zip(values, values[1:])):
            raise ValueError(f"pass@k {values} must not decrease as k grows")
        if self.samples_per_task is not None and max(map(int, self.pass_at_k)) > self.samples_per_task:
            raise ValueError(f"pass@k with k above samples_per_task ({self.samples_per_task})")
        for k, (lo, hi) in self.ci95.items():
            if k not in self.pass_at_k or lo > hi:
                raise ValueError(f"ci95[{k}] = [{lo}, {hi}] is not an interval for a reported pass@{k}")
        return self


class _EvalReport(BaseModel):
    model_config = ConfigDict(extra="allow")
    splits: dict[str, _SplitReport]

    @model_validator(mode="after")
    def _has_test(self) -> _EvalReport:
        if "test" not in self.splits:
            raise ValueError("the test split, which the promotion gate compares, is missing")
        return self


def validate_report(report: Any, source: str, require: tuple[str, ...] = ()) -> dict[str, Any]:
    """``report`` when it is an eval report the gate can trust: a ``test`` split (and every split in ``require``),
    every pass@k a finite number in [0, 1] that does not decrease with k, intervals that are intervals.
    ConfigError (one line) otherwise."""
    try:
        _EvalReport.model_validate(report)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        msg = first["msg"].removeprefix("Value error, ")
        raise ConfigError(
            f"eval report {source}: {where}: {msg}; "
            f"fix: pass the eval_report.json written by `sdarflow evaluate`"
        ) from None
    missing = [s for s in require if s not in report["splits"]]
    if missing:
        raise ConfigError(
            f"eval report {source} has no {', '.join(missing)} split, which the promotion gate compares; "
            f"fix: evaluate with --splits {' --splits '.join(require)}"
        )
    return dict(report)


def load_report(eval_report: Mapping[str, Any] | str | Path) -> dict[str, Any]:
    if isinstance(eval_report, Mapping):
        return validate_report(dict(eval_report), "(dict)")
    return validate_report(storage.read_json(str(eval_report)), str(eval_report))


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
    _check_lora_tensors(adapter_dir, config)
    return config


def _check_lora_tensors(adapter_dir: Path, config: Mapping[str, Any]) -> None:
    """Every ``adapter_model.safetensors`` header parses, and its LoRA tensors have the rank the config declares
    (vLLM sizes its LoRA slots by it): a corrupt or mismatched adapter is refused before it can be promoted."""
    from sdarflow.models.policy import safetensors_shapes

    declared = lora_rank(config)
    for weights in adapter_dir.glob("adapter_model*.safetensors"):
        for name, shape in safetensors_shapes(weights, "adapter weights").items():
            if ".lora_A" not in name and ".lora_B" not in name:
                continue
            # lora_A is (rank, in, ...), lora_B is (out, rank, ...) (conv LoRA adds kernel dimensions)
            rank = shape[0 if ".lora_A" in name else 1] if len(shape) >= 2 else None
            if rank is None or (declared is not None and rank > declared):
                raise ModelError(
                    f"adapter '{adapter_dir}': tensor {name} has shape {shape}, not within the LoRA rank {declared} "
                    f"of its adapter_config.json; fix: re-save the adapter (config and weights together)"
                )


def stage_version(
    adapter_dir: Path, report: Mapping[str, Any], lineage: Mapping[str, Any], staged: Path
) -> None:
    """Lay out a version folder at ``staged``: the adapter files plus eval_report.json and lineage.json."""
    shutil.copytree(adapter_dir, staged, copy_function=_link_or_copy)
    (staged / EVAL_REPORT).write_text(json.dumps(dict(report), indent=2, sort_keys=True))
    (staged / LINEAGE).write_text(json.dumps(dict(lineage), indent=2, sort_keys=True, default=str))
