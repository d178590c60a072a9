"""Pipeline stages: one module per stage, each with its config class and ``run(config) -> dict``.

The CLI and the KFP components both call these ``run`` functions; this is the only place stages are defined.
"""

import importlib

STAGES: dict[str, str] = {
    "generate": "sdarflow.stages.generate",
    "extract-skills": "sdarflow.stages.extract_skills",
    "rescore": "sdarflow.stages.rescore",
    "train": "sdarflow.stages.train",
    "evaluate": "sdarflow.stages.evaluate",
    "register": "sdarflow.stages.register",
}


def config_class(stage: str) -> type:
    """The ``StageConfig`` subclass of ``stage`` (importing its module: most bring torch)."""
    from sdarflow.config import StageConfig

    module = importlib.import_module(STAGES[stage])
    return next(
        v
        for v in vars(module).values()
        if isinstance(v, type) and issubclass(v, StageConfig) and v is not StageConfig
    )
