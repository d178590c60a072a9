"""The extract-skills stage's report: the library a round ends with, skill by skill (task types, steps, the
evidence it was kept on, whether this round added or changed it), what was rejected, and the skills' text (what
the teacher reads as privileged context)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sdarflow.report import Report, Section
from sdarflow.skills.accuracy import VERDICTS
from sdarflow.skills.library import SkillLibrary


def _shown(value) -> str:
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, list) and len(value) == 2 and all(isinstance(x, float) for x in value):
        return f"[{value[0]:.2f}, {value[1]:.2f}]"  # an interval
    return str(value)


def _evidence(evidence: Mapping) -> str:
    """The evidence's figures as one line (the rules, and what a side says, are shown on their own)."""
    parts = [
        f"{k} {_shown(v)}"
        for k, v in sorted(evidence.items())
        if v is not None and k not in ("rules", "action", "steps")
    ]
    return ", ".join(parts) or "-"


def _side(evidence: Mapping) -> str:
    said = evidence["action"] if "action" in evidence else "; ".join(evidence.get("steps", []))
    return f"{said} ({_evidence(evidence)})"


def _provenance(lib: SkillLibrary, decisions: Sequence[Mapping]) -> list[Section]:
    """Each direction rule with its provenance, and the contested replacements with both sides' evidence."""
    rules = [
        [name, f"{d}: {r['action']}", _evidence(r)]
        for name, s in lib.skills.items()
        for d, r in s.evidence.get("rules", {}).items()
    ]
    contested = [
        [d["skill"], d["rule"], "replaced" if d["replaced"] else "kept previous", _side(d["previous"]), _side(d["new"])]
        for d in decisions
    ]  # fmt: skip
    title = (
        "Contested replacements (the new side must beat the previous: at least min_support solved tasks and a "
        "success-rate interval wholly above)"
    )
    return [
        Section("Direction rules and their provenance", table=(["skill", "rule", "evidence"], rules)),
        Section(title, table=(["skill", "rule", "decision", "previous", "new"], contested)),
    ]


def library_report(
    lib: SkillLibrary,
    previous: SkillLibrary | None,
    new: Sequence[str],
    rejected: Mapping[str, str],
    title: str,
    accuracy: Mapping | None = None,
    decisions: Sequence[Mapping] = (),
) -> Report:
    """Every skill of ``lib``: added (not in ``previous``), changed from it, or kept; ``new`` are the skills this
    round's episodes produced (merged into the library); each direction rule with its provenance; the contested
    replacements (``sdarflow.skills.merge``), made or refused, with both sides' evidence; ``accuracy``: the library
    scored against the env (``sdarflow.skills.accuracy.score_library``), shown per skill."""

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
        *_provenance(lib, decisions),
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
