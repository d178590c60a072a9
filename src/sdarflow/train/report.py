"""Training report from the per-step metrics: ``report.md`` (summary and a step table) and a self-contained
``report.html`` with one PNG of loss, gate mean, teacher gap and entropy over the steps; deterministic (the same
history gives the same bytes)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sdarflow.report import Report, Section, html, markdown, png
from sdarflow.train.history import finite

# (metric key, panel title)
PANELS: tuple[tuple[str, str], ...] = (
    ("loss/total", "loss (total)"),
    ("sdar/gate_mean", "gate mean"),
    ("sdar/teacher_gap_mean", "teacher gap (q - s)"),
    ("actor/entropy", "entropy"),
)
TABLE_KEYS: tuple[str, ...] = (
    "step",
    "kind",
    "loss/total",
    "loss/pg",
    "loss/aux",
    "sdar/gate_mean",
    "sdar/teacher_gap_mean",
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
