"""Component ``extract-skills``: the round's skill library."""

from kfp import dsl

from components import IMAGE


@dsl.component(base_image=IMAGE)
def extract_skills(config_uri: str, rl_round: int, trajectories: str, previous: str) -> str:
    from sdarflow.pipeline_config import run_component

    return run_component("extract-skills", config_uri, rl_round, input=[trajectories], previous=previous)
