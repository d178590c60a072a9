"""Where things live in a registry, and validation of the names that become parts of those paths.

::

    <registry>/<name>/claims/<v>.json          marker created exclusively to claim version number v
    <registry>/<name>/versions/<v>/            the immutable version: adapter files (PEFT), eval_report.json,
                                               base_eval_report.json (when given), lineage.json,
                                               _manifest.json (sha256 of each, written last)
    <registry>/<name>/aliases.json             stage -> version, with history (compare-and-swap updated)
    <registry>/<name>/gate_policy.json         the promotion gate's thresholds per stage (compare-and-swap)
    <registry>/<name>/audit/<utc>-<uuid>.json  one event per object: appends never race

Versions are integers in the API and in JSON, and their decimal string in paths.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sdarflow import storage
from sdarflow.defaults import GATE_POLICY, REGISTRY_AUDIT, REGISTRY_CLAIMS, RELEASE_STAGES
from sdarflow.errors import ConfigError

NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,62}$"
_NAME_RE = re.compile(NAME_PATTERN)

EVAL_REPORT = "eval_report.json"
BASE_EVAL_REPORT = "base_eval_report.json"  # the base model's evaluation on the same tasks, for the gate
LINEAGE = "lineage.json"
MODEL_CARD = "README.md"  # written by the registry from lineage and evaluation (registry.intake.model_card)
ALIASES = "aliases.json"
# Files the registry writes into a version folder itself; an adapter folder must not bring its own.
RESERVED_FILES: tuple[str, ...] = (EVAL_REPORT, BASE_EVAL_REPORT, LINEAGE, storage.MANIFEST)


def validate_name(name: str) -> str:
    """Refuse names that are not a single safe path component (no ``..``, no slashes, lower case)."""
    if not isinstance(name, str) or not _NAME_RE.match(name) or ".." in name:
        raise ConfigError(
            f"bad adapter name {name!r}: names must match {NAME_PATTERN} and contain no '..' "
            f"(lower-case letters, digits, '.', '_', '-'; no slashes); fix: pick a name like 'sdar-qwen-0.5b'"
        )
    return name


def validate_stage(stage: str) -> str:
    if stage not in RELEASE_STAGES:
        raise ConfigError(
            f"unknown stage {stage!r}; allowed: {', '.join(RELEASE_STAGES)}; fix: pass --stage production"
        )
    return stage


# No registry holds a million versions of one adapter: a larger number is a stray or hostile file name, which must
# not move the next version there.
MAX_VERSION = 999_999


def parse_version(value: int | str) -> int | None:
    """An explicit version number (``3``, ``"3"``, ``"v3"``, at most :data:`MAX_VERSION`), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 1 <= value <= MAX_VERSION else None
    text = str(value).strip().lower().removeprefix("v")
    if not (text.isascii() and text.isdigit() and len(text) <= len(str(MAX_VERSION))):
        return None
    return int(text) if 1 <= int(text) <= MAX_VERSION else None


@dataclass(frozen=True)
class Layout:
    """Paths of one adapter name inside a registry root URI."""

    root: str
    name: str

    def __post_init__(self) -> None:
        validate_name(self.name)

    @property
    def base(self) -> str:
        return storage.join(self.root, self.name)

    @property
    def claims(self) -> str:
        return storage.join(self.base, REGISTRY_CLAIMS)

    @property
    def versions(self) -> str:
        return storage.join(self.base, "versions")

    @property
    def aliases(self) -> str:
        return storage.join(self.base, ALIASES)

    @property
    def gate_policy(self) -> str:
        return storage.join(self.base, GATE_POLICY)

    @property
    def audit(self) -> str:
        return storage.join(self.base, REGISTRY_AUDIT)

    def claim(self, version: int) -> str:
        return storage.join(self.claims, f"{version}.json")

    def version(self, version: int) -> str:
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:  # it becomes a path
            raise ConfigError(
                f"bad version {version!r} of '{self.name}': versions are integers >= 1; fix: pass a version number, "
                f"e.g. 3"
            )
        uri = storage.join(self.versions, str(version))
        if not uri.startswith("s3://"):  # a version folder linked out of the registry is not the registry's
            storage.inside(
                storage.resolve(self.root).path, f"{self.name}/versions/{version}", "registry version"
            )
        return uri
