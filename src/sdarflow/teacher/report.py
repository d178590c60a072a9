"""What rescore says about the teacher signal. Sanity guards fail the stage with one clear message when the signal
is silently wrong (a degenerate teacher, a teacher identical to the student, general-only retrieval: the bug the
reference code shipped with); each has an override flag, and an overridden guard logs its message as a warning and
is listed in the stage's metrics. The metrics (teacher - student gap distribution overall and per task type,
retrieval, skills used, throughput) and the stage's report with a gap histogram, for the KFP UI.
"""

from __future__ import annotations

import logging
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from sdarflow.config import opt
from sdarflow.errors import SdarflowError
from sdarflow.report import Report, Section, png
from sdarflow.skills.library import SkillLibrary
from sdarflow.teacher.discrimination import DISCRIMINATION_HEADER

log = logging.getLogger(__name__)


class TeacherSanityError(SdarflowError):
    """The teacher signal is broken in a way that would train on noise without any error."""


class DegenerateTeacherError(TeacherSanityError):
    """Teacher log-probs are near-uniform or constant."""


class TeacherEqualsStudentError(TeacherSanityError):
    """Teacher and student log-probs agree on every token: the skills were not inserted."""


class GeneralOnlyRetrievalError(TeacherSanityError):
    """Task-specific skills exist but most rows got only the general skill."""


@dataclass
class GuardSettings:
    """The guards' thresholds and overrides. The rescore stage's config is a GuardSettings, so each default and
    help text is declared here once."""

    uniform_tol: float = opt(
        0.05, "guard: teacher mean log-prob within this many nats of -ln V is degenerate", ge=0
    )
    identical_tol: float = opt(
        1e-6, "guard: teacher == student when no token differs by more than this", ge=0
    )
    max_general_only_share: float = opt(
        0.5, "guard: largest share of rows allowed only general skills, [0, 1]", ge=0, le=1
    )
    allow_degenerate_teacher: bool = opt(
        False, "override: keep going with near-uniform/constant teacher log-probs"
    )
    allow_identical_teacher: bool = opt(
        False, "override: keep going when teacher equals student on every token"
    )
    allow_general_only: bool = opt(False, "override: keep going when most rows got only general skills")


def _fire(err: TeacherSanityError, allowed: bool, overridden: list[str]) -> None:
    if not allowed:
        raise err
    log.warning("guard overridden: %s", err)
    overridden.append(type(err).__name__)


def check_retrieval(
    lib: SkillLibrary, hits: list[bool], task_types: list[str], settings: GuardSettings, overridden: list[str]
) -> None:
    """General-only guard; runs before scoring, so a broken retrieval fails in seconds."""
    specific = lib.task_specific()
    if not specific or not hits:
        return
    missed = [t for t, h in zip(task_types, hits, strict=True) if not h]
    share = len(missed) / len(hits)
    if share <= settings.max_general_only_share:
        return
    mapped = sorted({t for s in specific for t in s.task_types})
    _fire(
        GeneralOnlyRetrievalError(
            f"{share:.0%} of rows ({len(missed)}/{len(hits)}) got only general skills although the library has "
            f"{len(specific)} task-specific skill(s) (limit {settings.max_general_only_share:.0%}); task types "
            f"without a skill: {sorted(set(missed))}, library maps {mapped}; fix: add skills (or task_keywords) "
            f"for those task types, use --retrieval full, or pass --allow-general-only"
        ),
        settings.allow_general_only,
        overridden,
    )


def check_scores(
    old: list[list[float]],
    teacher: list[list[float]],
    vocab_size: int,
    unchanged_prompts: int,
    settings: GuardSettings,
    overridden: list[str],
) -> None:
    """Degenerate-teacher and teacher-equals-student guards on the scored tokens."""
    flat = [t for q in teacher for t in q]
    if not flat:
        return
    uniform = -math.log(vocab_size)
    mean = sum(flat) / len(flat)
    degenerate = ""
    if abs(mean - uniform) < settings.uniform_tol:
        degenerate = (
            f"teacher log-probs are near-uniform: mean {mean:.4f} vs -ln V = {uniform:.4f} (V = {vocab_size}) "
            f"over {len(flat)} tokens, within {settings.uniform_tol} nats; the teacher forward is broken "
            f"(zeroed or garbage logits) or the model is untrained; fix: check --model and --adapter, or pass "
            f"--allow-degenerate-teacher"
        )
    elif len(flat) > 1 and max(flat) - min(flat) < 1e-6:
        degenerate = (
            f"teacher log-probs are constant ({flat[0]:.4f} on all {len(flat)} tokens); the teacher forward "
            f"ignores its input; fix: check --model and --adapter, or pass --allow-degenerate-teacher"
        )
    if degenerate:
        _fire(DegenerateTeacherError(degenerate), settings.allow_degenerate_teacher, overridden)
    diff = max(abs(q - s) for o, t in zip(old, teacher, strict=True) for s, q in zip(o, t, strict=True))
    if diff <= settings.identical_tol:
        _fire(
            TeacherEqualsStudentError(
                f"teacher log-probs equal the student's on all {len(flat)} tokens (max |diff| {diff:.1e} <= "
                f"{settings.identical_tol}); {unchanged_prompts} of {len(teacher)} teacher prompts are identical to "
                f"the student prompt, so the skills did not reach the teacher; fix: check the library (--skills: is "
                f"it empty?) and --skill-place, or pass --allow-identical-teacher"
            ),
            settings.allow_identical_teacher,
            overridden,
        )


@dataclass
class RescoreSummary:
    metrics: dict[str, float]
    per_type: dict[str, dict[str, float]]  # task type -> rows, tokens, gap_mean, gap_positive_share, hit_rate
    skills: dict[str, dict[str, float]]  # skill -> rows, gap_mean
    gaps: list[float] = field(repr=False)
    info: dict[str, str] = field(default_factory=dict)  # strategy, library version, batching, ...
    discrimination: list[list[str]] = field(default_factory=list)  # teacher.discrimination's report rows


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
            Section(
                "Teacher discrimination (turn means; 95% intervals resample tasks)",
                table=(DISCRIMINATION_HEADER, summary.discrimination),
            ),
            Section("Per task type", table=(type_header, types)),
            Section("Skills used", table=(["skill", "rows", "gap mean"], skills))
            if skills
            else Section("Skills used", text="No skills were retrieved."),
        ],  # fmt: skip
        images={"gaps": ("gap histogram", histogram_png(summary.gaps))},
    )
