"""Pipeline stages: one module per stage, each exporting ``Config`` (its ``StageConfig`` subclass) and
``run(config) -> dict``, which the CLI and the KFP components both call. A stage module is imported on first use
(most bring torch)."""

from __future__ import annotations

from types import ModuleType

from sdarflow.names import NameRegistry

STAGES: NameRegistry[ModuleType] = NameRegistry("stage")
for _stage in ("generate", "extract-skills", "rescore", "train", "evaluate", "register"):
    STAGES.add_lazy(_stage, f"sdarflow.stages.{_stage.replace('-', '_')}")  # extract-skills: extract_skills


def config_class(stage: str) -> type:
    """The ``Config`` class of ``stage`` (importing its module)."""
    return STAGES.get(stage).Config
