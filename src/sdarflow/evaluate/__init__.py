"""Evaluation: the unbiased pass@k estimator, per-split and per-task-type summaries (test and OOD), and the
Markdown/HTML/PNG report. Plotting imports matplotlib lazily, so importing this package stays cheap."""

from sdarflow.evaluate.metrics import build_report, ci95, ks_for, pass_at_k, summarize
from sdarflow.evaluate.report import PLOT_KEYS, plots, render_html, render_markdown

__all__ = [
    "PLOT_KEYS",
    "build_report",
    "ci95",
    "ks_for",
    "pass_at_k",
    "plots",
    "render_html",
    "render_markdown",
    "summarize",
]
