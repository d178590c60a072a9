"""The study's analysis and reports: ``study.json``, ``report.md`` and a self-contained ``report.html``.

Every figure is relative to GRPO (= 1.00) next to its absolute value with a 95% interval and the counts behind it.
Final held-out values pool the seeds: each (seed, task) is one task of the pooled estimate, so the interval is
:func:`sdarflow.evaluate.metrics.pass_at_k_interval` over seeds x tasks. Paired differences against GRPO use the
same seeds and tasks (evaluation draws the same tasks with the same sampling seeds for every cell): the mean of the
per-(seed, task) differences with a bootstrap interval over those pairs. The promotion gate's verdict compares each
method's final adapter with the GRPO run of the same seed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sdarflow import report, storage
from sdarflow.evaluate.metrics import bootstrap_interval, pass_at_k, pass_at_k_interval
from sdarflow.report import Report, Section, Table

BASELINE = "grpo"
SPLITS = ("test", "ood")
CURVE_KEYS = (
    "train_success",
    "zero_adv_group_share",
    "adv_std",
    "teacher_gap_mean",
    "gate_mean",
    "entropy",
    "format_error_rate",
)


def _largest_k(split: Mapping[str, Any]) -> int:
    return max(int(k) for k in split["pass_at_k"])


def pooled(evals: Sequence[Mapping[str, Any]], split: str, k: int) -> dict[str, Any]:
    """pass@k over every (seed, task) of ``evals`` (one eval report's ``splits`` per seed), with its interval."""
    per_task: list[float] = []
    successes = trials = 0
    for ev in evals:
        s = ev[split]
        n = s["samples_per_task"]
        for c in s["task_successes"].values():
            per_task.append(pass_at_k(n, c, k))
            successes, trials = successes + c, trials + n
    lo, hi = pass_at_k_interval(per_task, k, successes, trials)
    return {
        "k": k,
        "value": float(np.mean(per_task)),
        "ci95": [lo, hi],
        "tasks": len(per_task),
        "trials": trials,
    }


def paired(
    a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]], split: str, k: int
) -> dict[str, Any]:
    """Mean over (seed, task) of pass@k(a) - pass@k(b), ``a`` and ``b`` aligned by seed, with a bootstrap interval."""
    diffs = []
    for ev_a, ev_b in zip(a, b, strict=True):
        sa, sb = ev_a[split], ev_b[split]
        for task, c in sa["task_successes"].items():
            if task in sb["task_successes"]:
                diffs.append(
                    pass_at_k(sa["samples_per_task"], c, k)
                    - pass_at_k(sb["samples_per_task"], sb["task_successes"][task], k)
                )
    lo, hi = bootstrap_interval(diffs)
    return {"k": k, "mean_diff": float(np.mean(diffs)), "ci95": [lo, hi], "pairs": len(diffs)}


def _ratio(x: float | None, base: float | None) -> float | None:
    return None if x is None or base is None or base <= 0 else x / base


def _curve(runs: Sequence[Mapping[str, Any]], key: str) -> dict[str, list]:
    values = [[r.get(key) for r in run["rounds"]] for run in runs]
    cols = [[v for v in col if v is not None] for col in zip(*values, strict=True)]
    return {
        "mean": [float(np.mean(c)) if c else None for c in cols],
        "min": [float(min(c)) if c else None for c in cols],
        "max": [float(max(c)) if c else None for c in cols],
    }


def _method_result(runs: Sequence[Mapping[str, Any]], k: int) -> dict[str, Any]:
    """One method's curves, pooled pass@1/pass@k/OOD pass@1 over its seeds, and its mean stage seconds."""
    evals = [c["eval"] for c in runs]
    return {
        "curves": {key: _curve(runs, key) for key in CURVE_KEYS},
        "test_pass@1": pooled(evals, "test", 1),
        "test_pass@k": pooled(evals, "test", k),
        "ood_pass@1": pooled(evals, "ood", 1),
        "train_seconds": float(np.mean([sum(c["seconds"].values()) for c in runs])),
        "stage_seconds": {
            st: float(np.mean([c["seconds"].get(st, 0.0) for c in runs])) for st in runs[0]["seconds"]
        },
    }


def _comparison(method: str, r: Mapping[str, Any], grpo: Mapping[str, Any]) -> dict[str, Any]:
    """A method's row of the comparison table, relative to GRPO's results."""
    ratio = _ratio(r["test_pass@k"]["value"], r["test_pass@1"]["value"])
    return {
        "method": method,
        "relative_pass@1": _ratio(r["test_pass@1"]["value"], grpo["test_pass@1"]["value"]),
        "relative_pass@k": _ratio(r["test_pass@k"]["value"], grpo["test_pass@k"]["value"]),
        "relative_ood_pass@1": _ratio(r["ood_pass@1"]["value"], grpo["ood_pass@1"]["value"]),
        "training_overhead": _ratio(r["train_seconds"], grpo["train_seconds"]),
        "pass@k_over_pass@1": ratio,
        "relative_pass@k_over_pass@1": _ratio(
            ratio, _ratio(grpo["test_pass@k"]["value"], grpo["test_pass@1"]["value"])
        ),
    }


def analyze(
    settings: Mapping[str, Any], base_cell: Mapping[str, Any], cells: Sequence[Mapping[str, Any]]
) -> dict:
    """study.json: the settings, every run, per-method curves and pooled results, the comparison table, paired
    differences against GRPO (and GRPO against the base model), and the gate's verdicts."""
    from sdarflow.registry.gate import check_gate

    seeds = list(settings["seeds"])
    by_method = {
        m: sorted((c for c in cells if c["method"] == m), key=lambda c: c["seed"])
        for m in settings["methods"]
    }
    k = min(_largest_k(c["eval"]["test"]) for c in cells)
    grpo_evals = [c["eval"] for c in by_method[BASELINE]]
    methods = {m: _method_result(runs, k) for m, runs in by_method.items()}
    table = [_comparison(m, r, methods[BASELINE]) for m, r in methods.items()]
    base_evals = [base_cell["eval"]] * len(seeds)
    paired_diffs = {
        m: {f"{split}_pass@{kk}": paired([c["eval"] for c in by_method[m]], grpo_evals, split, kk)
            for split, kk in (("test", 1), ("test", k), ("ood", 1))}
        for m in methods if m != BASELINE
    }  # fmt: skip
    paired_diffs["grpo_vs_base"] = {
        f"{split}_pass@1": paired(grpo_evals, base_evals, split, 1) for split in SPLITS
    }
    gate = {
        m: {
            str(c["seed"]): check_gate(
                {"splits": c["eval"]}, {"grpo": {"splits": g["eval"]}}, candidate_label=m
            ).failures
            for c, g in zip(by_method[m], by_method[BASELINE], strict=True)
        }
        for m in methods
        if m != BASELINE
    }
    return {
        "settings": dict(settings),
        "k": k,
        "base": {
            "test_pass@1": pooled([base_cell["eval"]], "test", 1),
            "ood_pass@1": pooled([base_cell["eval"]], "ood", 1),
        },
        "runs": [dict(c) for c in cells],
        "methods": methods,
        "table": table,
        "paired": paired_diffs,
        "gate": gate,
    }


# --- rendering ---------------------------------------------------------------------------------------------------


def _f(x: float | None, digits: int = 3) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def _abs(r: Mapping[str, Any]) -> str:
    lo, hi = r["ci95"]
    return f"{_f(r['value'])} [{_f(lo)}, {_f(hi)}]"


def _comparison_table(study: Mapping[str, Any]) -> Table:
    k = study["k"]
    methods, rows = study["methods"], []
    for t in study["table"]:
        r = methods[t["method"]]
        rows.append(
            [t["method"], _f(t["relative_pass@1"], 2), _f(t["relative_pass@k"], 2), _f(t["relative_ood_pass@1"], 2),
             _f(t["training_overhead"], 2), _abs(r["test_pass@1"]), _abs(r["test_pass@k"]), _abs(r["ood_pass@1"])]
        )  # fmt: skip
    any_run = methods[study["table"][0]["method"]]["test_pass@1"]
    counts = (
        f"{len(study['settings']['seeds'])} seeds x tasks x samples = {any_run['trials']} episodes per split"
    )
    return (
        ["method", "relative pass@1", f"relative pass@{k}", "relative OOD pass@1", "training overhead",
         f"pass@1 [95% CI] ({counts})", f"pass@{k} [95% CI]", "OOD pass@1 [95% CI]"],
        rows,
    )  # fmt: skip


def _runs_table(study: Mapping[str, Any]) -> Table:
    return (
        ["method", "seed", "train success by round", "test pass@1", "OOD pass@1", "seconds (loop)"],
        [
            [c["method"], str(c["seed"]), " ".join(_f(r["train_success"], 2) for r in c["rounds"]),
             _f(c["eval"]["test"]["pass_at_k"]["1"]), _f(c["eval"]["ood"]["pass_at_k"]["1"]),
             f"{sum(c['seconds'].values()):.0f}"]
            for c in study["runs"]
        ],
    )  # fmt: skip


def _tables(study: Mapping[str, Any]) -> list[tuple[str, Table]]:
    k = study["k"]
    comparison = _comparison_table(study)
    diff_rows = []
    for m, d in study["paired"].items():
        for key, v in d.items():
            diff_rows.append(
                [
                    m,
                    key,
                    f"{v['mean_diff']:+.3f}",
                    f"[{v['ci95'][0]:+.3f}, {v['ci95'][1]:+.3f}]",
                    str(v["pairs"]),
                ]
            )
    diffs = (["method vs grpo", "figure", "mean difference", "95% CI", "(seed, task) pairs"], diff_rows)
    tradeoff = (
        ["method", f"pass@{k} / pass@1", "relative to grpo's"],
        [
            [t["method"], _f(t["pass@k_over_pass@1"], 2), _f(t["relative_pass@k_over_pass@1"], 2)]
            for t in study["table"]
        ],
    )
    gate_rows = [
        [m, seed, "passes" if not failures else "refused: " + "; ".join(failures)]
        for m, by_seed in study["gate"].items()
        for seed, failures in by_seed.items()
    ]
    gate = (["method (candidate)", "seed", "promotion gate vs the grpo adapter"], gate_rows)
    base = study["base"]
    base_table = (
        ["model", "test pass@1 [95% CI]", "OOD pass@1 [95% CI]"],
        [["base", _abs(base["test_pass@1"]), _abs(base["ood_pass@1"])]],
    )
    return [
        ("Comparison (relative to GRPO = 1.00)", comparison),
        ("Paired differences against GRPO (same seeds, same tasks)", diffs),
        ("The pass@k trade-off", tradeoff),
        ("Promotion gate: each method's final adapter against the GRPO run's", gate),
        ("Base model", base_table),
        ("Runs", _runs_table(study)),
    ]


def curves_png(study: Mapping[str, Any]) -> bytes:
    """Learning curves (mean and min-max band over seeds) and the training diagnostics, one panel per metric."""
    from matplotlib.figure import Figure  # lazy: slow to import, only plots need it
    from matplotlib.ticker import MaxNLocator

    cols = 4
    rows = -(-len(CURVE_KEYS) // cols)
    fig = Figure(figsize=(4 * cols, 3.4 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax in axes[len(CURVE_KEYS) :]:
        ax.set_axis_off()
    for ax, key in zip(axes, CURVE_KEYS):
        for m, r in study["methods"].items():
            c = r["curves"][key]
            xs = [i for i, v in enumerate(c["mean"]) if v is not None]
            if not xs:
                continue
            ax.plot(xs, [c["mean"][i] for i in xs], marker="o", label=m)
            ax.fill_between(xs, [c["min"][i] for i in xs], [c["max"][i] for i in xs], alpha=0.15)
        ax.set_title(key.replace("_", " "))
        ax.set_xlabel("round (rollouts of the policy trained through the round before)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].legend(fontsize=8)
    return report.png(fig)


def _title(study: Mapping[str, Any]) -> str:
    s = study["settings"]
    return f"Method study: {', '.join(s['methods'])} on {s['env']}, {len(s['seeds'])} seed(s) x {s['rounds']} round(s)"


def study_report(study: Mapping[str, Any], curves: bytes) -> Report:
    """The study's report: what every cell ran with, the tables, then the learning curves and diagnostics."""
    s = study["settings"]
    ran_with = (
        f"Base model {s['base_model']}; sizes {json.dumps(s['sizes'], sort_keys=True)}; stage settings "
        f"{json.dumps(s['stage_settings'], sort_keys=True)}."
    )
    return Report(
        title=_title(study),
        subtitle=ran_with,
        sections=[Section(title, table=table) for title, table in _tables(study)]
        + [Section("Learning curves and diagnostics", images=("curves",))],
        images={"curves": ("learning curves", curves)},
    )


def write_reports(out: str, study: Mapping[str, Any]) -> None:
    """The reports, then study.json, into the folder or object-storage prefix ``out`` (each written whole)."""
    png = curves_png(study)
    doc = study_report(study, png)
    files = {
        "curves.png": png,
        "report.md": report.markdown(doc, {"curves": "curves.png"}).encode(),
        "report.html": report.html(doc).encode(),
        # last: study.json is the study's result, the reports above belong to it
        "study.json": (json.dumps(study, indent=2, sort_keys=True, default=str) + "\n").encode(),
    }
    for name, data in files.items():
        storage.write_bytes(storage.join(out, name), data)
