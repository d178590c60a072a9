"""Component ``generate``: multi-turn rollouts for one round (or one shard of it), published as a ``Dataset``."""

from kfp import dsl
from kfp.dsl import HTML, Dataset, Input, Markdown, Metrics, Model, Output

from components import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def generate(
    config_uri: str,
    rl_round: int,
    shard: int,
    metrics: Output[Metrics],
    trajectories: Output[Dataset],
    report: Output[HTML],
    summary: Output[Markdown],
    adapter: Input[Model] = None,
    adapter_uri: str = "",
) -> str:
    """``adapter`` is the previous round's trained adapter; inside the sharded fan-out it arrives as
    ``adapter_uri`` (a sub-pipeline's input); neither in round 0 (the run's start adapter, or a new LoRA)."""
    from sdarflow.kfp_runtime import artifact_uri, run_component

    return run_component(
        "generate",
        config_uri,
        rl_round,
        metrics=metrics,
        html=report,
        markdown=summary,
        output=trajectories,
        adapter=artifact_uri(adapter) or adapter_uri,
        shard=shard,
    )
