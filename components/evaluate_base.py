"""Component ``evaluate_base``: the run's base model (no adapter) on the rounds' evaluation tasks and seeds, once
per run: every round's report plots it, and the gate compares a first version with it."""

from kfp import dsl
from kfp.dsl import HTML, Artifact, Markdown, Metrics, Output

from components import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def evaluate_base(
    config_uri: str,
    metrics: Output[Metrics],
    report: Output[HTML],
    summary: Output[Markdown],
    evaluation: Output[Artifact],
) -> str:
    from sdarflow.kfp_runtime import run_base_component

    return run_base_component(config_uri, metrics=metrics, html=report, markdown=summary, output=evaluation)
