"""What ``register`` accepts: a PEFT adapter folder, an eval report, lineage; checked before anything is written,
then staged with the registry's own files in a temp folder, so the version is published in one manifest-last pass.

One of those files is the model card, the version's ``README.md`` (in place of PEFT's unfilled template), made from
the lineage, eval reports and adapter config (values escaped: ``sdarflow.report``) under YAML front matter for hubs.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from sdarflow import storage
from sdarflow.config import MAX_SEED, Checked, opt
from sdarflow.errors import ConfigError, ModelError
from sdarflow.evaluate.metrics import BASE_ADAPTER, REPORT, REPORT_KIND, EvalReport
from sdarflow.models.identity import (
    BASE_FILE,
    base_fingerprint,
    check_adapter,
    lora_rank,
    recorded_base,
    safetensors_shapes,
    weight_shapes,
)
from sdarflow.registry.layout import BASE_EVAL_REPORT, EVAL_REPORT, LINEAGE, RESERVED_FILES
from sdarflow.report import Report, Section, markdown, with_interval
from sdarflow.teacher import controls

log = logging.getLogger(__name__)


@dataclass
class Cursor(Checked):
    """Where a run's train tasks stopped (a version's lineage records it): the next unplayed task of the env's
    train split, the base seed the run sampled with, and the next evaluation task (the gate's tasks move on too:
    a gate that sees the same tasks every night is tuned to them)."""

    strict: ClassVar[bool] = True

    env: str = opt("", "the environment suite")
    next_task: int = opt(0, "index of the first train task not played yet", ge=0)
    seed: int = opt(0, "the run's base seed", ge=0, le=MAX_SEED)
    next_eval_task: int = opt(0, "index of the first test and ood task not evaluated yet", ge=0)


CURSOR_FIX = 'fix: e.g. {"env": "search-qa", "next_task": 48, "seed": 1, "next_eval_task": 32}'


def check_lineage(lineage: Any) -> None:
    """ConfigError unless ``lineage`` is a JSON object whose data cursor, if it has one, is one (a poisoned cursor
    would fail every later scheduled run that continues from it)."""
    if not isinstance(lineage, Mapping):
        raise ConfigError(f"lineage must be a JSON object, got {type(lineage).__name__}; fix: pass a dict")
    if lineage.get("cursor") is not None:
        Cursor.check(lineage["cursor"], "lineage: cursor", CURSOR_FIX)


def _link_or_copy(src: str, dst: str) -> str:
    # Staging hard-links the adapter files when it can: adapters can be large.
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
    return dst


def validate_report(report: Any, source: str, require: tuple[str, ...] = ()) -> dict[str, Any]:
    """``report`` when it is an eval report the gate can trust (``EvalReport``) with a ``test`` split and every
    split in ``require``; ConfigError (one line) otherwise."""
    EvalReport.check(
        report, f"eval report {source}", "fix: pass the eval_report.json written by `sdarflow evaluate`"
    )
    missing = [s for s in require if s not in report["splits"]]
    if missing:
        raise ConfigError(
            f"eval report {source} has no {', '.join(missing)} split, which the promotion gate compares; "
            f"fix: evaluate with --splits {' --splits '.join(require)}"
        )
    return dict(report)


def load_report(eval_report: Mapping[str, Any] | str | Path) -> dict[str, Any]:
    """A validated eval report: a dict, an evaluate stage's published output (its ``report.json``, verified
    against the manifest), or a report JSON file (path or URI)."""
    if isinstance(eval_report, Mapping):
        return validate_report(dict(eval_report), "(dict)")
    source = str(eval_report)
    if storage.is_published(source):
        return validate_report(
            storage.read_member_json(source, REPORT, REPORT_KIND), storage.join(source, REPORT)
        )
    if Path(source).is_dir():
        raise ConfigError(
            f"eval report '{source}' is a folder without {storage.MANIFEST} (an interrupted evaluate output?); "
            f"fix: pass a published evaluate output or a report JSON file"
        )
    return validate_report(storage.read_json(source), source)


def check_adapter_dir(adapter_dir: Path) -> dict[str, Any]:
    """Refuse a folder that is not a PEFT adapter; return its adapter_config.json."""
    config_path = adapter_dir / "adapter_config.json"
    if not adapter_dir.is_dir() or not config_path.is_file():
        raise ModelError(
            f"'{adapter_dir}' is not a PEFT adapter folder (no adapter_config.json); "
            f"fix: pass the folder the train stage saved with save_pretrained"
        )
    # Only safetensors: their weights are checked below and load without running code (a .bin is a pickle).
    other = sorted(p.name for p in adapter_dir.glob("adapter_model*") if p.suffix != ".safetensors")
    if other:
        raise ModelError(
            f"adapter '{adapter_dir}' holds {', '.join(other)}: the registry keeps safetensors weights only; fix: "
            f"re-save the adapter with save_pretrained(..., safe_serialization=True)"
        )
    if not any(adapter_dir.glob("adapter_model*.safetensors")):
        raise ModelError(
            f"'{adapter_dir}' has no adapter_model.safetensors; fix: pass a complete adapter folder"
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
    """Every ``adapter_model.safetensors`` header parses, its LoRA tensors have the rank the config declares (vLLM
    sizes its LoRA slots by it) and every weight is finite: a corrupt, mismatched or diverged adapter is refused
    before it can be promoted (served, it would answer with garbage)."""
    import torch
    from safetensors import safe_open

    declared = lora_rank(config)
    for weights in adapter_dir.glob("adapter_model*.safetensors"):
        for name, shape in safetensors_shapes(weights, "adapter weights").items():
            if (".lora_A" not in name and ".lora_B" not in name) or name.endswith(".bias"):
                continue  # not a LoRA matrix (lora_bias adds a 1-D bias to lora_B: no rank in it)
            # lora_A is (rank, in, ...), lora_B is (out, rank, ...) (conv LoRA adds kernel dimensions)
            rank = shape[0 if ".lora_A" in name else 1] if len(shape) >= 2 else None
            if rank is None or (declared is not None and rank > declared):
                raise ModelError(
                    f"adapter '{adapter_dir}': tensor {name} has shape {shape}, not within the LoRA rank {declared} "
                    f"of its adapter_config.json; fix: re-save the adapter (config and weights together)"
                )
        with safe_open(str(weights), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                bad = int((~torch.isfinite(f.get_tensor(name))).sum())
                if bad:
                    raise ModelError(
                        f"adapter weights '{weights}': tensor {name} holds {bad} NaN or infinite value(s) (training "
                        f"diverged); fix: register an adapter from a run whose steps stayed finite"
                    )


# tensor kind -> (its dimension, the base weight's dimension it must equal), base as (out, in): lora_A is (rank, in),
# lora_B (out, rank), an embedding's lora_embedding_A (rank, vocab), lora_embedding_B (dim, rank); any other tensor
# (modules_to_save) has the shape of the base tensor it replaces
_LORA_DIMS = {
    "lora_A": (1, 1),
    "lora_B": (0, 0),
    "lora_embedding_A": (1, 0),
    "lora_embedding_B": (0, 1),
}


def _misfit(key: str, shape: list[int], base: Mapping[str, list[int]], transposed: bool) -> str | None:
    for kind, (dim, base_dim) in _LORA_DIMS.items():
        if f".{kind}." not in f"{key}.":
            continue
        # PEFT names linear LoRA weights "<module>.lora_A.weight" and embedding ones "<module>.lora_embedding_A"
        module = f"{key}.".split(f".{kind}.")[0]
        weight = base.get(f"{module}.weight")
        if weight is None:
            # a tied output layer has no weight of its own in the checkpoint
            return None if module.endswith("lm_head") else f"{key} adapts '{module}', which the base lacks"
        if len(weight) != 2:  # a convolution's LoRA: not checked
            return None
        if transposed and not kind.startswith("lora_embedding"):
            weight = weight[::-1]
        if key.endswith(".bias"):  # lora_bias: lora_B's bias, one value per output feature
            return None if shape == [weight[0]] else f"{key} has shape {shape}, not [{weight[0]}]"
        if len(shape) != 2 or shape[dim] != weight[base_dim]:
            return f"{key} has shape {shape}, the base's {module}.weight is {list(weight)}"
        return None
    if key in base and base[key] != shape:
        return f"{key} has shape {shape}, the base's is {base[key]}"
    return None


def load_base_report(base_report: Mapping[str, Any] | str | Path) -> dict[str, Any]:
    """A validated eval report of the base model: one evaluated without an adapter."""
    report = load_report(base_report)
    if report.get("adapter") not in ("", BASE_ADAPTER):
        raise ConfigError(
            f"the base eval report evaluates adapter {report['adapter']!r}, not the base model; fix: pass an "
            f"evaluate output made without --adapter"
        )
    return report


def check_bound(
    report: Mapping[str, Any],
    adapter: str,
    base_id: str | None,
    base_report: Mapping[str, Any] | None = None,
    what: str = "the eval report",
) -> None:
    """Refuse (ConfigError) a ``report`` that did not evaluate the adapter whose :func:`adapter_id` is ``adapter``
    on the base model whose full fingerprint is ``base_id`` (:func:`bound_base_id`; None: not known, so only
    ``base_report`` is compared), or a ``base_report`` of another base model: the gate must judge what it is
    shown. An older evaluate's sampled fingerprint is another base's: it cannot show every weight byte."""
    fix = "fix: evaluate this adapter with `sdarflow evaluate --adapter ...` and register it with that report"
    recorded = report.get("adapter_id")
    if not recorded:
        raise ConfigError(
            f"{what} does not record which adapter it evaluated (adapter_id: it evaluated "
            f"{report.get('adapter')!r}, or was made by an older sdarflow); {fix}"
        )
    if recorded != adapter:
        raise ConfigError(
            f"{what} evaluated another adapter ({report.get('adapter')!r}, id {str(recorded)[:12]}) than this one "
            f"(id {adapter[:12]}); {fix}"
        )
    evaluated_on = report.get("base_id")
    if not evaluated_on:
        raise ConfigError(
            f"{what} does not record the base model it evaluated (base_id); fix: evaluate it again with "
            f"`sdarflow evaluate`"
        )
    if base_id is not None and evaluated_on != base_id:
        raise ConfigError(
            f"{what} evaluated the adapter on another base model (fingerprint {evaluated_on}) than the one it is "
            f"registered with ({base_id}), or recorded it by an older sdarflow's sampled fingerprint; fix: "
            f"evaluate it on this base model (--model) with this sdarflow"
        )
    if base_report is not None and base_report.get("base_id") != evaluated_on:
        raise ConfigError(
            f"the base eval report is of another base model (fingerprint {base_report.get('base_id')}) than the "
            f"adapter's eval report ({evaluated_on}); fix: pass the evaluate output of the same base model, made "
            f"without --adapter"
        )


def stage_version(
    adapter_dir: Path,
    report: Mapping[str, Any],
    lineage: Mapping[str, Any],
    staged: Path,
    base_report: Mapping[str, Any] | None = None,
) -> None:
    """Lay out a version folder at ``staged``: the adapter files plus the registry's report and lineage files."""
    shutil.copytree(adapter_dir, staged, copy_function=_link_or_copy)
    (staged / EVAL_REPORT).write_text(json.dumps(dict(report), indent=2, sort_keys=True))
    if base_report is not None:
        (staged / BASE_EVAL_REPORT).write_text(json.dumps(dict(base_report), indent=2, sort_keys=True))
    (staged / LINEAGE).write_text(json.dumps(dict(lineage), indent=2, sort_keys=True, default=str))


def checked_base(
    adapter_dir: Path, config: Mapping[str, Any], base_model: str | Path | None, *, strict: bool = False
) -> str:
    """The base model ``adapter_dir`` was checked against: ``base_model`` (a folder or ``s3://`` URI), else the
    adapter's ``base_model_name_or_path`` when that is a local folder; "" when none (logged). The adapter's base
    fingerprint (``strict``: no older build's, :func:`~sdarflow.models.identity.check_trained_on`) and every tensor
    shape (:data:`_LORA_DIMS`, from safetensors headers) must fit, or it is refused."""
    base = str(base_model or config.get("base_model_name_or_path") or "")
    if not (base and (base.startswith("s3://") or (Path(base) / "config.json").is_file())):
        if base_model:
            raise ConfigError(
                f"base model '{base_model}' is not an HF model folder (no config.json); fix: pass the folder (or "
                f"s3:// URI) the adapter was trained on"
            )
        log.warning(
            "register: adapter %s not checked against its base model (%s is not a local folder); pass the "
            "base model to check its tensor shapes",
            adapter_dir,
            base or "none recorded",
        )
        return ""
    check_adapter(str(adapter_dir), base, strict=strict)
    shapes = weight_shapes(base)
    if not shapes:
        raise ModelError(
            f"base model '{base}' has no safetensors weights to check the adapter against; fix: save the base "
            f"with safe_serialization=True"
        )
    transposed = bool(config.get("fan_in_fan_out"))  # GPT-2 style Conv1D weights are stored (in, out)
    for weights in sorted(adapter_dir.glob("adapter_model*.safetensors")):
        for name, shape in safetensors_shapes(weights, "adapter weights").items():
            problem = _misfit(name.removeprefix("base_model.model."), shape, shapes, transposed)
            if problem:
                raise ModelError(
                    f"adapter '{adapter_dir}' does not fit base model '{base}': {problem}; fix: register it "
                    f"with the base model it was trained on"
                )
    return base


def bound_base_id(adapter_dir: Path, base: str) -> str:
    """The base model fingerprint an eval report of ``adapter_dir`` must record: that of ``base``
    (:func:`checked_base`'s), else the one the adapter records (the train stage writes it), so a report is bound
    to a base model even where the base cannot be read here."""
    if base:
        return base_fingerprint(base)
    recorded = recorded_base(adapter_dir)
    if not recorded:
        raise ConfigError(
            f"adapter '{adapter_dir}' records no base model fingerprint ({BASE_FILE}) and its base model is not a "
            f"folder here, so its eval report cannot be bound to a base model; fix: pass --model (the folder or "
            f"s3:// URI it was trained on)"
        )
    return recorded


def _targets(modules: object) -> str:
    return ", ".join(sorted(map(str, modules))) if isinstance(modules, list | tuple | set) else str(modules)


def _figure(split: Mapping[str, Any], k: str) -> str:
    ci = split.get("ci95", {}).get(k)  # JSON may hold 1 for 1.0: printed as a float all the same
    return with_interval(float(split["pass_at_k"][k]), ci and [float(c) for c in ci])


def _evaluation(report: Mapping[str, Any], base_report: Mapping[str, Any] | None) -> Section:
    ks = sorted({k for s in report["splits"].values() for k in s["pass_at_k"]}, key=int)
    rows = []
    for who, rep in (("this version", report), ("base model", base_report)):
        for split, s in (rep or {}).get("splits", {}).items():
            counts = f"{s.get('n_tasks', '?')} x {s.get('samples_per_task', '?')}"
            rows.append([who, split, *(_figure(s, k) if k in s["pass_at_k"] else "-" for k in ks), counts])
    text = (
        "Held-out pass@k with 95% intervals (sdarflow evaluate); the base model on the same tasks and seeds."
    )
    header = ["model", "split", *(f"pass@{k}" for k in ks), "tasks x samples"]
    return Section("Evaluation", text=text if base_report else "", table=(header, rows))


def _teachers(contexts: Any) -> str:
    """The card's teacher line: the contexts that taught the version, a control named as one."""
    if not contexts:
        return "not recorded"
    control = controls(contexts)
    note = f" ({' and '.join(control)}: a control, refused for production)" if control else ""
    return ", ".join(map(str, contexts)) + note


def model_card(
    name: str,
    version: int,
    report: Mapping[str, Any],
    lineage: Mapping[str, Any],
    adapter_config: Mapping[str, Any],
    base_report: Mapping[str, Any] | None = None,
    registered_by: str = "",
) -> str:
    """The card as Markdown with YAML front matter."""
    base = str(lineage.get("base_model") or adapter_config.get("base_model_name_or_path") or "")
    method = str(lineage.get("method") or "")
    front = {
        "library_name": "peft",
        "base_model": base,
        "tags": ["sdarflow", "lora", *([method] if method else [])],
    }
    about = [
        ("base model", base or "not recorded"),
        ("method", method or "not recorded"),
        ("LoRA", f"rank {adapter_config.get('r')}, alpha {adapter_config.get('lora_alpha')}, "
                 f"targets {_targets(adapter_config.get('target_modules'))}"),
        ("teacher context", _teachers(lineage.get("teacher_contexts"))),
        ("run", f"{lineage.get('run_id', '?')}, round {lineage.get('round', '?')}"),
        ("registered by", registered_by or "?"),
    ]  # fmt: skip
    made_from = [
        (key, ", ".join(map(str, value)) if isinstance(value, list) else str(value))
        for key, value in sorted(lineage.items())
        if key not in ("base_model", "method", "teacher_contexts")
    ]
    path = f"<registry>/{name}/versions/{version}"
    use = [
        (
            "fetch",
            f"sdarflow registry fetch --registry REGISTRY --policy-name {name} --version {version} --output DIR",
        ),
        # lineage is data: quoted for the shell and Python, so a base named `x; rm -rf ~` stays a name
        (
            "serve with vLLM",
            f"vllm serve {shlex.quote(base or 'BASE')} --enable-lora --lora-modules {name}=DIR",
        ),
        (
            "load with PEFT",
            f"PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained({base or 'BASE'!r}), DIR)",
        ),
    ]
    doc = Report(
        title=f"{name} v{version}",
        subtitle=f"A LoRA adapter trained by sdarflow; this card is generated from the registry ({path}).",
        sections=[
            Section("About", items=about),
            _evaluation(report, base_report),
            Section(
                "Lineage", text="What made this version (URIs as the run recorded them).", items=made_from
            ),
            Section("Use", items=use),
        ],
    )
    return "---\n" + "".join(f"{k}: {json.dumps(v)}\n" for k, v in front.items()) + "---\n\n" + markdown(doc)
