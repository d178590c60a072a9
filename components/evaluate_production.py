"""Component ``evaluate_production``: the registry's production version on the run's evaluation tasks and seeds,
once per run that promotes to production, so the gate compares the candidate with production task by task."""

from kfp import dsl
from kfp.dsl import HTML, Artifact, Markdown, Metrics, Output

from components import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def evaluate_production(
    config_uri: str,
    metrics: Output[Metrics],
    report: Output[HTML],
    summary: Output[Markdown],
    evaluation: Output[Artifact],
) -> str:
    from sdarflow.kfp_runtime import run_production_component

    return run_production_component(
        config_uri, metrics=metrics, html=report, markdown=summary, output=evaluation
    )
