"""Evaluation reports (:func:`sdarflow.evaluate.metrics.build_report`) as a :class:`sdarflow.report.Report`
(Markdown for a KFP ``Output[Markdown]``, one self-contained HTML page for ``Output[HTML]``) and the PNG plots
both show, optionally against a ``baseline`` report of the same shape. Rendering is deterministic: the same
reports give the same bytes."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sdarflow.report import Report, Section, Table, number, png

PLOT_KEYS: tuple[str, ...] = ("pass_at_k", "task_type_pass1")
PLOT_TITLES: dict[str, str] = {"pass_at_k": "pass@k by split", "task_type_pass1": "pass@1 by task type"}
_FIXED_KEYS = ("adapter", "base_model", "splits")
_NA = "n/a"


def _delta(x: float | None, base: float | None) -> str:
    return _NA if x is None or base is None else f"{x - base:+.3f}"


def _split_of(report: Mapping[str, Any] | None, split: str) -> Mapping[str, Any] | None:
    return None if report is None else report.get("splits", {}).get(split)


def _overview_table(report: Mapping[str, Any], baseline: Mapping[str, Any] | None) -> Table:
    metrics = [
        ("success_rate", "success rate"),
        ("format_error_rate", "format error rate"),
        ("mean_turns", "mean turns"),
    ]
    header = ["split", "tasks", "samples/task"]
    for _, label in metrics:
        header += [label] + ([f"Δ {label}"] if baseline is not None else [])
    rows = []
    for split, s in report["splits"].items():
        base = _split_of(baseline, split)
        row = [split, str(s["n_tasks"]), str(s["samples_per_task"])]
        for key, _ in metrics:
            row.append(number(s[key]))
            if baseline is not None:
                row.append(_delta(s[key], None if base is None else base[key]))
        rows.append(row)
    return header, rows


def _vs_baseline(header: list[str], rows: list, baseline: Mapping[str, Any] | None, label: str) -> Table:
    """``rows`` of (cells, value, the baseline's value); with a baseline, its value and the delta are added."""
    if baseline is None:
        return header, [cells for cells, _, _ in rows]
    return header + [label, "Δ vs baseline"], [cells + [number(b), _delta(v, b)] for cells, v, b in rows]


def _pass_table(split: str, s: Mapping[str, Any], baseline: Mapping[str, Any] | None) -> Table:
    base = _split_of(baseline, split)
    # n next to every figure: an interval means little without the counts behind it.
    counts = f"{s['n_tasks']} × {s['samples_per_task']}"
    rows = []
    for k, value in s["pass_at_k"].items():
        lo, hi = s["ci95"][k]
        b = None if base is None else base["pass_at_k"].get(k)
        rows.append(([k, number(value), f"{lo:.3f} – {hi:.3f}", counts], value, b))
    return _vs_baseline(["k", "pass@k", "95% CI", "tasks × samples"], rows, baseline, "baseline")


def _type_table(split: str, s: Mapping[str, Any], baseline: Mapping[str, Any] | None) -> Table:
    base_types = (_split_of(baseline, split) or {}).get("by_task_type", {})
    rows = []
    for task_type, t in s["by_task_type"].items():
        value = t["pass_at_k"].get("1")
        b = base_types.get(task_type, {}).get("pass_at_k", {}).get("1")
        rows.append(([task_type, str(t["n_tasks"]), number(value)], value, b))
    return _vs_baseline(["task type", "tasks", "pass@1"], rows, baseline, "baseline pass@1")


def evaluation_report(
    report: Mapping[str, Any], baseline: Mapping[str, Any] | None, images: Mapping[str, bytes]
) -> Report:
    """The report to render: overview, pass@k with CI per split, pass@1 by task type, the ``images`` (from
    :func:`plots`), lineage. With a ``baseline`` the tables gain baseline and delta columns."""
    sections = [Section("Overview", table=_overview_table(report, baseline))]
    for split, s in report["splits"].items():
        sections.append(Section(f"Split {split}: pass@k", table=_pass_table(split, s, baseline)))
        sections.append(Section(f"Split {split}: pass@1 by task type", table=_type_table(split, s, baseline)))
    sections.append(Section("Plots", images=tuple(images)))
    # lineage and other extra fields; non-strings as sorted JSON so the output is deterministic
    extras = [
        (key, value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str))
        for key, value in report.items()
        if key not in _FIXED_KEYS
    ]
    if extras:
        sections.append(Section("Lineage", items=extras))
    return Report(
        title=f"Evaluation: {report['adapter']}",
        subtitle=f"base model: {report['base_model']}"
        + (f"; baseline: {baseline['adapter']}" if baseline is not None else ""),
        sections=sections,
        images={key: (PLOT_TITLES.get(key, key), data) for key, data in images.items()},
    )


def _label(text: str, limit: int = 24) -> str:
    """Plot-safe text: '$' would switch matplotlib to mathtext (and can fail to parse), long names overlap."""
    text = text if len(text) <= limit else text[: limit - 1] + "…"
    return text.replace("$", r"\$")


def _split_axes(report: Mapping[str, Any], width: float) -> tuple[Any, list[Any]]:
    from matplotlib.figure import Figure  # lazy: matplotlib is slow to import and only plots need it

    n = max(1, len(report["splits"]))
    fig = Figure(figsize=(width * n, 3.6), layout="constrained")
    axes = list(fig.subplots(1, n, squeeze=False)[0])
    if not report["splits"]:
        axes[0].text(0.5, 0.5, "no splits evaluated", ha="center", va="center")
    return fig, axes


def _finish_axes(ax: Any, split: str, ylabel: str) -> None:
    ax.set_ylim(0.0, 1.02)
    ax.set_title(_label(f"split: {split}"))
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="best")


def _pass_at_k_figure(report: Mapping[str, Any], baseline: Mapping[str, Any] | None) -> Any:
    fig, axes = _split_axes(report, 4.2)
    for ax, (split, s) in zip(axes, report["splits"].items()):
        ks = [int(k) for k in s["pass_at_k"]]
        label = _label(f"candidate: {report['adapter']}")
        ax.plot(ks, list(s["pass_at_k"].values()), marker="o", label=label)
        lows, highs = zip(*s["ci95"].values())
        ax.fill_between(ks, lows, highs, alpha=0.2, label="candidate 95% CI")
        base = _split_of(baseline, split)
        if base is not None:
            base_ks = [int(k) for k in base["pass_at_k"]]
            label = _label(f"baseline: {baseline['adapter']}")
            values = list(base["pass_at_k"].values())
            ax.plot(base_ks, values, linestyle="--", marker="s", color="gray", label=label)
            ks = sorted(set(ks) | set(base_ks))
        ax.set_xscale("log", base=2)  # ks are powers of two
        ax.set_xticks(ks, labels=[str(k) for k in ks])
        ax.set_xlabel("k")
        _finish_axes(ax, split, "pass@k")
    return fig


def _pass1(by_type: Mapping[str, Any], task_type: str) -> float:
    # A type absent on one side draws no bar (NaN) rather than a misleading zero.
    return by_type.get(task_type, {}).get("pass_at_k", {}).get("1", float("nan"))


def _task_type_figure(report: Mapping[str, Any], baseline: Mapping[str, Any] | None) -> Any:
    fig, axes = _split_axes(report, 4.8)
    for ax, (split, s) in zip(axes, report["splits"].items()):
        base = _split_of(baseline, split)
        base_types = {} if base is None else base["by_task_type"]
        types = sorted(set(s["by_task_type"]) | set(base_types))
        width, shift = (0.4, 0.2) if base is not None else (0.7, 0.0)
        xs = range(len(types))
        cand = [_pass1(s["by_task_type"], t) for t in types]
        ax.bar([x - shift for x in xs], cand, width, label=_label(f"candidate: {report['adapter']}"))
        if base is not None:
            label = _label(f"baseline: {baseline['adapter']}")
            values = [_pass1(base_types, t) for t in types]
            style = {"color": "lightgray", "edgecolor": "gray", "hatch": "//"}
            ax.bar([x + shift for x in xs], values, width, label=label, **style)
        ax.set_xticks(list(xs), labels=[_label(t) for t in types], rotation=30, ha="right")
        _finish_axes(ax, split, "pass@1")
    return fig


def plots(report: Mapping[str, Any], baseline: Mapping[str, Any] | None = None) -> dict[str, bytes]:
    """PNG plots keyed by :data:`PLOT_KEYS`: ``pass_at_k`` (curve per split with its 95% CI band; baseline
    dashed) and ``task_type_pass1`` (pass@1 bars per task type per split; baseline hatched beside)."""
    return {
        "pass_at_k": png(_pass_at_k_figure(report, baseline)),
        "task_type_pass1": png(_task_type_figure(report, baseline)),
    }
