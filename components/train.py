"""Component ``train``: the SDAR update of the LoRA adapter (a ``Model``), with the training report in the KFP UI."""

from kfp import dsl
from kfp.dsl import HTML, Dataset, Input, Markdown, Metrics, Model, Output

from components import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def train(
    config_uri: str,
    rl_round: int,
    rescored: Input[Dataset],
    metrics: Output[Metrics],
    report: Output[HTML],
    summary: Output[Markdown],
    trained: Output[Model],
    adapter: Input[Model] = None,
) -> str:
    """``adapter`` is the one this round continues from (the previous round's; none in round 0)."""
    from sdarflow.kfp_runtime import artifact_uri, run_component

    return run_component(
        "train",
        config_uri,
        rl_round,
        metrics=metrics,
        html=report,
        markdown=summary,
        output=trained,
        input=[artifact_uri(rescored)],
        adapter=artifact_uri(adapter),
    )
