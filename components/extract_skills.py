"""Component ``extract-skills``: the round's skill library, from one trajectory dataset or the union of shards."""

from kfp import dsl

from components import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def extract_skills(
    config_uri: str, rl_round: int, trajectories: str, trajectory_shards: list, previous: str, rescored: str
) -> str:
    from sdarflow.pipeline_config import run_component

    return run_component(
        "extract-skills",
        config_uri,
        rl_round,
        input=[trajectories, *trajectory_shards],
        previous=previous,
        rescored=[rescored] if rescored else [],
    )
