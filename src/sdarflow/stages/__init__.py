"""Pipeline stages: one module per stage, each with its config class and ``run(config) -> dict``.

The CLI and the KFP components both call these ``run`` functions; this is the only place stages are defined.
"""

STAGES: dict[str, str] = {
    "generate": "sdarflow.stages.generate",
    "extract-skills": "sdarflow.stages.extract_skills",
    "rescore": "sdarflow.stages.rescore",
    "train": "sdarflow.stages.train",
    "evaluate": "sdarflow.stages.evaluate",
    "register": "sdarflow.stages.register",
}
