"""The study's analysis and reports: ``study.json``, ``report.md`` and a self-contained ``report.html``.

Every figure is relative to GRPO (= 1.00) next to its absolute value with a 95% interval and the counts behind it.

The task is the unit of every interval. All cells are evaluated on the same tasks, so the (seed, task) results of
one task are not independent (the same task, and per-task effects a method keeps across seeds); resampling them as
if they were made the intervals about 1.5x too narrow (a zero effect excluded in 17-19% of null studies, not 5%).
So each task's value is first averaged over the seeds, and the interval is over those task values:
:func:`sdarflow.evaluate.compare.mean_interval`, the cluster-robust t interval with tasks as clusters. Pooled
values use it through :func:`sdarflow.evaluate.metrics.pass_at_k_interval`; paired differences against GRPO (and
GRPO against the base model) are ``d_t = mean_s pass@k_a(s, t) - mean_s pass@k_b(s, t)`` over the tasks both have,
and their interval also counts a seed-to-seed shift common to all tasks (a trained adapter moves every task
together): :func:`sdarflow.evaluate.compare.two_level_se` over the (seed, task) differences, seed by seed.
Each training seed is evaluated with its own sampling seed (seeds are replicates), and the base model once per
seed the same way. The promotion gate's verdict compares each method's final adapter with the GRPO run of the same
seed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sdarflow import report, storage
from sdarflow.evaluate.compare import (
    mean_interval,
    mean_se,
    minimum_detectable_effect,
    t_interval,
    two_level_se,
)
from sdarflow.evaluate.metrics import pass_at_k, pass_at_k_interval
from sdarflow.report import Report, Section, Table, interval, number, with_interval

BASELINE = "grpo"
# valid: what a setting is chosen on (a study made before it existed has only test and ood); test: what is reported
SPLITS = ("valid", "test", "ood")
CURVE_KEYS = (
    "train_success",
    "train_return",
    "zero_adv_group_share",
    "adv_std",
    "teacher_gap_mean",
    "gate_mean",
    "gate_discrimination_expert",
    "gate_discrimination_success",
    "aux_grad_share",
    "entropy",
    "format_error_rate",
    "skill_rules_wrong",
    "skill_rules_recipe_blind",
)
# the base model's rollouts on each round's games (the base cells' KEY_by_round), drawn on these panels
BASE_CURVE_KEYS = ("train_success", "train_return")
# held-out pass@1 by round: not a round record (the study evaluates each round's adapter on valid after the round)
VALID_CURVE = "valid_pass@1"


def _largest_k(split: Mapping[str, Any]) -> int:
    return max(int(k) for k in split["pass_at_k"])


def _task_values(evals: Sequence[Mapping[str, Any]], split: str, k: int) -> dict[str, list[float]]:
    """Each task's pass@k in every eval report (``splits``, one per seed) that has it."""
    values: dict[str, list[float]] = {}
    for ev in evals:
        s = ev[split]
        for task, c in s["task_successes"].items():
            values.setdefault(task, []).append(pass_at_k(s["samples_per_task"], c, k))
    return values


def pooled(evals: Sequence[Mapping[str, Any]], split: str, k: int) -> dict[str, Any]:
    """pass@k over ``evals`` (one eval report's ``splits`` per seed): the mean over tasks of each task's mean over
    the seeds, with its interval over tasks (see the module docstring)."""
    per_task = [float(np.mean(v)) for v in _task_values(evals, split, k).values()]
    successes = sum(sum(ev[split]["task_successes"].values()) for ev in evals)
    trials = sum(ev[split]["samples_per_task"] * len(ev[split]["task_successes"]) for ev in evals)
    lo, hi = pass_at_k_interval(per_task, k, successes, trials, spread=mean_interval)
    return {
        "k": k,
        "value": float(np.mean(per_task)),
        "ci95": [lo, hi],
        "tasks": len(per_task),
        "seeds": len(evals),
        "trials": trials,
    }


def paired(
    a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]], split: str, k: int
) -> dict[str, Any]:
    """Mean over the tasks both have of ``mean_seeds pass@k(a) - mean_seeds pass@k(b)``, with its interval: over
    tasks and, where both hold the same seeds in the same order, over seeds too (``two_level_se``: a trained
    adapter moves all tasks together); ``a`` and ``b`` hold one eval report's ``splits`` per seed. ``mde`` is the
    minimum detectable effect of that interval (95%, 80% power; None without spread)."""
    va, vb = _task_values(a, split, k), _task_values(b, split, k)
    tasks = sorted(va.keys() & vb.keys())
    diffs = [float(np.mean(va[t]) - np.mean(vb[t])) for t in tasks]
    if len(a) == len(b) and all(len(va[t]) == len(vb[t]) == len(a) for t in tasks):
        mean, se, dof = two_level_se(np.array([[va[t][s] - vb[t][s] for t in tasks] for s in range(len(a))]))
    else:
        mean, se, dof = mean_se(diffs)
    lo, hi = t_interval(mean, se, dof)
    return {
        "k": k,
        "mean_diff": float(np.mean(diffs)),
        "ci95": [lo, hi],
        "mde": minimum_detectable_effect(se, dof),
        "tasks": len(diffs),
    }


def _ratio(x: float | None, base: float | None) -> float | None:
    return None if x is None or base is None or base <= 0 else x / base


def curve(runs: Sequence[Sequence[Mapping[str, Any]]], key: str) -> dict[str, list]:
    """Mean, min and max over runs (each a list of round records) of ``key`` per round; None where no run has it."""
    values = [[r.get(key) for r in rounds] for rounds in runs]
    cols = [[v for v in col if v is not None] for col in zip(*values, strict=True)]
    return {
        "mean": [float(np.mean(c)) if c else None for c in cols],
        "min": [float(min(c)) if c else None for c in cols],
        "max": [float(max(c)) if c else None for c in cols],
    }


def base_rollout_rounds(base_cells: Sequence[Mapping[str, Any]], key: str) -> list[list[dict[str, float]]]:
    """The base cells' ``key`` (a BASE_CURVE_KEYS) on each round's games as round records (none from a cell made
    before the study recorded it)."""
    return [[{key: v} for v in c[f"{key}_by_round"]] for c in base_cells if c.get(f"{key}_by_round")]


def _present(evals: Sequence[Mapping[str, Any]]) -> list[str]:
    return [split for split in SPLITS if all(split in ev for ev in evals)]


def valid_by_round(run: Mapping[str, Any], base: Mapping[str, Any] | None) -> list[float | None]:
    """A run's valid pass@1 on the other curves' x-axis (point r: the policy trained through round r - 1): the base
    model's evaluation of the run's seed at 0, each round's adapter after it (the cell's ``valid_after_round``), the
    final adapter's last. None throughout where a part is missing (a cell made before the study recorded them)."""
    after = run.get("valid_after_round")
    if after is None or base is None or "valid" not in run["eval"] or "valid" not in base["eval"]:
        return [None] * (len(run["rounds"]) + 1)
    return [base["eval"]["valid"]["pass_at_k"]["1"], *after, run["eval"]["valid"]["pass_at_k"]["1"]]


def _method_result(
    runs: Sequence[Mapping[str, Any]], k: int, base: Mapping[int, Mapping[str, Any]]
) -> dict[str, Any]:
    """One method's curves (its rounds' records and valid pass@1 by round, ``base`` the base model's cell of each
    seed), pooled pass@1 of every split and test pass@k over its seeds, and mean stage seconds."""
    evals = [c["eval"] for c in runs]
    valid = [[{VALID_CURVE: v} for v in valid_by_round(run, base.get(run["seed"]))] for run in runs]
    return {
        "curves": {
            **{key: curve([run["rounds"] for run in runs], key) for key in CURVE_KEYS},
            VALID_CURVE: curve(valid, VALID_CURVE),
        },
        **{f"{split}_pass@1": pooled(evals, split, 1) for split in _present(evals)},
        "test_pass@k": pooled(evals, "test", k),
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
    settings: Mapping[str, Any],
    base_cells: Sequence[Mapping[str, Any]],
    cells: Sequence[Mapping[str, Any]],
) -> dict:
    """study.json: the settings, every run, per-method results, the comparison table, paired differences against
    GRPO (and GRPO against the base model), and the gate's verdicts."""
    from sdarflow.registry.gate import check_gate

    by_method = {
        m: sorted((c for c in cells if c["method"] == m), key=lambda c: c["seed"])
        for m in settings["methods"]
    }
    k = min(_largest_k(c["eval"]["test"]) for c in cells)
    grpo_evals = [c["eval"] for c in by_method[BASELINE]]
    base_by_seed = {c["seed"]: c for c in base_cells}
    methods = {m: _method_result(runs, k, base_by_seed) for m, runs in by_method.items()}
    table = [_comparison(m, r, methods[BASELINE]) for m, r in methods.items()]
    base_evals = [c["eval"] for c in sorted(base_cells, key=lambda c: c["seed"])]  # paired seed by seed
    splits = _present([*(c["eval"] for c in cells), *base_evals])
    paired_diffs = {
        m: {f"{split}_pass@{kk}": paired([c["eval"] for c in by_method[m]], grpo_evals, split, kk)
            for split, kk in [(s, 1) for s in splits] + [("test", k)]}
        for m in methods if m != BASELINE
    }  # fmt: skip
    paired_diffs["grpo_vs_base"] = {
        f"{split}_pass@1": paired(grpo_evals, base_evals, split, 1) for split in splits
    }
    gate = {
        m: {
            str(c["seed"]): check_gate(
                {"splits": c["eval"]}, {"grpo": {"splits": g["eval"]}}, candidate_label=m, one_protocol=True
            ).failures
            for c, g in zip(by_method[m], by_method[BASELINE], strict=True)
        }
        for m in methods
        if m != BASELINE
    }
    return {
        "settings": dict(settings),
        "k": k,
        "base": {f"{split}_pass@1": pooled(base_evals, split, 1) for split in splits},
        # the base model's rollouts on each round's games: the reference for the runs' train success and return
        "base_curves": {key: curve(base_rollout_rounds(base_cells, key), key) for key in BASE_CURVE_KEYS},
        "runs": [dict(c) for c in cells],
        "methods": methods,
        "table": table,
        "paired": paired_diffs,
        "gate": gate,
    }


# --- rendering ---------------------------------------------------------------------------------------------------


def _abs(r: Mapping[str, Any]) -> str:
    return with_interval(r["value"], r["ci95"])


def _comparison_table(study: Mapping[str, Any]) -> Table:
    k = study["k"]
    methods, rows = study["methods"], []
    for t in study["table"]:
        r = methods[t["method"]]
        rows.append(
            [t["method"], number(t["relative_pass@1"], 2), number(t["relative_pass@k"], 2), number(t["relative_ood_pass@1"], 2),
             number(t["training_overhead"], 2), _abs(r["test_pass@1"]), _abs(r["test_pass@k"]), _abs(r["ood_pass@1"])]
        )  # fmt: skip
    any_run = methods[study["table"][0]["method"]]["test_pass@1"]
    counts = (
        f"{any_run['tasks']} tasks x {len(study['settings']['seeds'])} seeds x samples = {any_run['trials']} "
        f"episodes per split; interval over tasks"
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
            [c["method"], str(c["seed"]), " ".join(number(r["train_success"], 2) for r in c["rounds"]),
             number(c["eval"]["test"]["pass_at_k"]["1"]), number(c["eval"]["ood"]["pass_at_k"]["1"]),
             f"{sum(c['seconds'].values()):.0f}"]
            for c in study["runs"]
        ],
    )  # fmt: skip


def _tables(study: Mapping[str, Any]) -> list[tuple[str, Table]]:
    k = study["k"]
    comparison = _comparison_table(study)
    diff_rows = [
        [
            m,
            key,
            f"{v['mean_diff']:+.3f}",
            interval(v["ci95"], v["tasks"]),
            number(v.get("mde")),
            str(v["tasks"]),
        ]
        for m, d in study["paired"].items()
        for key, v in d.items()
    ]
    header = [
        "method vs grpo",
        "figure",
        "mean difference",
        "95% CI (over tasks)",
        "MDE (80% power)",
        "tasks",
    ]
    diffs = (header, diff_rows)
    tradeoff = (
        ["method", f"pass@{k} / pass@1", "relative to grpo's"],
        [
            [t["method"], number(t["pass@k_over_pass@1"], 2), number(t["relative_pass@k_over_pass@1"], 2)]
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


def _draw(
    ax, c: Mapping[str, list] | None, label: str, fmt: str = "-", color=None, band: float = 0.15, **style
):
    """One curve (``curve``'s mean, min and max) on ``ax``, its band shaded; rounds without a value are skipped."""
    xs = [i for i, v in enumerate((c or {}).get("mean", [])) if v is not None]
    if not xs:
        return
    ax.plot(xs, [c["mean"][i] for i in xs], fmt, label=label, color=color, **style)
    ax.fill_between(xs, [c["min"][i] for i in xs], [c["max"][i] for i in xs], color=color, alpha=band)


def curves_png(study: Mapping[str, Any]) -> bytes:
    """Learning curves (mean and min-max band over seeds) and the training diagnostics, one panel per metric."""
    from matplotlib.figure import Figure  # lazy: slow to import, only plots need it
    from matplotlib.ticker import MaxNLocator

    # valid pass@1 next to train success; a panel only where some method has a point (a learning check or an
    # older study has no valid curve)
    order = (CURVE_KEYS[0], VALID_CURVE, *CURVE_KEYS[1:])
    keys = [
        key
        for key in order
        if any(
            v is not None for r in study["methods"].values() for v in r["curves"].get(key, {}).get("mean", [])
        )
    ]
    cols = 4
    rows = max(1, -(-len(keys) // cols))
    fig = Figure(figsize=(4 * cols, 3.4 * rows), layout="constrained")
    # one caption for every panel (under each, the long label ran into its neighbours')
    fig.suptitle(
        "round r: the policy trained through round r - 1 (0: the base model); mean and min-max over seeds"
    )
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax in axes[len(keys) :]:
        ax.set_axis_off()
    for ax, key in zip(axes, keys):
        for m, r in study["methods"].items():
            _draw(ax, r["curves"].get(key), label=m, marker="o")
        # each round plays new games: the base model's on the same games
        base = study.get("base_curves", {}).get(key)
        _draw(ax, base, label="base model, same games", fmt="--", marker=".", color="k", band=0.08)
        ax.set_title(key.replace("_", " "))
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if axes[0].get_legend_handles_labels()[0]:  # a figure with no point has no legend to draw
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
    """The reports, then study.json, into the folder or object-storage prefix ``out``."""
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
