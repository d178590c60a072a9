"""The README's benchmark table, rewritten from ``bench/results/*.json`` after every ``python -m bench`` run: one
row per benchmark (what was measured, the ratio that is judged, the target), and the machine it ran on."""

from __future__ import annotations

import json
from pathlib import Path

from bench.common import RESULTS

README = Path(__file__).parent.parent / "README.md"
START = "<!-- bench table: written by `make bench` from bench/results/*.json -->"
END = "<!-- end of bench table -->"


def _pct(x: float) -> str:
    return f"{x:.1%}"


def _startup(r: dict) -> tuple:
    worst = max(r["component_start_seconds"].items(), key=lambda kv: kv[1])
    return (
        f"`sdarflow --help` {r['help_seconds']:.2f} s; slowest component start ({worst[0]}) {worst[1]:.1f} s",
        f"{r['help_seconds']:.2f} s / {worst[1]:.1f} s",
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
    t = r["tokens_per_s"]
    return (
        f"packed {t['packed']:.0f} vs padded {t['padded_in_order']:.0f} tokens/s on {r['rows']} real turns "
        f"(mean {r['mean_row_tokens']:.0f} tokens, {r['forward_flops'] / 1e9:.0f} GFLOP)",
        f"speedup {r['speedup']:.2f}x (padding bound {r['speedup_bound']:.2f}x); fraction_of_peak "
        f"{r['fraction_of_peak']:.2f}",
        ">= 1.5x; >= 0.5",
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
    return (
        f"hf tokens/s by batch ({r['fixed_length_tokens']} tokens each) {by_batch}; loop (envs {r['loop_envs']}) "
        f"{loop['loop_tokens_per_s']:.0f} vs its engine calls replayed {loop['replay_tokens_per_s']:.0f} "
        f"({loop['episodes']} episodes); other env hosts: {others}",
        f"loop_efficiency {r['loop_efficiency']:.2f}",
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


ROWS = {
    "startup": _startup,
    "train_step": _train_step,
    "rescoring": _rescoring,
    "rollout": _rollout,
    "data_plane": _data_plane,
    "pipeline_overhead": _pipeline_overhead,
    "plan_check": _plan_check,
}


def _machine(m: dict) -> str:
    gpu = f", GPU {m['cuda']}" if m.get("cuda") else ", no GPU"
    cpu = m.get("cpu") or m.get("processor", "")
    return f"{cpu}, {m.get('cpus', '?')} cores, torch {m['torch']} ({m['torch_threads']} threads){gpu}"


def table(results_dir: Path = RESULTS) -> str:
    """The Markdown table of every benchmark with a result file, and the machines they ran on."""
    lines = ["| benchmark | measured | judged | target |", "|---|---|---|---|"]
    machines = set()
    for name, row in ROWS.items():
        path = results_dir / f"{name}.json"
        if not path.is_file():
            continue
        result = json.loads(path.read_text())
        try:
            cells = row(result)
        except KeyError as err:  # written by an older version of the benchmark
            cells = (f"an older result (no {err}); rerun `python -m bench {name}`", "-", "-")
        lines.append("| " + " | ".join((name, *cells)) + " |")
        machines.add(_machine(result["machine"]))
    lines.append("")
    lines.append("Machine: " + "; ".join(sorted(machines)) + ".")
    return "\n".join(lines)


def update(readme: Path = README, results_dir: Path = RESULTS) -> None:
    """Replace the text between START and END in the README with ``table()``."""
    text = readme.read_text()
    if START not in text or END not in text:
        raise SystemExit(
            f"error: {readme} lacks the bench table markers; fix: put {START!r} and {END!r} around it"
        )
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(f"{head}{START}\n{table(results_dir)}\n{END}{tail}")
