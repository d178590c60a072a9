"""Component ``register``: the adapter as a new registry version with its report and lineage."""

from kfp import dsl

from components import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def register(
    config_uri: str,
    rl_round: int,
    adapter: str,
    eval_report: str,
    trajectories: str,
    trajectory_shards: list,
    skills: str,
    rescored: str,
    kfp_run_id: str,
) -> str:
    from sdarflow.pipeline_config import kfp_actor, run_component

    return run_component(
        "register",
        config_uri,
        rl_round,
        actor=kfp_actor(kfp_run_id),
        adapter=adapter,
        eval_report=eval_report,
        data=[trajectories, *trajectory_shards, skills, rescored],
    )
