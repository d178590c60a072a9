"""Component ``evaluate``: pass@k on test and OOD, with the report shown in the KFP UI."""

from kfp import dsl
from kfp.dsl import HTML, Markdown, Metrics, Output

from components import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def evaluate(
    config_uri: str,
    rl_round: int,
    adapter: str,
    metrics: Output[Metrics],
    report: Output[HTML],
    summary: Output[Markdown],
) -> str:
    from sdarflow.pipeline_config import run_component

    return run_component(
        "evaluate", config_uri, rl_round, metrics=metrics, html=report, markdown=summary, adapter=adapter
    )
