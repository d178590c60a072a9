"""Where RL starts from: the seed skill library and the adapter round 0 continues from, for the demo and the study.

A model sdarflow built brings its seed library (its ``seed_skills`` folder) and was trained on expert walkthroughs
when it was built. A pretrained model brings neither: it gets the SDAR reference's hand-written library where the
env has one (else one mined from expert walkthroughs), and, when its preset asks for one (``SIZES[preset]
["warm_start"]``), an SFT warm start on expert walkthroughs in its own prompt format.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sdarflow import stopping, storage
from sdarflow.errors import SdarflowError
from sdarflow.skills.library import SkillLibrary, reference_library
from sdarflow.train.warmstart import SEED_SKILLS, expert_steps, seed_library


def default_preset(base: Path) -> str:
    """``demo`` for a model sdarflow built, ``pretrained`` (its warm start) for any other (prompt format auto)."""
    from sdarflow.models.policy import load_tokenizer
    from sdarflow.rollout.engine import prompt_format

    return "demo" if prompt_format("auto", load_tokenizer(str(base))) == "command" else "pretrained"


def start_point(base: Path, sizes: dict, env: str, folder: str, run_id: str) -> dict[str, str]:
    """``{"seed_skills": URI, "start_adapter": URI or ""}`` for ``base`` under the preset ``sizes``; what is made
    for it (a seed library, walkthroughs, a warm-start adapter) is published under ``folder``."""
    own = base / SEED_SKILLS
    # the walkthroughs the warm start trains on, else those a tiny model is built from
    tasks = sizes["warm_start"]["tasks"] if "warm_start" in sizes else sizes["model"].tasks
    seed_skills = (
        str(own) if own.is_dir() else seed_skills_of(env, tasks, storage.join(folder, "seed-skills"))
    )
    adapter = ""
    if "warm_start" in sizes:
        adapter = warm_start(base, env, tasks, sizes["warm_start"]["train"], folder, run_id)
    return {"seed_skills": seed_skills, "start_adapter": adapter}


def makes_anything(base: Path, sizes: dict) -> bool:
    """Whether ``start_point`` publishes anything for ``base``: a seed library it lacks, or a warm start."""
    return not (base / SEED_SKILLS).is_dir() or "warm_start" in sizes


def seed_skills_of(env: str, tasks: int, uri: str) -> str:
    """The seed skill library, published at ``uri``, for a base model that brings none: the SDAR reference's where
    ``env`` has one, else the one mined from ``tasks`` expert walkthroughs, as the tiny model's is."""
    if (folder := reference_library(env)) is not None:
        return SkillLibrary.load(folder).publish(uri)
    _, episodes = expert_steps(env, tasks)
    return seed_library(episodes).publish(uri)


def warm_start(base: Path, env: str, tasks: int, train_settings: dict, folder: str, run_id: str) -> str:
    """The SFT warm start a pretrained base gets before RL: ``train --mode sft`` on ``tasks`` expert walkthroughs
    (``generate --policy expert``) in its prompt format; the adapter's URI (``folder``/warm-start)."""
    from sdarflow.stages import generate

    walkthroughs = generate.run(
        generate.GenerateConfig(
            model=str(base), policy="expert", env=env, tasks=tasks, run_id=run_id,
            output=storage.join(folder, "warm-start-walkthroughs"),
        )
    )  # fmt: skip
    # In a child process: the memory the SFT peaks at (~10 GB for a 135M model's 49k-token vocabulary) is not
    # returned to the system while this process lives, and the RL train task needs as much again (the demo's train
    # task was OOM-killed on a 24 GB machine when the warm start ran in the demo's process).
    output = storage.join(folder, "warm-start")
    settings = {
        "mode": "sft",
        "model": base,
        "input": walkthroughs["uri"],
        "output": output,
        **train_settings,
    }
    argv = ["train", *(f"--{k.replace('_', '-')}={v}" for k, v in settings.items())]
    child = stopping.run_child(
        [sys.executable, "-m", "sdarflow.cli", *argv], stdout=subprocess.PIPE, text=True
    )
    if child.returncode != 0:
        raise SdarflowError(f"the warm start failed (exit {child.returncode}); fix: see its error above")
    return output
