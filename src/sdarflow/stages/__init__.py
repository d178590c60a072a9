"""Pipeline stages: one module per stage, each exporting ``Config`` (its ``StageConfig`` subclass) and
``run(config) -> dict``.

The CLI and the KFP components both call these ``run`` functions; this is the only place stages are defined. A
stage module is imported on first use (most bring torch).
"""

from __future__ import annotations

from types import ModuleType

from sdarflow.names import NameRegistry


def module_name(stage: str) -> str:
    """The module of ``stage``: ``extract-skills`` is ``sdarflow.stages.extract_skills``."""
    return f"sdarflow.stages.{stage.replace('-', '_')}"


STAGES: NameRegistry[ModuleType] = NameRegistry("stage")
for _stage in ("generate", "extract-skills", "rescore", "train", "evaluate", "register"):
    STAGES.add_lazy(_stage, module_name(_stage))


def config_class(stage: str) -> type:
    """The ``Config`` class of ``stage`` (importing its module)."""
    return STAGES.get(stage).Config
