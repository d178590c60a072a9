"""The extract-skills stage's report: the library a round ends with, skill by skill (task types, steps, the
evidence it was kept on, whether this round added or changed it), what was rejected, and the skills' text (what
the teacher reads as privileged context)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sdarflow.report import Report, Section
from sdarflow.skills.accuracy import VERDICTS
from sdarflow.skills.library import SkillLibrary


def _evidence(evidence: Mapping) -> str:
    parts = [
        f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
        for k, v in sorted(evidence.items())
        if v is not None
    ]
    return ", ".join(parts) or "-"


def library_report(
    lib: SkillLibrary,
    previous: SkillLibrary | None,
    new: Sequence[str],
    rejected: Mapping[str, str],
    title: str,
    accuracy: Mapping | None = None,
) -> Report:
    """Every skill of ``lib``: added (not in ``previous``), changed from it, or kept; ``new`` are the skills this
    round's episodes produced (merged into the library); ``accuracy``: the library scored against the env
    (``sdarflow.skills.accuracy.score_library``), shown per skill."""

    def status(name: str) -> str:
        if previous is None or name not in previous.skills:
            return "added"
        return "changed" if previous.skills[name].text != lib.skills[name].text else "kept"

    rows = [
        [name, ", ".join(s.task_types) or ("all (general)" if lib.is_general(s) else "-"), str(len(s.steps)),
         status(name), _evidence(s.evidence)]
        for name, s in lib.skills.items()
    ]  # fmt: skip
    sections = [
        Section("Skills", table=(["skill", "task types", "steps", "this round", "evidence"], rows)),
        Section("Rejected this round (LLM-written skills, with why)", items=sorted(rejected.items())),
    ]
    if accuracy is not None:
        scored = [
            [name, *("; ".join(s[v]) or "-" for v in VERDICTS)] for name, s in accuracy["skills"].items()
        ]
        totals = ", ".join(f"{accuracy[v]} {v.replace('_', '-')}" for v in VERDICTS)
        sections.append(Section(f"Accuracy against the env: {totals}", table=(["skill", *VERDICTS], scored)))
    sections += [
        Section(f"Skill: {name}", text=" / ".join(s.text.splitlines())) for name, s in lib.skills.items()
    ]
    return Report(
        title=title,
        subtitle=f"library {lib.version}: {len(lib.skills)} skills, {len(new)} new this round",
        sections=sections,
    )
