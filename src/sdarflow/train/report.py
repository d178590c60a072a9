"""Training report from the per-step metrics: ``report.md`` (summary and a step table) and a self-contained
``report.html`` with one PNG (base64) of loss, gate mean, teacher gap and entropy over the optimizer steps.

The KFP pipeline copies both files from the train stage's output into the run's UI; rendering is deterministic
(the same history gives the same bytes).
"""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

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


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


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


def plot_png(history: Sequence[Mapping[str, Any]]) -> bytes:
    """2x2 panels of PANELS over steps (SFT steps marked with x); empty panels say 'no data'."""
    from matplotlib.figure import Figure  # lazy: slow to import, and only the report needs it

    fig = Figure(figsize=(10, 6), layout="constrained")
    for ax, (key, title) in zip(fig.subplots(2, 2).flat, PANELS):
        for kind, marker in (("rl", "o"), ("sft", "x")):
            pts = [
                (h["step"], h[key]) for h in history if h.get("kind", "rl") == kind and _finite(h.get(key))
            ]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, marker=marker, markersize=3, linewidth=1, label=kind)
        if not ax.lines:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        elif len(ax.lines) > 1:
            ax.legend(fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, metadata={"Software": None})
    return buf.getvalue()


def render_markdown(history: Sequence[Mapping[str, Any]], summary: Mapping[str, Any], title: str) -> str:
    lines = [f"# {title}", "", "| metric | mean over steps |", "|---|---|"]
    lines += [f"| {k} | {_cell(v)} |" for k, v in sorted(summary.items())]
    lines += ["", "## Steps", "", "| " + " | ".join(TABLE_KEYS) + " |", "|" + "---|" * len(TABLE_KEYS)]
    lines += ["| " + " | ".join(_cell(h.get(k)) for k in TABLE_KEYS) + " |" for h in _rows(history)]
    return "\n".join(lines) + "\n"


def render_html(history: Sequence[Mapping[str, Any]], summary: Mapping[str, Any], title: str) -> str:
    png = base64.b64encode(plot_png(history)).decode("ascii")
    esc = html.escape
    summary_rows = "".join(
        f"<tr><td>{esc(k)}</td><td>{esc(_cell(v))}</td></tr>" for k, v in sorted(summary.items())
    )
    head = "".join(f"<th>{esc(k)}</th>" for k in TABLE_KEYS)
    steps = "".join(
        "<tr>" + "".join(f"<td>{esc(_cell(h.get(k)))}</td>" for k in TABLE_KEYS) + "</tr>"
        for h in _rows(history)
    )
    style = (
        "body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;font-size:13px}"
        "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}"
    )
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{esc(title)}</title>"
        f"<style>{style}</style></head><body><h1>{esc(title)}</h1>"
        f"<img alt='training curves' src='data:image/png;base64,{png}'>"
        f"<h2>Summary</h2><table><tr><th>metric</th><th>mean over steps</th></tr>{summary_rows}</table>"
        f"<h2>Steps</h2><table><tr>{head}</tr>{steps}</table></body></html>\n"
    )


def write_reports(
    out_dir: str | Path, history: Sequence[Mapping[str, Any]], summary: Mapping[str, Any], title: str
) -> None:
    """Write ``report.md`` and ``report.html`` into ``out_dir``."""
    out = Path(out_dir)
    (out / "report.md").write_text(render_markdown(history, summary, title))
    (out / "report.html").write_text(render_html(history, summary, title))
