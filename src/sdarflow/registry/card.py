"""The model card of a registry version: its ``README.md``, written at register in place of PEFT's unfilled
template, from what the registry knows (the lineage, the eval reports, the adapter config), so a team reads one
file before promoting or serving a version. Values are escaped (``sdarflow.report``); the front matter is YAML a
model hub reads (``library_name``, ``base_model``, ``tags``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sdarflow.report import Report, Section, markdown


def _targets(modules: object) -> str:
    return ", ".join(sorted(map(str, modules))) if isinstance(modules, list | tuple | set) else str(modules)


def _figure(split: Mapping[str, Any], k: str) -> str:
    value = split["pass_at_k"][k]
    ci = split.get("ci95", {}).get(k)
    return f"{value:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")


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
        ("run", f"{lineage.get('run_id', '?')}, round {lineage.get('round', '?')}"),
        ("registered by", registered_by or "?"),
    ]  # fmt: skip
    made_from = [
        (key, ", ".join(map(str, value)) if isinstance(value, list) else str(value))
        for key, value in sorted(lineage.items())
        if key not in ("base_model", "method")
    ]
    path = f"<registry>/{name}/versions/{version}"
    use = [
        (
            "fetch",
            f"sdarflow registry fetch --registry REGISTRY --policy-name {name} --version {version} --output DIR",
        ),
        ("serve with vLLM", f"vllm serve {base or 'BASE'} --enable-lora --lora-modules {name}=DIR"),
        (
            "load with PEFT",
            f"PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained('{base or 'BASE'}'), DIR)",
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
