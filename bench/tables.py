"""Every result table of the pages (``README.md`` and every ``docs/*.md``), rendered from ``bench/results/*.json``
between its markers (``<!-- generated: NAME ... -->`` ... ``<!-- end generated: NAME -->``), with the provenance of
the files it shows. A table may stand on any page; a page without markers is left alone.

    python -m bench.tables           # rewrite every table on every page from its JSON
    python -m bench.tables --check   # exit 1, naming the table, when a page and the JSON disagree

``make bench`` rewrites them after its runs; a test runs ``--check``, so a table edited by hand, or a result
committed without a table on some page, fails the suite. Tables: ``bench`` (one row per benchmark: what was
measured, the ratio that is judged, the target), ``grpo_tuning`` (the RL setting chosen on valid, reported on test)
and ``demo`` (``make demo``'s base model and rounds), ``gate_null`` (the promotion gate's false promotion rate),
``learning_check``, the ``format_collapse*`` runs, and one per
committed ``study_*.json`` and ``premise_*.json``.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from bench.common import RESULTS
from sdarflow.report import signed_with_interval

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]  # the pages whose generated tables are rendered and checked


def _pct(x: float) -> str:
    return f"{x:.1%}"


def _startup(r: dict) -> tuple:
    tasks = r["tasks"]
    worst = max(tasks, key=lambda t: tasks[t]["fixed_cost_s"])
    c = tasks[worst]
    return (
        f"`sdarflow --help` {r['help_seconds']:.2f} s; a DAG task's fixed cost (fresh process vs in-process) median "
        f"{r['fixed_cost_median_s']:.1f} s, slowest {worst} {c['fixed_cost_s']:.1f} s (interpreter "
        f"{c['interpreter_s']:.1f}, imports {c['imports_s']:.1f}, config {c['config_cold_s']:.1f}, model "
        f"{c['model_cold_s']:.1f}); {_pct(r['production']['fixed_cost_share'])} of a production round",
        f"{r['help_seconds']:.2f} s / {r['fixed_cost_median_s']:.1f} s",
        "<= 0.5 s / <= 3 s",
    )


def _train_step(r: dict) -> tuple:
    return (
        f"{r['tokens_per_s']:.0f} tokens/s, {r['achieved_flops'] / 1e9:.0f} GFLOP/s of "
        f"{r['matmul_peak_flops_fp32'] / 1e9:.0f} matmul peak; log-prob peak memory "
        f"{r['logprob_memory_mb']['naive']:.0f} MB naive vs {r['logprob_memory_mb']['chunked']:.0f} MB chunked",
        f"fraction_of_peak {r['fraction_of_peak']:.2f}; memory {r['chunked_over_naive_memory']:.2f}",
        ">= 0.5; <= 0.25",
    )


def _rescoring(r: dict) -> tuple:
    def measured(label: str, d: dict) -> str:
        t = d["tokens_per_s"]
        return (
            f"{label} ({d['rows']} turns, mean {d['row_tokens']['mean']:.0f} tokens): packed {t['packed']:.0f} vs "
            f"padded {t['padded_in_order']:.0f} tokens/s"
        )

    def judged(label: str, d: dict) -> str:
        return (
            f"{label}: {d['speedup']:.2f}x of a {d['speedup_bound']:.2f}x bound ({d['fraction_of_bound']:.2f}), "
            f"fraction_of_peak {d['fraction_of_peak']:.2f}"
        )

    dists = r["distributions"]
    return (
        f"{r['model']}; " + "; ".join(measured(k, d) for k, d in dists.items()),
        "; ".join(judged(k, d) for k, d in dists.items()),
        "of bound >= 0.9; agent of peak >= 0.5",
    )


def _rollout(r: dict) -> tuple:
    hf = r["engines"]["hf"]
    loop = r["loop"]
    by_batch = ", ".join(f"{bs}: {v['tokens_per_s']:.0f}" for bs, v in hf.items())
    others = ", ".join(
        f"{envs} {lp['loop_efficiency']:.2f}"
        for envs, lp in r["loop_by_envs"].items()
        if envs != r["loop_envs"]
    )
    shared = r.get("shared_prompts")
    sharing = (
        f"; its calls with each distinct prompt run once {shared['shared_over_own']:.2f}x faster than with every "
        f"row running its own ({shared['distinct_prompts']} distinct of {shared['rows']} prompts)"
        if shared
        else ""
    )
    return (
        f"hf tokens/s by batch ({r['fixed_length_tokens']} tokens each) {by_batch}; loop (envs {r['loop_envs']}) "
        f"{loop['loop_tokens_per_s']:.0f} vs its engine calls replayed {loop['replay_tokens_per_s']:.0f} "
        f"({loop['episodes']} episodes); other env hosts: {others}{sharing}",
        f"loop_efficiency {r['loop_efficiency']:.2f}",
        ">= 0.8",
    )


def _generation(r: dict) -> tuple:
    by = ", ".join(
        f"{bs}: {b['tokens_per_s']['engine']:.0f} vs {b['tokens_per_s']['plain']:.0f}"
        for bs, b in r["by_batch"].items()
    )
    peak = ", ".join(f"{b['fraction_of_peak']:.2f}" for b in r["by_batch"].values())
    groups = "".join(
        f"; {n} prompts in groups of {r['group_size']}: {g['tokens_per_s']['shared']:.0f} tokens/s with each "
        f"distinct prompt run once vs {g['tokens_per_s']['own']:.0f} ({g['shared_over_own']:.1f}x, the prompt "
        f"{_pct(g['prefill_share'])} of the time)"
        + (
            f", {g['tokens_per_s']['shared_calls_of_group']:.0f} in calls of {r['group_size']}"
            if "shared_calls_of_group" in g["tokens_per_s"]
            else ""
        )
        for n, g in r.get("groups", {}).items()
    )
    ratios = [c["vllm_over_hf"] for c in r.get("grid", {}).values() if "vllm_over_hf" in c]
    vllm = (
        f"; vLLM-CPU over the hf engine at the rollout's shapes: {min(ratios):.1f}x to {max(ratios):.1f}x "
        "(by shape: docs/capacity.md, Generation engines)"
        if ratios
        else ""
    )
    return (
        f"{r['model']}, {r['new_tokens']} tokens per prompt; tokens/s by batch, rollout engine vs plain "
        f"`model.generate`: {by}; fraction of matmul peak {peak}{groups}{vllm}",
        f"engine/plain (worst batch) {r['engine_over_plain']:.2f}",
        ">= 0.8",
    )


def _data_plane(r: dict) -> tuple:
    local, s3 = r["local"], r["s3_moto"]
    return (
        f"demo round in storage: local {local['storage_seconds']:.1f} of {local['round_seconds']:.0f} s, "
        f"S3 (moto) {s3['storage_seconds']:.1f} of {s3['round_seconds']:.0f} s",
        f"storage_share {_pct(r['storage_share'])}",
        "<= 3%",
    )


def _pipeline_overhead(r: dict) -> tuple:
    return (
        f"demo round: KFP local runner {r['kfp_local_seconds']:.0f} s vs direct {r['direct_seconds']:.0f} s "
        f"({r['overhead_per_task_seconds']:.1f} s per task)",
        f"overhead {_pct(r['overhead_fraction'])}",
        "<= 10%",
    )


def _plan_check(r: dict) -> tuple:
    by_stage = ", ".join(f"{s} {x:.2f}" for s, x in r["ratio_by_stage"].items())
    measured, predicted = sum(r["measured_seconds"].values()), sum(r["predicted_seconds"].values())
    return (
        f"demo round predicted {predicted:.0f} s vs measured {measured:.0f} s (by stage: {by_stage})",
        f"ratio {r['ratio']:.2f}",
        "0.7-1.3",
    )


def _gpu_check(r: dict) -> tuple:
    m = r["model"]
    stages = ", ".join(f"{s} {x:.0f}" for s, x in r["seconds"].items() if r["on_cuda"][s] is not None)
    tps = ", ".join(f"{e} {x:.0f}" for e, x in r["generate_tokens_per_s"].items())
    off = [s for s, ok in r["on_cuda"].items() if ok is False]
    return (
        f"{r['device']}, random-init {m['parameters'] / 1e6:.0f}M Qwen2 ({m['layers']} x {m['hidden']}), generate "
        f"and evaluate on {r['generate_engine']}: seconds by stage {stages}; generated tokens/s {tps}; train "
        f"{r['train_tokens_per_s']:.0f} tokens/s",
        f"off the GPU: {', '.join(off) or 'none'}; {r['total_seconds']:.0f} s; train MFU "
        f"{_pct(r['mfu']['vs_measured_bf16_matmul'])} of the measured bf16 matmul",
        f"every stage on CUDA, <= {r['limit_seconds']} s",
    )


ROWS = {
    "startup": _startup,
    "train_step": _train_step,
    "rescoring": _rescoring,
    "rollout": _rollout,
    "generation": _generation,
    "data_plane": _data_plane,
    "pipeline_overhead": _pipeline_overhead,
    "plan_check": _plan_check,
    "gpu_check": _gpu_check,
}


def _machine(m: dict) -> str:
    gpu = f", GPU {m['cuda']}" if m.get("cuda") else ", no GPU"
    cpu = m.get("cpu") or m.get("processor", "")
    kernels = (
        f" ({m['cpu_capability']} kernels)" if m.get("cpu_capability") else ""
    )  # recorded since 2026-12-07
    return (
        f"{cpu}{kernels}, {m.get('cpus', '?')} cores, torch {m['torch']} ({m['torch_threads']} threads){gpu}"
    )


def _load(results_dir: Path, name: str) -> dict | None:
    path = results_dir / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _code(p: dict) -> str:
    """``at 06cc842f1e2a`` (``with uncommitted changes``): the code a provenance names."""
    at = f"at {p['commit'][:12]}" if p["commit"] else "outside a git checkout"
    return at + (" with uncommitted changes" if p["uncommitted"] else "")


def _made_by(results: list[dict]) -> str:
    """One line per distinct provenance: commit, base model build, command and machine."""
    lines = set()
    for r in results:
        p = r.get("provenance")
        if p is None:
            lines.add(f"`{r['benchmark']}`: no provenance (made by an older sdarflow); rerun it")
            continue
        commit = _code(p)
        base = p.get("base_model") or {}
        spec = f"spec {base['spec_hash']}, " if base.get("spec_hash") else ""  # an imported model has no spec
        build = f"; base model {spec}content {(base['content_id'] or '?')[:12]}" if base else ""
        lines.add(f"sdarflow {p['sdarflow']} {commit}{build}; {_machine(r['machine'])}")
    return "\n".join(f"Made by: {line}." for line in sorted(lines))


def bench_table(results_dir: Path = RESULTS) -> str:
    """The Markdown table of every benchmark with a result file, and what made them."""
    lines = ["| benchmark | measured | judged | target |", "|---|---|---|---|"]
    results = []
    for name, row in ROWS.items():
        result = _load(results_dir, name)
        if result is None:
            continue
        try:
            cells = row(result)
        except KeyError as err:  # written by an older version of the benchmark
            cells = (f"an older result (no {err}); rerun `python -m bench {name}`", "-", "-")
        lines.append("| " + " | ".join((name, *cells)) + " |")
        results.append(result)
    return "\n".join([*lines, "", _made_by(results)])


def _ci(fig: dict) -> str:
    lo, hi = fig["ci95"]
    return f"{fig['value']:.3f} [{lo:.3f}, {hi:.3f}]"


def _mde_note(shown: list[dict]) -> str:
    """The footnote that says what MDE means, where one of the ``shown`` differences prints one."""
    if all(d.get("mde") is None for d in shown):
        return ""
    return "; MDE: the minimum detectable effect (the smallest true difference a two-sided 5% test finds ~80% of the time)"


def _diff(d: dict) -> str:
    return signed_with_interval(d["mean_diff"], d["ci95"], d.get("tasks"), d.get("mde"))


def grpo_tuning_table(results_dir: Path = RESULTS) -> str:
    """Each candidate setting's pooled valid/test/ood pass@1, the one selected on valid, and its GRPO - base
    differences (paired by task, intervals over tasks)."""
    r = _load(results_dir, "grpo_tuning")
    if r is None:
        return "(no result yet: `python -m bench.grpo_tuning`)"
    seeds = ", ".join(map(str, r["seeds"]))
    lines = [
        f"| setting (stage settings on the demo preset) | valid pass@1 | test pass@1 | ood pass@1 | "
        f"GRPO - base, test pass@1 | seeds ({seeds}): test pass@1 |",
        "|---|---|---|---|---|---|",
    ]
    any_c = next(iter(r["candidates"].values()))
    lines.append(
        f"| base model (evaluated per seed) | {_ci(any_c['base']['valid_pass@1'])} | {_ci(any_c['base']['test_pass@1'])} "
        f"| {_ci(any_c['base']['ood_pass@1'])} | | |"
    )
    for name, c in r["candidates"].items():
        mark = f"**{name}** (selected on {r['selected_on']})" if name == r["selected"] else name
        per_seed = ", ".join(f"{v:.3f}" for v in c["per_seed_test_pass@1"].values())
        lines.append(
            f"| {mark} `{json.dumps(c['stage_settings'])}` | {_ci(c['valid_pass@1'])} | {_ci(c['test_pass@1'])} | "
            f"{_ci(c['ood_pass@1'])} | {_diff(c['grpo_vs_base']['test_pass@1'])} | {per_seed} |"
        )
    tasks = r["grpo_vs_base"]["test_pass@1"]["tasks"]
    return "\n".join(
        [
            *lines,
            "",
            f"{r['rounds']} rounds, {len(r['seeds'])} seeds, {tasks} tasks x samples per split; intervals are 95%, "
            f"over tasks (seed-averaged){_mde_note([c['grpo_vs_base']['test_pass@1'] for c in r['candidates'].values()])}. "
            f"Command: `{r['provenance']['command']}`.",
            _made_by([r]),
        ]
    )


def _figure(fig: dict) -> str:
    lo, hi = fig["pass@1_ci95"]
    return f"{fig['pass@1']:.3f} [{lo:.3f}, {hi:.3f}]"


def demo_table(results_dir: Path = RESULTS) -> str:
    """The demo's base model and rounds (its run report's figures): held-out pass@1 with intervals, and each round
    against the base model as the promotion gate compares them."""
    r = _load(results_dir, "demo")
    if r is None:
        return "(no result yet: `python -m bench.demo_result`)"
    base = r["base"]
    lines = [
        "| | test pass@1 [95% CI] | ood pass@1 [95% CI] | tasks x samples | test pass@1 - base (paired), lower bound "
        "| skill rules right / wrong / recipe-blind |",
        "|---|---|---|---|---|---|",
        f"| base model | {_figure(base['test'])} | {_figure(base['ood'])} | {base['test']['tasks_x_samples']} | | |",
    ]
    for row in r["per_round"]:
        test, d = row["eval"]["test"], row["eval"]["test"]["vs_base"]
        bound = "none" if d["lower"] is None else f"{d['lower']:+.3f}"
        rules = " / ".join(str(row["skills"].get(v, "-")) for v in ("right", "wrong", "recipe_blind"))
        lines.append(
            f"| round {row['round']} | {_figure(test)} | {_figure(row['eval']['ood'])} | "
            f"{test['tasks_x_samples']} | {d['diff']:+.3f}, {bound} | {rules} |"
        )
    took = f"The run took {r['seconds'] / 60:.1f} min. " if r.get("seconds") else ""
    return "\n".join([*lines, "", took + _made_by([r])])


def skill_support_table(results_dir: Path = RESULTS) -> str:
    """Rules right / wrong / recipe-blind by solved tasks per type (walkthroughs) and by minimum support (policy
    rollouts) of ``python -m bench.skill_support``."""
    r = _load(results_dir, "skill_support")
    if r is None:
        return "(no result yet: `python -m bench.skill_support`)"

    def counts(c: dict) -> str:
        return f"{c['right']} / {c['wrong']} / {c['recipe_blind']} | {c['skills']} ({c['steps']} steps)"

    lines = [
        "| data | setting | rules right / wrong / recipe-blind | task-type skills published (steps) |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| walkthroughs ({r['draws']} draws) | {k} solved tasks per type | {counts(c)} |"
        for k, c in sorted(r["walkthroughs"].items(), key=lambda kv: int(kv[0]))
    ]
    lines += [
        f"| rollouts ({r['rollout_datasets']} rounds) | min_support {m} | {counts(c)} |"
        for m, c in sorted(r["rollouts"].items(), key=lambda kv: int(kv[0]))
    ]
    return "\n".join([*lines, "", _made_by([r])])


def learning_check_table(name: str, results_dir: Path = RESULTS) -> str:
    """Train success per round and seed (round 0 = the base; the last column: the final adapter's rollouts) of
    ``python -m bench.learning_check``, the mean over seeds, and per round the update's diagnostics (mean over
    seeds): the share of groups with no advantage and the auxiliary term's gradient share."""
    r = _load(results_dir, name)
    if r is None:
        return "(no result yet: `python -m bench.learning_check`)"
    curves = r["train_success_by_round"]
    n = len(r["mean_by_round"])  # the rounds every seed reached
    width = max(map(len, curves.values()))
    lines = [
        "| seed | base | " + " | ".join(f"after round {i}" for i in range(1, width)) + " | final - base |",
        "|---" * (width + 2) + "|",
    ]
    rows = [(f"seed {s}", c) for s, c in curves.items()] + [("mean", r["mean_by_round"])]
    lines += [
        f"| {label} | {' | '.join([f'{x:.3f}' for x in c] + [''] * (width - len(c)))} | {c[-1] - c[0]:+.3f} |"
        for label, c in rows
    ]

    def by_round(key: str) -> str:  # the mean over seeds of each trained round's value whose outcome is shown
        values = [[rec.get(key) for rec in records[: n - 1]] for records in r["rounds_by_seed"].values()]
        means = [[v for v in col if v is not None] for col in zip(*values, strict=True)]
        return " ".join("-" if not m else f"{sum(m) / len(m):.3g}" for m in means)

    s = r["settings"]
    command = f" (`{r['provenance']['command']}`)" if r.get("provenance") else ""
    what = "the same" if r["fixed_tasks"] else "new ones"
    lines += [
        "",
        f"{r['method']}, {s['tasks']} train tasks x {s['group_size']} samples a round ({what} every round), lr {s['lr']}, "
        f"{s['train_steps']} mini-batches, LoRA rank {s['lora_rank']}{command}. "
        f"By round: the share of groups with zero advantage {by_round('zero_adv_group_share')}; the gradient "
        f"share |grad aux| / |grad pg| {by_round('aux_grad_share')}; the gate's expert-match discrimination "
        f"{by_round('gate_discrimination_expert')}. Overfit bar (final >= min(2 x base, "
        f"base + 0.3)): {_verdict(r['passed'])} ({r['base_mean']:.3f} -> {r['final_mean']:.3f}).",
    ]
    if not r.get("complete", True):  # written after each round since 2026-12-07
        played = {str(seed): len(c) - 1 for seed, c in curves.items()}
        counts = "; ".join(f"seed {seed}: {played.get(str(seed), 0)} of {s['rounds']}" for seed in r["seeds"])
        lines[-1] += (
            f" **Stopped short** (the result is written after every round): updates rolled out, {counts}; a "
            f"stopped seed's last column is its last round's rollouts, and the mean covers the rounds every seed "
            f"started reached."
        )
    if "forgotten_tasks" in r:  # recorded since the per-task counts were
        n_tasks = len(next(iter(r["rounds_by_seed"].values()))[-1]["solved_by_task"])
        lost = "; ".join(f"seed {seed}: {len(t)}" for seed, t in r["forgotten_tasks"].items())
        lines[-1] += (
            f" Tasks (of {n_tasks}) solved in at least half their episodes after some round and in none at the end: "
            f"{lost}."
        )
    return "\n".join([*lines, "", _made_by([r])])


def _verdict(passed: bool | None) -> str:
    return "not judged (the run stopped short)" if passed is None else "met" if passed else "not met"


def _arm_round(rnd: dict) -> str:
    return f"{rnd['format_error_rate']:.3f} / {rnd['success']:.3f}"


def format_collapse_table(name: str, results_dir: Path = RESULTS) -> str:
    """Format-error rate / success of each round's start policy per guard arm of ``python -m bench.format_collapse``,
    with the probe's remedy steps and rollbacks per round."""
    r = _load(results_dir, name)
    if r is None:
        return f"(no result yet: `python -m bench.format_collapse`, {name})"
    steps = r["settings"]["steps"]
    n = max(len(curve) for curve in r["rounds"].values())
    lines = [
        "| arm | "
        + " | ".join(f"round {i} format errors / success" for i in range(n))
        + " | remedy SFT steps, rollbacks (by round) |",
        "|---" * (n + 2) + "|",
    ]
    for arm, curve in r["rounds"].items():
        probes = [
            f"{rnd.get('remedy_steps', 0)}, {len(rnd.get('rollbacks') or [])} of {steps} steps"
            for rnd in curve
            if rnd.get("rollbacks")
        ]
        cells = " | ".join(_arm_round(rnd) for rnd in curve)
        lines.append(f"| {arm} | {cells} | {'; '.join(probes) or '-'} |")
    return "\n".join([*lines, "", _made_by([r])])


def study_table(name: str, results_dir: Path = RESULTS) -> str:
    """A method study (``sdarflow study``'s study.json, committed by ``python -m bench.study_result``): each method's
    pooled pass@1 per split and test pass@k, its paired test pass@1 difference from GRPO, the gate's verdicts per
    seed, and GRPO against the base model."""
    r = _load(results_dir, name)
    if r is None:
        return f"(no result yet: `python -m bench.study_result DIR {name.removeprefix('study_')}`)"
    k, seeds = r["k"], r["settings"]["seeds"]
    splits = [s for s in ("valid", "test", "ood") if f"{s}_pass@1" in r["methods"]["grpo"]]
    lines = [
        "| method | " + " | ".join(f"{s} pass@1" for s in splits) + f" | test pass@{k} | test pass@1 - grpo "
        "(paired) | gate vs grpo (seeds passed) |",
        "|---" * (len(splits) + 4) + "|",
        "| base model | " + " | ".join(_ci(r["base"][f"{s}_pass@1"]) for s in splits) + " | | | |",
    ]
    for method, m in r["methods"].items():
        paired = r["paired"].get(method, {}).get("test_pass@1")
        gate = r["gate"].get(method)
        passed = "" if gate is None else f"{sum(not f for f in gate.values())} of {len(gate)}"
        lines.append(
            f"| {method} | "
            + " | ".join(_ci(m[f"{s}_pass@1"]) for s in splits)
            + f" | {_ci(m['test_pass@k'])} | "
            f"{_diff(paired) if paired else ''} | {passed} |"
        )
    vs_base = ", ".join(f"{key.split('_')[0]} {_diff(d)}" for key, d in r["paired"]["grpo_vs_base"].items())
    shown = [
        *r["paired"]["grpo_vs_base"].values(),
        *(d["test_pass@1"] for d in r["paired"].values() if "test_pass@1" in d),
    ]
    tasks = r["methods"]["grpo"]["test_pass@1"]["tasks"]
    warm = r["settings"].get("warm_start")
    start = (
        f"Every row, the base model's too, starts from an SFT warm start on {warm['tasks']} expert walkthroughs "
        f"of the train split. "
        if warm
        else ""
    )
    return "\n".join(
        [
            *lines,
            "",
            f"{start}GRPO - base model (paired): {vs_base}. {r['settings']['rounds']} rounds, seeds "
            f"{', '.join(map(str, seeds))}, {tasks} tasks per split; 95% intervals over tasks (seed-averaged){_mde_note(shown)}. "
            f"Command: `{r['provenance']['command']}`.{_reanalysed(r)}",
            _made_by([r]),
        ]
    )


def _reanalysed(r: dict) -> str:
    """Where ``python -m bench.study_result --reanalyse`` recomputed a study's figures with other code, say so."""
    by, made = r.get("analysed_by"), r["provenance"]
    if not by or (by["commit"], by["uncommitted"]) == (made["commit"], made["uncommitted"]):
        return ""
    return f" Figures recomputed from its cells with sdarflow {_code(by)} (`--reanalyse`)."


FORMAT_COLLAPSE = ("format_collapse", "format_collapse_lr_tool_use", "format_collapse_lr_textworld_cooking")


def premise_table(name: str, results_dir: Path = RESULTS) -> str:
    """SDAR's premise as discrimination (``python -m bench.premise``): per teacher context and skill place, the
    gate and the gap on expert-matching minus other turns and on successful minus failed episodes' turns."""
    r = _load(results_dir, name)
    ro = r["rollouts"]
    lines = [
        f"{r['env']}, {r['model']}{' + ' + r['adapter'] if r['adapter'] else ''}: {r['tasks']} tasks x "
        f"{r['samples']} samples, {ro['rollout/episodes']:.0f} episodes, success {ro['rollout/success']:.3f}, "
        f"format errors {ro['rollout/format_error_rate']:.3f}; skills: {r['skills_library']} library",
        "",
        "| teacher context | place | gate: expert - other [95%] | gate: success - failure | gap: expert - other "
        "| gap: success - failure | mean q - s |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in r["rows"]:
        if "refused" in row:
            lines.append(
                f"| {row['context']} | {row['place']} | refused by rescore's guards: {row['refused']} |||||"
            )
            continue
        cells = [row[f"{c}/{q}"]["text"] for q in ("gate", "gap") for c in ("expert", "success")]
        lines.append(f"| {row['context']} | {row['place']} | {' | '.join(cells)} | {row['gap_mean']:+.3f} |")
    return "\n".join([*lines, "", _made_by([r])])


def gate_null_table(results_dir: Path = RESULTS) -> str:
    """``python -m bench.gate_null``: the gate's promotion rate per scenario and task count, each bound alone and
    the gate's (their minimum, none below its ``min_tasks``); the nulls' rates are false promotions, the gain's is
    power."""
    r = _load(results_dir, "gate_null")
    if r is None:
        return "(no result yet: `python -m bench.gate_null`)"
    bounds = ("t", "sign_flip", "skew", "gate")
    names = {
        "t": "Student t",
        "sign_flip": "sign flip",
        "skew": "skew-corrected t",
        "gate": "**gate** (the minimum"
        + (f"; none below {r['min_tasks']} tasks)" if "min_tasks" in r else ")"),
    }
    lines = [
        f"| scenario | tasks | {' | '.join(names[b] for b in bounds)} |",
        "|---|---|" + "---|" * len(bounds),
    ]
    for scenario, by_n in r["rates"].items():
        lines += [f"| {scenario} | {n} | " + " | ".join(f"{rates[b]:.3f}" for b in bounds) + " |"
                  for n, rates in by_n.items()]  # fmt: skip
    note = (
        f"{r['sims']} simulated comparisons per row ({r['samples_per_task']} samples a task); a rate's 95% Monte "
        f"Carlo half-width at 5% is {r['mc_halfwidth_at_5pct']:.3f}."
    )
    return "\n".join([*lines, "", note, "", _made_by([r])])


def generation_engines_table(results_dir: Path = RESULTS) -> str:
    """``python -m bench generation``'s engine grid: the hf engine and vLLM's CPU engine at the rollout's shapes."""
    r = _load(results_dir, "generation")
    if r is None or "grid" not in r:
        return "(no result yet: `python -m bench generation`)"
    lines = [
        "| prompt, new tokens, rows | prompt tokens | hf tokens/s | vLLM tokens/s | vLLM / hf "
        "| the prompt's share of the call (hf, vLLM) | fraction of matmul peak (hf, vLLM) |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in sorted(r["grid"].values(), key=lambda c: (c["kind"], c["new_tokens"], c["batch"])):
        hf, v = c["hf"], c.get("vllm")
        vllm = (
            (f"{v['tokens_per_s']:.1f}", f"{c['vllm_over_hf']:.2f}x", _pct(v["prefill_share"]), f"{v['fraction_of_peak']:.2f}")
            if v
            else ("-", "-", "-", "-")
        )  # fmt: skip
        cells = (
            f"{c['kind']}, {c['new_tokens']} new, {c['batch']} {'row' if c['batch'] == 1 else 'rows'}",
            f"{c['prompt_tokens_mean']:.0f}",
            f"{hf['tokens_per_s']:.1f}",
            vllm[0],
            vllm[1],
            f"{_pct(hf['prefill_share'])}, {vllm[2]}",
            f"{hf['fraction_of_peak']:.2f}, {vllm[3]}",
        )
        lines.append("| " + " | ".join(cells) + " |")
    setup = r["vllm"]
    if "skipped" in setup:
        engine = f"vLLM not measured: {setup['skipped']}"
    else:
        engine = (
            f"vLLM {setup['vllm']} (torch {setup['torch']}, {'compiled' if setup['compiled'] else 'eager'}, "
            f"prefix caching {'on' if setup['prefix_caching'] else 'off'}) started in {setup['start_seconds']:.0f} s"
        )
    note = (
        f"{engine}; the hf engine's first shape timed again after vLLM's took {r['hf_drift']:.2f}x its first time. "
        f"Rows: one prompt, or tasks x {r['group_size']} samples of each in one call."
    )
    return "\n".join([*lines, "", note, "", _made_by([r])])


TABLES: dict[str, Callable[[Path], str]] = {
    **{name: functools.partial(format_collapse_table, name) for name in FORMAT_COLLAPSE},
    "bench": bench_table,
    "grpo_tuning": grpo_tuning_table,
    "demo": demo_table,
    "skill_support": skill_support_table,
    "gate_null": gate_null_table,
    "generation_engines": generation_engines_table,
}


def _tables(results_dir: Path) -> dict[str, Callable[[Path], str]]:
    """TABLES, and a study table for every committed ``study_*.json`` (a premise table per ``premise_*.json``)."""
    per_file = {
        p.stem: functools.partial(make, p.stem)
        for prefix, make in (
            ("study", study_table),
            ("premise", premise_table),
            ("learning_check", learning_check_table),
        )
        for p in sorted(results_dir.glob(f"{prefix}_*.json"))
    }
    return {**TABLES, **per_file}


def _shows(name: str) -> set[str]:
    """The result files (stems) table ``name`` renders."""
    return {"bench": set(ROWS)}.get(name, {name})


def _markers(name: str) -> tuple[str, str]:
    return (f"<!-- generated: {name} (python -m bench.tables) -->", f"<!-- end generated: {name} -->")


def render(text: str, results_dir: Path = RESULTS) -> str:
    """``text`` with every table between its markers rendered anew; a page without some table's markers keeps it
    out (SystemExit when it has none at all)."""
    found = 0
    for name, make in _tables(results_dir).items():
        start, end = _markers(name)
        if start not in text or end not in text:
            continue
        found += 1
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        try:
            table = make(results_dir)
        except KeyError as err:  # a result file written by an older version of its benchmark
            table = f"(an older result file, without {err}: rerun its benchmark)"
        text = f"{head}{start}\n{table}\n{end}{tail}"
    if not found:
        raise SystemExit("error: the page has no generated-table markers; fix: put them around each table")
    return text


def _pages(pages: Path | str | Iterable[Path | str] | None) -> list[Path]:
    """``pages`` as a list: one page, several, or (None) ``PAGES``."""
    if pages is None:
        return list(PAGES)
    if isinstance(pages, (str, Path)):
        return [Path(pages)]
    return [Path(page) for page in pages]


def _on_page(text: str, names: Iterable[str]) -> list[str]:
    """The tables of ``names`` whose two markers ``text`` holds."""
    return [name for name in names if all(marker in text for marker in _markers(name))]


def _between(text: str, name: str) -> str:
    start, end = _markers(name)
    return text.split(start, 1)[1].split(end, 1)[0]


def update(pages: Path | str | Iterable[Path | str] | None = None, results_dir: Path = RESULTS) -> None:
    """Rewrite every generated table of every page (``PAGES`` by default, or one page) from ``results_dir``; a page
    without markers is skipped, and SystemExit when no page has any."""
    pages, names, found = _pages(pages), list(_tables(results_dir)), False
    for page in pages:
        text = page.read_text()
        if not _on_page(text, names):
            continue
        found = True
        fresh = render(text, results_dir)
        if fresh != text:
            page.write_text(fresh)
    if not found:
        raise SystemExit(
            f"error: no generated-table markers on any page ({', '.join(map(str, pages))}); "
            "fix: put them around each table"
        )


def stale(pages: Path | str | Iterable[Path | str] | None = None, results_dir: Path = RESULTS) -> list[str]:
    """The generated tables that differ from what their JSON renders on any page (``PAGES`` by default, or one
    page), and the result files that no table on any page shows."""
    names = list(_tables(results_dir))
    bad, shown = set(), set()
    for page in _pages(pages):
        text = page.read_text()
        on_page = _on_page(text, names)
        if not on_page:
            continue
        fresh = render(text, results_dir)
        for name in on_page:
            shown |= _shows(name)
            if _between(text, name) != _between(fresh, name):
                bad.add(name)
    unshown = sorted({p.stem for p in results_dir.glob("*.json")} - shown)
    return [name for name in names if name in bad] + [f"{stem} (no table shows it)" for stem in unshown]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.tables", description="render the result tables of README.md and docs/*.md"
    )
    p.add_argument(
        "--check", action="store_true", help="only check: exit 1 when a table disagrees with its JSON"
    )
    args = p.parse_args(argv)
    if args.check:
        bad = stale()
        if bad:
            print(
                f"error: page table(s) {', '.join(bad)} disagree with bench/results; fix: python -m bench.tables"
            )
            return 1
        return 0
    update()
    return 0


if __name__ == "__main__":
    sys.exit(main())
