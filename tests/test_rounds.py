"""``sdarflow.rounds``: one RL round outside KFP is the pipeline's round: the stage configs ``stage_config``
builds, outputs in the run's folder, each round on the split's next tasks, continuing the last round's adapter and
skill library."""

from __future__ import annotations

import contextlib

import pytest

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


def test_full_fine_tune_rounds_continue_the_last_model_with_the_kl_reference_on_the_base(
    tiny_model, tmp_path
):
    """--lora-rank 0: round 1 plays, rescores and trains the model round 0 fine-tuned (in the adapter's place),
    and its KL reference stays the base model: the rescored reference log-probs are the base's, not the policy's."""
    from sdarflow.models import load_policy
    from sdarflow.models.forward import make_batch, response_logprobs
    from sdarflow.schema import RESCORED_SCHEMA

    pc = PipelineConfig(
        storage=str(tmp_path / "store"), base_model=str(tiny_model), run_id="full", seed=3, lora_rank=0,
        seed_skills=str(tiny_model / SEED_SKILLS), tasks=2, group_size=2, max_turns=2,
        stage_settings={"train": {"mini_batches": 1, "lr": 5e-2}},
    )  # fmt: skip
    first = run_round(pc, 0)
    assert storage.read_manifest(first.train["uri"])["kind"] == "model"
    second = run_round(pc, 1, first.carry())
    made = storage.read_manifest(second.train["uri"], "model")
    assert first.train["uri"] in made["inputs"]  # continued from round 0's model
    rows = storage.read_table(second.rescore["uri"], kind="rescored", schema=RESCORED_SCHEMA).to_pylist()
    row = next(r for r in rows if r["response_token_ids"])
    base = load_policy(str(tiny_model)).model
    batch = make_batch([row["prompt_token_ids"]], [row["response_token_ids"]], 0)
    expected = response_logprobs(base, batch)[0][0].tolist()
    assert row["ref_logprobs"] == pytest.approx(expected, abs=1e-4)
    assert max(abs(a - b) for a, b in zip(row["old_logprobs"], row["ref_logprobs"], strict=True)) > 1e-3
