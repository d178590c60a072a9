"""Evaluation: the unbiased pass@k estimator, per-split and per-task-type summaries (test and OOD), and the
Markdown/HTML/PNG report. matplotlib and Jinja2 are imported on first use, so importing this package stays cheap."""

from sdarflow.evaluate.metrics import (
    bootstrap_interval,
    build_report,
    ks_for,
    pass_at_k,
    pass_at_k_interval,
    split_results,
    wilson_interval,
)
from sdarflow.evaluate.report import PLOT_KEYS, evaluation_report, plots
