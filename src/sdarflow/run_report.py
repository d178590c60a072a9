"""The run report: one page for a whole training run, read before promoting its adapter: per round what the stages
published (rollouts, learning signal, held-out pass@k against the base model with the gate's paired lower bound)
and three transcripts of the last round (best, median, worst). Published as ``report.html``, ``report.md`` and
``run_report.json`` at ``<storage>/runs/<run_id>/report``; the training pipeline's last task shows it in the KFP UI.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sdarflow import storage
from sdarflow.evaluate.compare import difference
from sdarflow.pipeline_config import generate_uris, run_uri, stage_uri
from sdarflow.registry.intake import load_report
from sdarflow.report import Report, Section, html, markdown, number, png, with_interval
from sdarflow.rollout.report import TRANSCRIPT_COLUMNS, group_episodes, transcript, transcript_section
from sdarflow.schema import TRAJECTORY_SCHEMA
from sdarflow.skills.accuracy import VERDICTS
from sdarflow.teacher import UNKNOWN_CONTEXT, controls

REPORT_KIND = "run-report"

HOW_TO_READ = (
    "Train success is on the round's own (new) training tasks, before its update; held-out pass@1 is after it. A "
    "round learns only from groups whose samples disagree: a zero-advantage share near 1 means nothing to learn "
    "from (all fail or all succeed; more samples or easier tasks help). The teacher gap (teacher minus student "
    "log-prob per token, nats) must be positive for distillation to help: negative means the skills do not make "
    "the teacher better, and the gate (sigmoid of beta times the gap) hovers near or below 0.5. Entropy falling "
    "towards 0 means the policy stops exploring; KL is the distance from the base policy; clip is the share of "
    "tokens whose ratio was clipped. Against the base model, a round is better only where the lower bound of the "
    "paired difference is above 0: that is the promotion gate's test."
)


def _rollout(storage_root: str, run_id: str, round_: int, shards: int) -> tuple[dict, list]:
    """The round's rollout figures (weighted over shards) and its episodes."""
    uris = generate_uris(storage_root, run_id, round_, shards)
    manifests = [storage.read_manifest(u) for u in uris]
    metrics = [m["metrics"] for m in manifests]
    n = sum(m["rollout/episodes"] for m in metrics) or 1.0
    seconds = sum(m.get("rollout/seconds", 0.0) for m in metrics)
    tokens = sum(m.get("rollout/tokens_per_s", 0.0) * m.get("rollout/seconds", 0.0) for m in metrics)

    def weighted(key: str) -> float:
        return sum(m.get(key, 0.0) * m["rollout/episodes"] for m in metrics) / n

    table = storage.read_table(uris, kind="trajectories", schema=TRAJECTORY_SCHEMA)
    # not the token ids: a round's are large
    episodes = group_episodes(table.select(TRANSCRIPT_COLUMNS).to_pylist())
    figures = {
        "episodes": int(n),
        "success": weighted("rollout/success"),
        "mean_return": statistics.fmean(float(ep[0]["episode_return"]) for ep in episodes)
        if episodes
        else 0.0,
        "format_error_rate": weighted("rollout/format_error_rate"),
        "truncated": sum(m.get("rollout/context_exceeded", 0.0) for m in metrics) / n,
        "identical_groups": sum(m.get("rollout/identical_groups", 0.0) for m in metrics),
        # the engines that generated them (None: outputs older than the record) and their tokens/s per shard
        "engine": ", ".join(sorted({m["engine"] for m in manifests if "engine" in m})) or None,
        "tokens_per_s": tokens / seconds if seconds else None,
    }
    return figures, episodes


def _vs(report: Mapping[str, Any], base: Mapping[str, Any] | None, split: str, k: str) -> dict | None:
    try:
        d = difference(report["splits"][split], base["splits"][split], int(k))  # type: ignore[index]
    except (KeyError, TypeError, ValueError):
        return None  # no base report, or reports without per-task results
    return {"diff": d.diff, "lower": d.lower, "tasks": d.tasks}


def _pass1(split: Mapping[str, Any]) -> dict[str, Any]:
    """A split's pass@1 with its 95% interval and the counts behind it: what is shown wherever a pass@1 is."""
    return {
        "pass@1": split["pass_at_k"]["1"],
        "pass@1_ci95": split["ci95"].get("1"),
        "tasks_x_samples": f"{split['n_tasks']} x {split['samples_per_task']}",
    }


def _round(
    storage_root: str, run_id: str, r: int, shards: int, base: Mapping[str, Any] | None
) -> tuple[dict, list]:
    rollout, episodes = _rollout(storage_root, run_id, r, shards)
    trained = storage.read_manifest(stage_uri(storage_root, run_id, r, "train"))
    train = trained.get("metrics", {})
    rescored = storage.read_manifest(stage_uri(storage_root, run_id, r, "rescore"))
    rescore = rescored.get("metrics", {})
    skills = storage.read_manifest(stage_uri(storage_root, run_id, r, "extract-skills")).get("metrics", {})
    report = load_report(stage_uri(storage_root, run_id, r, "evaluate"))
    keys = ("adv/zero_group_share", "adv/std", "sdar/gate_mean", "sdar/teacher_gap_mean", "actor/entropy",
            "actor/kl_loss", "actor/clipfrac", "loss/total")  # fmt: skip
    evaluation = {}
    for split, s in report["splits"].items():
        k = max(s["pass_at_k"], key=int)
        evaluation[split] = {
            **_pass1(s), "k": k, f"pass@{k}": s["pass_at_k"][k], "format_error_rate": s.get("format_error_rate"),
            "vs_base": _vs(report, base, split, "1"),
        }  # fmt: skip
    row = {
        "round": r,
        "rollout": rollout,
        "train": {key: train.get(key) for key in keys},
        "teacher_gap_positive_share": rescore.get("rescore/gap_positive_share"),
        # what taught the round's adapter: this round's teacher and any its start adapter inherited
        "teacher_contexts": trained.get("teacher_contexts")
        or [rescored.get("teacher_context") or UNKNOWN_CONTEXT],
        # the round's skill library against the env's ground truth (absent where the env has none)
        "skills": {v: skills[f"skills/rules_{v}"] for v in VERDICTS if f"skills/rules_{v}" in skills},
        "eval": evaluation,
    }
    return row, episodes


def collect(
    storage_root: str, run_id: str, rounds: int, shards: int = 1, promotion: str = "", base_uri: str = ""
) -> dict[str, Any]:
    """Everything the report shows, as JSON (``run_report.json``); ``promotion`` is the promote task's outcome and
    ``base_uri`` the base model's evaluation ('': none)."""
    base = load_report(base_uri) if base_uri and storage.is_published(base_uri) else None
    per_round, episodes = [], []
    for r in range(rounds):
        row, episodes = _round(storage_root, run_id, r, shards, base)
        per_round.append(row)
    ranked = sorted(episodes, key=lambda ep: (float(ep[0]["episode_return"]), ep[0]["traj_id"]))
    picks = {"best": ranked[-1], "median": ranked[len(ranked) // 2], "worst": ranked[0]} if ranked else {}
    base_figures = {split: _pass1(s) for split, s in (base or {}).get("splits", {}).items()}
    return {
        "run_id": run_id,
        "promotion": promotion,
        "rounds": per_round,
        "base": base_figures,
        "transcripts": {name: transcript(ep) for name, ep in picks.items()},
    }


def _tables(data: Mapping[str, Any]) -> list[Section]:
    rounds = data["rounds"]
    rollout = (["round", "episodes", "train success", "mean return", "format errors", "truncated", "identical groups",
                "engine", "tokens/s"],
               [[str(r["round"]), str(r["rollout"]["episodes"]), *(number(r["rollout"][k]) for k in
                 ("success", "mean_return", "format_error_rate", "truncated")), number(r["rollout"]["identical_groups"], 0),
                 r["rollout"].get("engine") or "-", number(r["rollout"].get("tokens_per_s"), 0)]
                for r in rounds])  # fmt: skip
    keys = list(rounds[0]["train"]) if rounds else []
    train = (["round", *keys, "teacher gap > 0"],
             [[str(r["round"]), *(number(r["train"][k]) for k in keys), number(r["teacher_gap_positive_share"])]
              for r in rounds])  # fmt: skip
    held_out = []
    for split in sorted({s for r in rounds for s in r["eval"]}, key=lambda s: (s != "test", s)):
        b = data["base"].get(split, {})
        held_out.append(
            ["base model", split, with_interval(b.get("pass@1"), b.get("pass@1_ci95")), "-", "-", "-"]
        )
        for r in rounds:
            e = r["eval"].get(split)
            vs = (e or {}).get("vs_base") or {}
            if e:
                held_out.append([f"round {r['round']}", split, with_interval(e["pass@1"], e["pass@1_ci95"]),
                                 f"{number(e['pass@' + e['k']])} (k={e['k']})", number(e["format_error_rate"]),
                                 "-" if not vs else f"{vs['diff']:+.3f} (lower {number(vs['lower'])}, {vs['tasks']} tasks)"])  # fmt: skip
    header = [
        "model",
        "split",
        "pass@1 [95% CI]",
        "pass@k",
        "format errors",
        "vs base (paired, one-sided 95%)",
    ]
    sections = [
        Section("Rollouts (generate)", table=rollout),
        Section("Learning signal (rescore, train)", table=train),
        Section("Held-out evaluation", table=(header, held_out)),
    ]
    if any(r.get("skills") for r in rounds):
        rows = [[str(r["round"]), *(number(r["skills"].get(v)) for v in VERDICTS)] for r in rounds]
        sections.append(
            Section(
                "Skill library against the env (rules and steps; extract-skills)",
                table=(["round", *VERDICTS], rows),
            )
        )
    return sections


def _plot(data: Mapping[str, Any]) -> bytes:
    from matplotlib.figure import Figure  # lazy: matplotlib is slow to import

    fig = Figure(figsize=(7, 3.2))
    ax_eval, ax_train = fig.subplots(1, 2)
    rounds = [r["round"] for r in data["rounds"]]
    for split, color in (("test", "C0"), ("ood", "C1")):
        values = [r["eval"].get(split, {}).get("pass@1") for r in data["rounds"]]
        if all(v is not None for v in values):
            ax_eval.plot(rounds, values, marker="o", color=color, label=f"{split} pass@1")
            if split in data["base"]:
                ax_eval.axhline(
                    data["base"][split]["pass@1"], color=color, linestyle="--", label=f"{split} base"
                )
    ax_eval.set(xlabel="round", title="held-out pass@1", ylim=(0, 1))
    ax_eval.legend(fontsize=7)
    ax_train.plot(
        rounds, [r["rollout"]["success"] for r in data["rounds"]], marker="o", label="train success"
    )
    zero = [r["train"].get("adv/zero_group_share") for r in data["rounds"]]
    if all(v is not None for v in zero):
        ax_train.plot(rounds, zero, marker="s", label="zero-advantage groups")
    ax_train.set(xlabel="round", title="training rounds", ylim=(0, 1))
    ax_train.legend(fontsize=7)
    for ax in (ax_eval, ax_train):
        ax.set_xticks(rounds)
    fig.tight_layout()
    return png(fig)


def _teacher_text(rounds: list[Mapping[str, Any]]) -> str:
    """What the teacher read (``rescore --teacher-context``), and what a control means for promotion."""
    contexts = sorted({str(c) for r in rounds for c in r["teacher_contexts"]})
    text = f"The teacher's privileged context: {', '.join(contexts) or 'none recorded'}."
    if taught := controls(contexts):
        text += (
            f" The {' and '.join(taught)} teacher reads what only training sees: this run is a control, and the "
            f"gate refuses its versions for production unless forced with a reason."
        )
    return text


def build(data: Mapping[str, Any]) -> Report:
    """The report to render from :func:`collect`'s data."""
    sections = [
        Section("How to read this", text=HOW_TO_READ),
        *([Section("Promotion", text=data["promotion"])] if data.get("promotion") else []),
        Section("Teacher", text=_teacher_text(data["rounds"])),
        *_tables(data),
        Section("Plots", images=("rounds",)),
    ]
    for name, t in data["transcripts"].items():
        sections.append(transcript_section(f"Transcript: {name} episode of the last round", t))
    return Report(
        title=f"Training run {data['run_id']}",
        subtitle=f"{len(data['rounds'])} round(s); every figure as the stages published it",
        sections=sections,
        images={"rounds": ("held-out pass@1 and training signal per round", _plot(data))},
    )


def publish_run_report(
    storage_root: str, run_id: str, rounds: int, shards: int = 1, promotion: str = "", base_uri: str = ""
) -> str:
    """Collect, render and publish the run report at ``<storage>/runs/<run_id>/report``; its URI."""
    data = collect(storage_root, run_id, rounds, shards, promotion, base_uri)
    doc = build(data)
    uri = run_uri(storage_root, run_id, "report")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        (out / "run_report.json").write_text(json.dumps(data, indent=2, sort_keys=True))
        (out / "rounds.png").write_bytes(doc.images["rounds"][1])
        (out / "report.md").write_text(markdown(doc, {"rounds": "rounds.png"}))
        (out / "report.html").write_text(html(doc))
        storage.publish_dir(out, uri, kind=REPORT_KIND, overwrite=True, run_id=run_id, rounds=rounds)
    return uri
