"""Rescore metrics (teacher - student gap distribution overall and per task type, retrieval, skills used,
throughput) and the stage's report with a gap histogram, for the KFP UI."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from sdarflow.report import Report, Section, png


@dataclass
class RescoreSummary:
    metrics: dict[str, float]
    per_type: dict[str, dict[str, float]]  # task type -> rows, tokens, gap_mean, gap_positive_share, hit_rate
    skills: dict[str, dict[str, float]]  # skill -> rows, gap_mean
    gaps: list[float] = field(repr=False)
    info: dict[str, str] = field(default_factory=dict)  # strategy, library version, batching, ...


def _gap_stats(gaps: list[float]) -> tuple[float, float]:
    if not gaps:
        return 0.0, 0.0
    return sum(gaps) / len(gaps), sum(g > 0 for g in gaps) / len(gaps)


def rescore_summary(
    old: list[list[float]],
    teacher: list[list[float]],
    task_types: list[str],
    hits: list[bool],
    matched: list[bool],
    skill_ids: list[list[str]],
    seconds: float,
) -> RescoreSummary:
    """Metrics keyed ``rescore/...`` (task types and skills as the last path element)."""
    row_gaps = [[q - s for s, q in zip(o, t, strict=True)] for o, t in zip(old, teacher, strict=True)]
    gaps = [g for r in row_gaps for g in r]
    flat_t = [q for t in teacher for q in t]
    flat_s = [s for o in old for s in o]
    mean, pos = _gap_stats(gaps)
    n = max(1, len(hits))
    metrics = {
        "rescore/gap_mean": mean,
        "rescore/gap_positive_share": pos,
        "rescore/teacher_logprob_mean": sum(flat_t) / max(1, len(flat_t)),
        "rescore/student_logprob_mean": sum(flat_s) / max(1, len(flat_s)),
        "rescore/tokens": float(len(gaps)),
        "rescore/rows": float(len(hits)),
        "rescore/retrieval_hit_rate": sum(hits) / n,
        "rescore/retrieval_match_rate": sum(matched) / n,
        # student and teacher passes both count
        "rescore/tokens_per_s": 2 * len(gaps) / max(seconds, 1e-9),
    }
    by_type: dict[str, list[int]] = defaultdict(list)
    for i, t in enumerate(task_types):
        by_type[t].append(i)
    per_type = {}
    for t, idx in sorted(by_type.items()):
        g = [x for i in idx for x in row_gaps[i]]
        m, p = _gap_stats(g)
        per_type[t] = {
            "rows": len(idx),
            "tokens": len(g),
            "gap_mean": m,
            "gap_positive_share": p,
            "hit_rate": sum(hits[i] for i in idx) / len(idx),
        }
        metrics[f"rescore/gap_mean/{t}"] = m
        metrics[f"rescore/gap_positive_share/{t}"] = p
    uses = Counter(s for ids in skill_ids for s in ids)
    skill_gaps: dict[str, list[float]] = defaultdict(list)
    for ids, g in zip(skill_ids, row_gaps, strict=True):
        for s in ids:
            skill_gaps[s].extend(g)
    skills = {s: {"rows": uses[s], "gap_mean": _gap_stats(skill_gaps[s])[0]} for s in sorted(uses)}
    for s, c in uses.items():
        metrics[f"rescore/skill_uses/{s}"] = float(c)
    return RescoreSummary(metrics, per_type, skills, gaps)


def histogram_png(gaps: list[float], bins: int = 40) -> bytes:
    """PNG of the per-token gap histogram (matplotlib's object API: no global pyplot state, no display)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3), dpi=100)
    ax = fig.add_subplot()
    ax.hist(gaps or [0.0], bins=bins, color="#3b6ea8")
    ax.axvline(0.0, color="black", linewidth=0.8)
    ax.set_xlabel("teacher - student log-prob per token")
    ax.set_ylabel("tokens")
    fig.tight_layout()
    return png(fig)


def rescore_report(summary: RescoreSummary) -> Report:
    """The stage's report: headline metrics and settings, the per-token gap histogram, per task type, skills."""
    m = summary.metrics
    headline = [
        ["rows", f"{m['rescore/rows']:.0f}"],
        ["response tokens", f"{m['rescore/tokens']:.0f}"],
        ["gap mean (teacher - student)", f"{m['rescore/gap_mean']:.4f}"],
        ["gap > 0 share", f"{m['rescore/gap_positive_share']:.1%}"],
        ["retrieval hit rate (task-specific skill found)", f"{m['rescore/retrieval_hit_rate']:.1%}"],
        ["retrieval match rate (the task type's own skill)", f"{m['rescore/retrieval_match_rate']:.1%}"],
        ["tokens/s (student + teacher)", f"{m['rescore/tokens_per_s']:.0f}"],
    ] + [[k, v] for k, v in summary.info.items()]
    types = [
        [
            t,
            str(v["rows"]),
            str(v["tokens"]),
            f"{v['gap_mean']:.4f}",
            f"{v['gap_positive_share']:.1%}",
            f"{v['hit_rate']:.1%}",
        ]
        for t, v in summary.per_type.items()
    ]
    type_header = ["task type", "rows", "tokens", "gap mean", "gap > 0", "hit rate"]
    skills = [[s, str(v["rows"]), f"{v['gap_mean']:.4f}"] for s, v in summary.skills.items()]
    return Report(
        title="Rescore",
        sections=[
            Section("Summary", table=(["metric", "value"], headline)),
            Section("Gap per token", images=("gaps",)),
            Section("Per task type", table=(type_header, types)),
            Section("Skills used", table=(["skill", "rows", "gap mean"], skills))
            if skills
            else Section("Skills used", text="No skills were retrieved."),
        ],  # fmt: skip
        images={"gaps": ("gap histogram", histogram_png(summary.gaps))},
    )
