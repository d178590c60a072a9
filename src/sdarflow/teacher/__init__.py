"""Teacher rescoring (``rescore``), and its sanity guards, metrics and report (``report``).

The teacher's weights are chosen by name (``rescore --teacher``): a factory ``(student model, its adapter folder) ->
context manager`` inside which the model scores as the teacher. ``current`` is SDAR's (the student's own weights);
research options are named as ``"module:function"`` and imported on first use.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager

from sdarflow.names import NameRegistry

# rescore --teacher-context: what the teacher knows that the student does not. skills: SDAR's retrieved skills;
# solution: the task's gold solution (sdarflow.teacher.solution); synthetic: the machinery's control
# (sdarflow.teacher.synthetic). The last two read what only training may see: train rows only, never production.
TEACHER_CONTEXTS = ("skills", "solution", "synthetic")
PRIVILEGED_CONTEXTS = ("solution", "synthetic")
UNKNOWN_CONTEXT = (
    "unknown"  # data whose manifest does not name its teacher (unpublished, or made before it did)
)


def controls(contexts) -> list[str]:
    """The contexts among ``contexts`` that make what they teach a control, not a release (production refuses it)."""
    return [c for c in contexts or () if c in PRIVILEGED_CONTEXTS]


TeacherWeights = Callable[[object, "str | None"], AbstractContextManager]
TEACHER_WEIGHTS: NameRegistry[TeacherWeights] = NameRegistry("teacher")
TEACHER_WEIGHTS.register("current")(lambda model, adapter: contextlib.nullcontext())
TEACHER_WEIGHTS.add_lazy("ema", "sdarflow.extensions.ema:ema_teacher")
