"""Sanity guards on rescoring: fail the stage with one clear message when the teacher signal is silently wrong
(a degenerate teacher, a teacher identical to the student, general-only retrieval: the bug the reference code
shipped with). Each has an override flag; an overridden guard logs its message as a warning and is listed in the
stage's metrics.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from sdarflow.config import opt
from sdarflow.errors import SdarflowError
from sdarflow.skills.library import SkillLibrary

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
