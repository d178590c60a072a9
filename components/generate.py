"""Component ``generate``: multi-turn rollouts for one round (or one shard of it)."""

from kfp import dsl
from kfp.dsl import Metrics, Output

from components import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def generate(config_uri: str, rl_round: int, adapter: str, shard: int, metrics: Output[Metrics]) -> str:
    from sdarflow.pipeline_config import run_component

    return run_component("generate", config_uri, rl_round, metrics=metrics, adapter=adapter, shard=shard)
