"""One RL round outside KFP: generate -> extract-skills -> rescore -> train, each stage with the config the training
pipeline builds for it (``pipeline_config.stage_config``). The study's cells and the benches play their rounds
here, so a round played anywhere is the DAG's round: the same settings, the round's own tasks (round r plays the
split's next ``tasks``), outputs in the run's folder."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from sdarflow.pipeline_config import PipelineConfig, stage_config


@dataclass
class Carry:
    """What a round continues from; empty: the run's start adapter (or a new LoRA) and its seed skills."""

    adapter: str = ""
    skills: str = ""
    rescored: str = ""  # the previous round's rescored rows: evidence the extractor weighs rules with


@dataclass
class Round:
    """One round's stage results (``{"uri", "metrics"}`` each) and its wall time per stage."""

    generate: dict
    extract: dict
    rescore: dict
    train: dict
    seconds: dict[str, float] = field(default_factory=dict)

    def carry(self) -> Carry:
        return Carry(self.train["uri"], self.extract["uri"], self.rescore["uri"])


def run_round(
    pc: PipelineConfig,
    r: int,
    carry: Carry | None = None,
    watch: Callable[[str], AbstractContextManager] | None = None,
) -> Round:
    """Round ``r`` of the run ``pc`` from ``carry`` (round 0: ``Carry()``); ``watch(stage)``, when given, is a
    context around each stage (the GPU check's memory probe)."""
    from sdarflow.stages import extract_skills, generate, rescore, train

    c = carry or Carry()
    seconds: dict[str, float] = {}

    def timed(stage: str, fn, **io) -> dict:
        cfg = stage_config(pc, stage, r, **io)
        with watch(stage) if watch else contextlib.nullcontext():
            t0 = time.perf_counter()
            out = fn(cfg)
            seconds[stage] = time.perf_counter() - t0
        return out

    gen = timed("generate", generate.run, adapter=c.adapter)
    sk = timed(
        "extract-skills",
        extract_skills.run,
        input=[gen["uri"]],
        previous=c.skills,
        rescored=[c.rescored],
    )
    rs = timed("rescore", rescore.run, input=[gen["uri"]], skills=sk["uri"], adapter=c.adapter)
    tr = timed("train", train.run, input=[rs["uri"]], adapter=c.adapter)
    return Round(gen, sk, rs, tr, seconds)
