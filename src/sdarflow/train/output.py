"""What a train run publishes: the adapter in PEFT format (a full HF model folder for a full fine-tune) with
``train_summary.json``, the reports and the base model's fingerprint, as one atomic artifact; and the run's record
in the tracking server, when one is configured."""

from __future__ import annotations

import json
from pathlib import Path

from sdarflow import storage
from sdarflow.tracking import log_stage_run


def publish_run(
    cfg,
    policy,
    model,
    masters: dict,
    out: Path,
    history: list[dict],
    summary: dict,
    record: dict,
) -> None:
    """Publish the trained ``model`` (``masters``: full-precision weights that replace its bf16 copies) from the
    staging folder ``out`` to ``cfg.output``, with ``record`` as train_summary.json and reports of ``history``."""
    from sdarflow.models.identity import BASE_FILE, base_fingerprint
    from sdarflow.train.report import write_reports

    full = cfg.lora_rank == 0 and not cfg.adapter
    # PEFT keeps only the adapter's keys of the state dict it is given; the masters replace bf16 module copies.
    model.save_pretrained(out, state_dict={**model.state_dict(), **masters} if masters else None)
    if full:
        policy.tokenizer.save_pretrained(out)  # a full model folder is usable as --model on its own
    else:
        (out / BASE_FILE).write_text(json.dumps({"fingerprint": base_fingerprint(cfg.model)}))
    (out / "train_summary.json").write_text(json.dumps(record, indent=2, sort_keys=True))
    label = "sft warm start" if cfg.mode == "sft" else cfg.method
    write_reports(out, history, summary, f"train: {label}, {len(history)} steps")
    storage.publish_dir(
        out,
        cfg.output,
        kind="model" if full else "adapter",
        overwrite=cfg.overwrite,
        config_hash=cfg.config_hash(),
        inputs=[*cfg.input, cfg.model] + ([cfg.adapter] if cfg.adapter else []),
        method="sft" if cfg.mode == "sft" else cfg.method,
        metrics=summary,
    )
    tags = {"sdarflow.output": cfg.output, "sdarflow.config_hash": cfg.config_hash()}
    log_stage_run(
        cfg.tracking_uri, "train", cfg.to_dict(), summary, history=history, artifacts=out, tags=tags
    )
