"""The skill library format (the SDAR reference layout, so existing libraries import as they are).

A library is a folder::

    skill_mapping.json   {"skill_files": {name: file.md}, "task_to_skill": {task_type: name},
                          "task_keywords": {task_type: [keyword, ...]}, "evidence": {name: {...}}}
    general_skills.md    advice for every task
    <name>.md            one Markdown file per skill

The library version is a hash of its content, so the same skills always have the same version.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from sdarflow.errors import StorageError

MAPPING = "skill_mapping.json"
GENERAL = "general_skills"


@dataclass
class Skill:
    name: str
    text: str
    task_types: list[str] = field(default_factory=list)
    keywords: list[str] = field(default_factory=list)
    # support: successful episodes that followed it; success_rate: share of episodes following it that succeeded.
    evidence: dict = field(default_factory=dict)


@dataclass
class SkillLibrary:
    skills: dict[str, Skill] = field(default_factory=dict)

    @property
    def general(self) -> Skill | None:
        return self.skills.get(GENERAL)

    def for_task_type(self, task_type: str) -> Skill | None:
        return next((s for s in self.skills.values() if task_type in s.task_types), None)

    def task_specific(self) -> list[Skill]:
        return [s for s in self.skills.values() if s.name != GENERAL]

    @property
    def version(self) -> str:
        blob = json.dumps(self._mapping(), sort_keys=True) + "".join(
            self.skills[n].text for n in sorted(self.skills)
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def _mapping(self) -> dict:
        return {
            "skill_files": {n: f"{n}.md" for n in sorted(self.skills)},
            "task_to_skill": {t: s.name for s in self.skills.values() for t in s.task_types},
            "task_keywords": {t: s.keywords for s in self.skills.values() for t in s.task_types},
            "evidence": {n: s.evidence for n, s in sorted(self.skills.items()) if s.evidence},
        }

    def save(self, folder: str | Path) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        for skill in self.skills.values():
            (folder / f"{skill.name}.md").write_text(skill.text)
        (folder / MAPPING).write_text(json.dumps(self._mapping(), indent=2, sort_keys=True))
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> SkillLibrary:
        folder = Path(folder)
        try:
            mapping = json.loads((folder / MAPPING).read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise StorageError(
                f"skill library '{folder}' has no readable {MAPPING} ({err}); fix: pass a library folder"
            ) from err
        files = mapping.get("skill_files", {})
        types: dict[str, list[str]] = {}
        for task_type, name in mapping.get("task_to_skill", {}).items():
            types.setdefault(name, []).append(task_type)
        lib = cls()
        for name, fname in files.items():
            path = folder / fname
            if not path.is_file():
                raise StorageError(f"skill library '{folder}': {MAPPING} names '{fname}' which is missing")
            ts = sorted(types.get(name, []))
            keywords = sorted({k for t in ts for k in mapping.get("task_keywords", {}).get(t, [])})
            evidence = mapping.get("evidence", {}).get(name, {})
            lib.skills[name] = Skill(name, path.read_text(), ts, keywords, evidence)
        return lib
