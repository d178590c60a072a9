"""Component ``register``: the round's adapter with its eval report, the base model's, and lineage as a new
registry version."""

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Model

from components import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def register(
    config_uri: str,
    rl_round: int,
    adapter: Input[Model],
    evaluation: Input[Artifact],
    base_evaluation: Input[Artifact],
    skills: Input[Dataset],
    rescored: Input[Dataset],
    trajectory_shards: list,
    kfp_run_id: str,
    trajectories: Input[Dataset] = None,
) -> str:
    from sdarflow.kfp_runtime import artifact_uri, kfp_actor, run_component

    return run_component(
        "register",
        config_uri,
        rl_round,
        actor=kfp_actor(kfp_run_id),
        adapter=artifact_uri(adapter),
        eval_report=artifact_uri(evaluation),
        base_eval_report=artifact_uri(base_evaluation),
        data=[artifact_uri(trajectories), *trajectory_shards, artifact_uri(skills), artifact_uri(rescored)],
    )
