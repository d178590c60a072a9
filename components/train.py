"""Component ``train``: the SDAR update of the LoRA adapter."""

from kfp import dsl
from kfp.dsl import Metrics, Output

from components import IMAGE


@dsl.component(base_image=IMAGE)
def train(config_uri: str, rl_round: int, rescored: str, adapter: str, metrics: Output[Metrics]) -> str:
    from sdarflow.pipeline_config import run_component

    return run_component("train", config_uri, rl_round, metrics=metrics, input=[rescored], adapter=adapter)
