"""The skill library format (the SDAR reference layout, so existing libraries import as they are).

A library is a folder::

    skill_mapping.json   {"skill_files": {name: file.md}, "task_to_skill": {task_type: name},
                          "task_keywords": {task_type: [keyword, ...]}, "evidence": {name: {...}}}
    general_skills.md    advice for every task (whatever its key: the reference says general or general_skills)
    <name>.md            one Markdown file per skill
    skill_stats.json     optional: the UCB bandit's per-skill reward statistics (``sdarflow.extensions.skill_bandit``)

Only ``skill_files`` (or, failing that, the ``*.md`` files) is needed. Order matters, as in the reference
(``SkillProvider`` in ZJU-REAL/SDAR ``verl/trainer/ppo/rlsd_utils.py``): ``full`` and ``keyword`` retrieval follow
``skill_files`` and ``task_keywords`` order, which loading and saving keep. The version is a hash of the content
(key-sorted mapping, skill texts, bandit statistics): libraries that differ only in order share a version.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from sdarflow.config import Checked, FileSchema, opt
from sdarflow.errors import StorageError
from sdarflow.storage import inside

log = logging.getLogger(__name__)

MAPPING = "skill_mapping.json"
# The SDAR reference's hand-written libraries shipped with sdarflow, one folder per env with a counterpart.
REFERENCE_LIBRARIES = Path(__file__).parent / "reference"
STATS = "skill_stats.json"
GENERAL = "general_skills"
GENERAL_FILE = "general_skills.md"
# Size limits on what a library holds, read whole: a skill goes into teacher prompts of a few thousand tokens (the
# reference's are under 2 KiB); the mapping and the bandit's statistics grow with task types and skills.
MAX_SKILL_BYTES = 64 * 1024
MAX_INDEX_BYTES = 4 * 1024 * 1024

# A step is a numbered ("1." / "1)") or bulleted ("-" / "*") Markdown list line.
STEP_RE = re.compile(r"^\s*(?:\d+[.)]|[-*])\s+(.+?)\s*$")


@dataclass
class Skill:
    name: str
    text: str
    task_types: list[str] = field(default_factory=list)
    keywords: list[str] = field(default_factory=list)
    # what it was kept on (``skills.extract``: support, followed, success_rate, lift) and its source (rule,
    # llm:<model>; absent for hand-written skills)
    evidence: dict = field(default_factory=dict)
    file: str = ""  # file name inside the library folder; "" = f"{name}.md"

    @property
    def filename(self) -> str:
        return self.file or f"{self.name}.md"

    @property
    def steps(self) -> list[str]:
        """The skill's list items, lower-cased and whitespace-normalized (empty for prose-only skills)."""
        steps = (normalize_step(m.group(1)) for line in self.text.splitlines() if (m := STEP_RE.match(line)))
        return [s for s in steps if s]

    @property
    def text_sha(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()[:12]


def normalize_step(step: str) -> str:
    return " ".join(step.lower().strip().rstrip(".").split())


@dataclass
class SkillLibrary:
    skills: dict[str, Skill] = field(default_factory=dict)
    # Per task type, the words that identify it in the rendered prompt (reference ``task_keywords``), in order.
    task_keywords: dict[str, list[str]] = field(default_factory=dict)
    # Bandit statistics carried across rounds (see sdarflow.skills.retrieve); {} when never updated.
    stats: dict = field(default_factory=dict)

    @property
    def general(self) -> Skill | None:
        return self.skills.get(GENERAL) or next(
            (s for s in self.skills.values() if s.filename == GENERAL_FILE), None
        )

    def is_general(self, skill: Skill) -> bool:
        general = self.general
        return general is not None and skill.name == general.name

    def for_task_type(self, task_type: str) -> Skill | None:
        """The first skill mapped to ``task_type`` (``task_to_skill``), None when it has none."""
        return next(iter(self.skills_for(task_type)), None)

    def skills_for(self, task_type: str) -> list[Skill]:
        """Every task-specific skill mapped to ``task_type``, in library order (the reference maps one)."""
        return [s for s in self.task_specific() if task_type in s.task_types]

    def task_specific(self) -> list[Skill]:
        """Every skill but the general one, in library order (``skill_files`` order as loaded): the order ``full``
        retrieval joins them in, as the reference's ``_build_all_skills_text`` does."""
        return [s for s in self.skills.values() if not self.is_general(s)]

    @property
    def version(self) -> str:
        blob = json.dumps({"mapping": self._mapping(), "stats": self.stats}, sort_keys=True) + "".join(
            self.skills[n].text for n in sorted(self.skills)
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def _mapping(self) -> dict:
        """``skill_mapping.json`` in the library's order (retrieval depends on it; see the module doc)."""
        to_skill: dict[str, list[str]] = {}
        for s in self.task_specific():
            for t in s.task_types:
                to_skill.setdefault(t, []).append(s.name)
        return {
            "skill_files": {n: s.filename for n, s in self.skills.items()},
            "task_to_skill": {t: names[0] if len(names) == 1 else names for t, names in to_skill.items()},
            # As the library holds them, nothing derived added: whether task_keywords is empty decides the path
            # keyword retrieval takes (prompt keywords or the row's task type).
            "task_keywords": {t: list(words) for t, words in self.task_keywords.items()},
            "evidence": {n: s.evidence for n, s in self.skills.items() if s.evidence},
        }

    def save(self, folder: str | Path) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        for skill in self.skills.values():
            path = inside(folder, skill.filename, f"skill library '{folder}' skill {skill.name!r}")
            path.parent.mkdir(parents=True, exist_ok=True)  # skill_files may name sub/x.md
            path.write_text(skill.text)
        # Not key-sorted: skill_files and task_keywords order is what full and keyword retrieval follow.
        (folder / MAPPING).write_text(json.dumps(self._mapping(), indent=2))
        if self.stats:
            (folder / STATS).write_text(json.dumps(self.stats, indent=2, sort_keys=True))
        return folder

    def publish(self, uri: str, overwrite: bool = False) -> str:
        """The library published at ``uri`` like any stage's, so extract-skills --previous accepts it."""
        from sdarflow import storage

        with tempfile.TemporaryDirectory() as folder:
            self.save(folder)
            storage.publish_dir(folder, uri, kind="skills", version=self.version, overwrite=overwrite)
        return uri

    @classmethod
    def load(cls, folder: str | Path) -> SkillLibrary:
        folder = Path(folder)
        mapping = _read_json(folder / MAPPING, folder, required=True)
        fix = "fix: write it as in the reference layout"
        _Mapping.check(mapping, f"skill library '{folder}': {MAPPING}", fix, StorageError)
        # skill_files, or every Markdown file when absent; general_skills.md is always included
        files = dict(mapping.get("skill_files") or {}) or {
            p.stem: p.name for p in sorted(folder.glob("*.md"))
        }
        if GENERAL_FILE not in files.values() and (folder / GENERAL_FILE).is_file():
            files[GENERAL] = GENERAL_FILE
        types: dict[str, list[str]] = {}
        for task_type, names in mapping.get("task_to_skill", {}).items():
            # The reference maps a task type to one skill; a list (several skills per type) is accepted too.
            for name in [names] if isinstance(names, str) else names:
                types.setdefault(name, []).append(task_type)
        task_keywords = {t: _keyword_list(v) for t, v in mapping.get("task_keywords", {}).items()}
        stats = _read_json(folder / STATS, folder, required=False)
        fix = f"fix: delete {STATS} to start the ucb statistics afresh"
        _Stats.check(stats, f"skill library '{folder}': {STATS}", fix, StorageError)
        lib = cls(task_keywords=task_keywords, stats=stats)
        for name, fname in files.items():
            path = inside(folder, fname, f"skill library '{folder}': {MAPPING} skill_files[{name!r}]")
            if not path.is_file():
                raise StorageError(
                    f"skill library '{folder}': {MAPPING} names '{fname}' for skill '{name}' but the file is "
                    f"missing; fix: add the file or remove the entry from skill_files"
                )
            ts = sorted(types.get(name, []))
            keywords = sorted({k for t in ts for k in task_keywords.get(t, [])})
            evidence = mapping.get("evidence", {}).get(name, {})
            if path.stat().st_size > MAX_SKILL_BYTES:
                raise StorageError(
                    f"skill library '{folder}': skill '{name}' ({fname}) is {path.stat().st_size} bytes, more than "
                    f"the {MAX_SKILL_BYTES} a skill may hold (each goes into a teacher prompt of a few thousand "
                    f"tokens); fix: shorten it to the rule it states"
                )
            try:
                text = path.read_text()
            except (OSError, UnicodeDecodeError) as err:
                raise StorageError(
                    f"skill library '{folder}': skill '{name}' ({fname}) is not readable UTF-8 text ({err}); "
                    f"fix: write skills as Markdown"
                ) from err
            lib.skills[name] = Skill(name, text, ts, keywords, evidence, fname)
        unknown = sorted(set(types) - set(lib.skills))
        if unknown:
            log.warning("skill library %s: task_to_skill names unknown skill(s) %s; ignored", folder, unknown)
        return lib


@dataclass
class _Mapping(FileSchema):
    """``skill_mapping.json`` (the reference layout, and our ``evidence``)."""

    skill_files: dict[str, str] = opt({}, "each skill's Markdown file")
    task_to_skill: dict[str, str | list[str]] = opt({}, "each task type's skill (or skills)")
    task_keywords: dict[str, str | list[str]] = opt(
        {}, "each task type's keywords (a list, or comma-separated)"
    )
    evidence: dict[str, dict[str, Any]] = opt({}, "what each skill was extracted from")


@dataclass
class _Arm(Checked):
    strict: ClassVar[bool] = True

    pulls: int = opt(0, "times the bandit chose the skill", ge=0)
    reward_sum: float = opt(0.0, "the rewards of those pulls, summed")


@dataclass
class _Stats(FileSchema):
    """``skill_stats.json`` in the layout ``extensions.skill_bandit`` writes: task type -> skill -> arm (they feed UCB
    scores)."""

    arms: dict[str, dict[str, _Arm]] = opt({}, "the bandit's arms by task type and skill")


def _read_json(path: Path, folder: Path, required: bool) -> dict:
    if not path.is_file() and not required:
        return {}
    if path.is_file() and path.stat().st_size > MAX_INDEX_BYTES:
        raise StorageError(
            f"skill library '{folder}': {path.name} is {path.stat().st_size} bytes, more than the {MAX_INDEX_BYTES} "
            f"an index of skills may hold; fix: regenerate the library with extract-skills"
        )
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as err:  # ValueError: not JSON, or not UTF-8
        raise StorageError(
            f"skill library '{folder}' has no readable {path.name} ({err}); fix: pass a library folder "
            f"(skill_mapping.json + Markdown files)"
        ) from err
    if not isinstance(data, dict):
        raise StorageError(
            f"skill library '{folder}': {path.name} must hold a JSON object; fix: write it as the library's "
            f"stage does (extract-skills)"
        )
    return data


def _keyword_list(value) -> list[str]:
    """Keywords as a list (the reference writes lists; a comma-separated string is accepted too), not lower-cased:
    the reference matches them as written against the lower-cased prompt, so a capitalized one never matches."""
    items = value.split(",") if isinstance(value, str) else list(value)
    return [str(k).strip() for k in items if str(k).strip()]


def reference_library(env: str) -> Path | None:
    """The folder of the SDAR reference's hand-written skill library for ``env``, where the env has a counterpart
    (search-qa: the reference's search skills; Apache-2.0, see the folder's NOTICE.md), else None."""
    folder = REFERENCE_LIBRARIES / env
    return folder if (folder / MAPPING).is_file() else None
