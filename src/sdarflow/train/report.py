"""What a training run records and publishes: its per-step records (the progress line a pod log shows,
``metrics.jsonl`` with one flushed line per step, the summary metrics), its report (``report.md`` and a
self-contained, deterministic ``report.html`` with one PNG of loss, gate mean, teacher gap and entropy over the
steps), and the published artifact: the adapter in PEFT format (a full HF model folder for a full fine-tune) with
``train_summary.json``, the reports and the base model's fingerprint, atomically, and the run's record in the
tracking server, when one is configured."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sdarflow import storage
from sdarflow.report import Report, Section, html, markdown, png
from sdarflow.teacher import UNKNOWN_CONTEXT
from sdarflow.tracking import finite, log_stage_run

# The format probe's (extensions.format_probe) keys in the record of a step after which it repaired or rolled back.
REMEDY_KEY = "format/remedy_steps"  # the remedy's SFT steps
ROLLBACK_KEY = "format/rolled_back_to_step"  # after a spike the remedy did not mend: the step returned to


def progress_line(r: dict) -> str:
    def f(key: str, digits: int) -> str:
        v = r.get(key)
        return "-" if v is None else f"{v:.{digits}f}"

    return (
        f"step {r['step']} {r.get('kind', 'rl')} | loss {f('loss/total', 4)} | pg {f('loss/pg', 4)} | "
        f"gate {f('sdar/gate_mean', 3)} | gap {f('sdar/teacher_gap_mean', 3)} | aux/pg {f('grad/aux_share', 4)} | kl {f('actor/kl_loss', 4)} | "
        f"ent {f('actor/entropy', 3)} | clip {f('actor/clipfrac', 3)} | "
        f"grad {f('grad_norm', 3)} | lr {f('lr', 6)} | {r['seconds']:.2f} s/it"
    )


def _line(record: dict) -> str:
    # inf/nan are not JSON (browsers and the KFP UI reject them): write null, the step's "skipped" says why.
    safe = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()}
    return json.dumps(safe, sort_keys=True) + "\n"


def jsonl_writer(path: Path, history: list[dict] | None = None) -> Callable[[dict], None]:
    """Write ``history`` (steps restored from a checkpoint) to ``path``, then append one flushed JSON line per
    step, so a watcher (or a crash) sees every finished step."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(map(_line, history or [])))

    def write(record: dict) -> None:
        with path.open("a") as f:
            f.write(_line(record))

    return write


# Per-step quantities a mean does not summarize: the run's totals, its overall rate and its final learning rate.
_TOTALS = ("seconds", "tokens")
# The format probe's remedy SFT steps and rollbacks are counted, not averaged.
_NOT_AVERAGED = ("step", "epoch", "position", "lr", "tokens_per_s", *_TOTALS, REMEDY_KEY, ROLLBACK_KEY)


def run_summary(history: list[dict]) -> dict[str, float]:
    """The run's summary: each loss/diagnostic metric's mean over the steps that have a finite value; total
    ``seconds`` and ``tokens``, their ratio ``tokens_per_s``, the final ``lr``; step, skipped and SFT counts (the
    SFT stream's interleaved steps; the probe's remedy steps and rollbacks are counted apart, where any ran)."""
    values: dict[str, list[float]] = {}
    for h in history:
        for k, v in h.items():
            if finite(v):
                values.setdefault(k, []).append(float(v))
    out = {
        (f"train/{k}" if "/" not in k else k): sum(v) / len(v)
        for k, v in values.items()
        if k not in _NOT_AVERAGED
    }
    for key in _TOTALS:
        out[f"train/{key}"] = sum(values.get(key, []))
    if out["train/seconds"] > 0:
        out["train/tokens_per_s"] = out["train/tokens"] / out["train/seconds"]
    if history and history[-1].get("lr") is not None:
        out["train/lr"] = float(history[-1]["lr"])
    out["train/steps"] = float(len(history))
    out["train/skipped_steps"] = float(sum(bool(h.get("skipped")) for h in history))
    out["train/sft_steps"] = float(sum(h.get("kind") == "sft" for h in history))
    if REMEDY_KEY in values:
        out[REMEDY_KEY] = sum(values[REMEDY_KEY])
    if ROLLBACK_KEY in values:
        out["format/rollbacks"] = float(len(values[ROLLBACK_KEY]))
    return out


# (metric key, panel title)
PANELS: tuple[tuple[str, str], ...] = (
    ("loss/total", "loss (total)"),
    ("sdar/gate_mean", "gate mean"),
    ("sdar/teacher_gap_mean", "teacher gap (q - s)"),
    ("actor/entropy", "entropy"),
    ("grad/aux_share", "gradient share |grad aux| / |grad pg|"),
)
TABLE_KEYS: tuple[str, ...] = (
    "step",
    "kind",
    "loss/total",
    "loss/pg",
    "loss/aux",
    "sdar/gate_mean",
    "sdar/teacher_gap_mean",
    "grad/aux_share",
    "actor/entropy",
    "actor/clipfrac",
    "grad_norm",
    "lr",
)
MAX_TABLE_ROWS = 40
SUMMARY_NOTE = (
    "Means over the steps, except seconds and tokens (totals), tokens_per_s (their ratio), lr (final)."
)


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}" if math.isfinite(v) else str(v)
    return str(v)


def _rows(history: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """At most MAX_TABLE_ROWS steps, evenly spaced, always including the last."""
    if len(history) <= MAX_TABLE_ROWS:
        return list(history)
    stride = math.ceil(len(history) / MAX_TABLE_ROWS)
    picked = list(history[::stride])
    return picked if picked[-1] is history[-1] else [*picked, history[-1]]


def _single_value_limits(ax, values: list[float]) -> None:
    """A panel whose points all share one value gets a readable range around it (matplotlib's default for a flat
    line is +-4%: a 0.96-1.04 axis that suggests a change where there is none)."""
    if values and min(values) == max(values):
        v = values[0]
        pad = abs(v) if v else 1.0
        ax.set_ylim(v - pad, v + pad)


def plot_png(history: Sequence[Mapping[str, Any]]) -> bytes:
    """2x2 panels of PANELS over steps (SFT steps marked with x); empty panels say 'no data'."""
    from matplotlib.figure import Figure  # lazy: slow to import, and only the report needs it
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(10, 6), layout="constrained")
    for ax, (key, title) in zip(fig.subplots(2, 2).flat, PANELS):
        values = []
        for kind, marker in (("rl", "o"), ("sft", "x")):
            pts = [(h["step"], h[key]) for h in history if h.get("kind", "rl") == kind and finite(h.get(key))]
            if pts:
                xs, ys = zip(*pts)
                values += ys
                ax.plot(xs, ys, marker=marker, markersize=3, linewidth=1, label=kind)
        if not ax.lines:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        elif len(ax.lines) > 1:
            ax.legend(fontsize=8)
        _single_value_limits(ax, values)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("optimizer step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    return png(fig, dpi=90)


def training_report(history: Sequence[Mapping[str, Any]], summary: Mapping[str, Any], title: str) -> Report:
    """The train stage's report: the curves, the run summary and (at most MAX_TABLE_ROWS of) the steps."""
    summary_rows = [[k, _cell(v)] for k, v in sorted(summary.items())]
    steps = [[_cell(h.get(k)) for k in TABLE_KEYS] for h in _rows(history)]
    return Report(
        title=title,
        sections=[
            Section("Training curves", images=("curves",)),
            Section("Summary", text=SUMMARY_NOTE, table=(["metric", "value"], summary_rows)),
            Section("Steps", table=(list(TABLE_KEYS), steps)),
        ],
        images={"curves": ("training curves", plot_png(history))},
    )


def write_reports(
    out_dir: str | Path, history: Sequence[Mapping[str, Any]], summary: Mapping[str, Any], title: str
) -> None:
    """Write ``report.md`` and ``report.html`` into ``out_dir``."""
    out = Path(out_dir)
    doc = training_report(history, summary, title)
    (out / "report.md").write_text(markdown(doc))
    (out / "report.html").write_text(html(doc))


def teacher_contexts(inputs: list[str], adapter: str) -> list[str]:
    """Every teacher context (``rescore --teacher-context``) behind a trained model: its rescored inputs', and those
    its start adapter records, so a control's (solution, synthetic) stays in the lineage of what continues from it.
    ``unknown`` for an input or adapter that does not say (unpublished, or published before manifests named it);
    trajectories (an SFT's input) had no teacher."""
    found: set[str] = set()
    for uri in inputs:
        manifest = storage.read_manifest(uri) if storage.is_published(uri) else {"kind": "rescored"}
        if manifest.get("kind") == "rescored":
            found.add(manifest.get("teacher_context") or UNKNOWN_CONTEXT)
    if adapter:
        manifest = storage.read_manifest(adapter) if storage.is_published(adapter) else {}
        found.update(manifest.get("teacher_contexts", [UNKNOWN_CONTEXT]))
    return sorted(found)


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
    from peft import PeftModel

    from sdarflow.models.identity import BASE_FILE, base_fingerprint

    full = not isinstance(model, PeftModel)
    # PEFT keeps only the adapter's keys of the state dict it is given; the masters replace bf16 module copies.
    model.save_pretrained(out, state_dict={**model.state_dict(), **masters} if masters else None)
    if full:
        policy.tokenizer.save_pretrained(out)  # a full model folder is usable as --model on its own
    # a full fine-tune records its base too, so the next round can continue it where an adapter goes
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
        teacher_contexts=teacher_contexts(cfg.input, cfg.adapter),
        metrics=summary,
    )
    tags = {"sdarflow.output": cfg.output, "sdarflow.config_hash": cfg.config_hash()}
    log_stage_run(
        cfg.tracking_uri, "train", cfg.to_dict(), summary, history=history, artifacts=out, tags=tags
    )
