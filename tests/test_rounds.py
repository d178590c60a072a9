"""``sdarflow.rounds``: one RL round outside KFP is the pipeline's round: the stage configs ``stage_config``
builds, outputs in the run's folder, each round on the split's next tasks, continuing the last round's adapter and
skill library."""

from __future__ import annotations

import contextlib

from sdarflow import storage
from sdarflow.pipeline_config import PipelineConfig, stage_uri
from sdarflow.rounds import Carry, run_round
from sdarflow.schema import TRAJECTORY_SCHEMA
from sdarflow.train.warmstart import SEED_SKILLS


def _tasks(gen: dict) -> set[str]:
    rows = storage.read_table(gen["uri"], kind="trajectories", schema=TRAJECTORY_SCHEMA)
    return set(rows.column("task_id").to_pylist())


def test_rounds_play_new_tasks_and_continue_the_last_adapter(tiny_model, tmp_path):
    pc = PipelineConfig(
        storage=str(tmp_path / "store"), base_model=str(tiny_model), run_id="r", seed=3,
        seed_skills=str(tiny_model / SEED_SKILLS), tasks=2, group_size=2, max_turns=2,
        stage_settings={"train": {"mini_batches": 1}},
    )  # fmt: skip
    seen: list[str] = []

    @contextlib.contextmanager
    def watch(stage: str):
        seen.append(stage)
        yield

    first = run_round(pc, 0, watch=watch)
    assert seen == ["generate", "extract-skills", "rescore", "train"] == list(first.seconds)
    stages = zip(seen, (first.generate, first.extract, first.rescore, first.train), strict=True)
    assert all(out["uri"] == stage_uri(pc.storage, "r", 0, stage) for stage, out in stages)
    assert first.carry() == Carry(first.train["uri"], first.extract["uri"], first.rescore["uri"])

    second = run_round(pc, 1, first.carry())
    assert not _tasks(first.generate) & _tasks(second.generate)  # the split's next tasks
    made = storage.read_manifest(second.train["uri"], "adapter")
    assert first.train["uri"] in made["inputs"]  # continued from round 0's adapter
    assert first.extract["uri"] in storage.read_manifest(second.extract["uri"], "skills")["inputs"]
