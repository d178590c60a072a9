"""Stage ``extract-skills``: a versioned skill library mined from a round's trajectories, merged into the previous
library (or a seed library) so task types not solved this round keep their skills."""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass

from sdarflow import storage
from sdarflow.config import StageConfig, opt
from sdarflow.schema import TRAJECTORY_SCHEMA
from sdarflow.skills.extract import episodes_from_rows, extract_skills, merge
from sdarflow.skills.library import SkillLibrary
from sdarflow.stages.common import local_artifact, require

log = logging.getLogger(__name__)


@dataclass
class ExtractSkillsConfig(StageConfig):
    stage = "extract-skills"
    input: list[str] = opt([], "trajectory dataset URI(s) (the union of a round's shards)", io=True)
    output: str = opt("", "output skill library URI", io=True)
    previous: str = opt("", "previous library (published URI or folder) to merge into", io=True)
    min_support: int = opt(2, "successful episodes a task type needs before it gets a skill")
    min_win_share: float = opt(0.5, "a step is kept if at least this share of successes contain it")
    overwrite: bool = opt(False, "replace an existing library at --output", io=True)


def run(cfg: ExtractSkillsConfig) -> dict:
    require("extract-skills", input=cfg.input, output=cfg.output)
    table = storage.read_table(cfg.input, kind="trajectories", schema=TRAJECTORY_SCHEMA)
    cols = ["task_id", "task_type", "traj_id", "turn", "response_text", "format_ok", "success"]
    episodes = episodes_from_rows(table.select(cols).to_pylist())
    previous_dir = local_artifact(cfg.previous, "skills")
    previous = SkillLibrary.load(previous_dir) if previous_dir else None
    new = extract_skills(episodes, min_support=cfg.min_support, min_win_share=cfg.min_win_share)
    lib = merge(previous, new)
    with tempfile.TemporaryDirectory() as tmp:
        lib.save(tmp)
        storage.publish_dir(
            tmp,
            cfg.output,
            kind="skills",
            overwrite=cfg.overwrite,
            version=lib.version,
            config_hash=cfg.config_hash(),
            inputs=list(cfg.input) + ([cfg.previous] if cfg.previous else []),
            new_skills=sorted(new.skills),
        )
    log.info(
        "extract-skills: %d episodes -> %d new skills, library %s with %d skills",
        len(episodes),
        len(new.skills),
        lib.version,
        len(lib.skills),
    )
    return {
        "uri": cfg.output,
        "version": lib.version,
        "skills": sorted(lib.skills),
        "new_skills": sorted(new.skills),
    }
