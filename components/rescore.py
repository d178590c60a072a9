"""Component ``rescore``: student and teacher log-probs."""

from kfp import dsl
from kfp.dsl import Metrics, Output

from components import IMAGE


@dsl.component(base_image=IMAGE)
def rescore(
    config_uri: str, rl_round: int, trajectories: str, skills: str, adapter: str, metrics: Output[Metrics]
) -> str:
    from sdarflow.pipeline_config import run_component

    return run_component(
        "rescore", config_uri, rl_round, metrics=metrics, input=[trajectories], skills=skills, adapter=adapter
    )
