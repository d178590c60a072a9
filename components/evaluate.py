"""Component ``evaluate``: pass@k on test and OOD of the round's adapter against the base model's (``baseline``),
with the report in the KFP UI and as an artifact the register task reads."""

from kfp import dsl
from kfp.dsl import HTML, Artifact, Input, Markdown, Metrics, Model, Output

from components import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def evaluate(
    config_uri: str,
    rl_round: int,
    adapter: Input[Model],
    baseline: Input[Artifact],
    metrics: Output[Metrics],
    report: Output[HTML],
    summary: Output[Markdown],
    evaluation: Output[Artifact],
) -> str:
    from sdarflow.kfp_runtime import artifact_uri, run_component

    return run_component(
        "evaluate",
        config_uri,
        rl_round,
        metrics=metrics,
        html=report,
        markdown=summary,
        output=evaluation,
        adapter=artifact_uri(adapter),
        baseline=artifact_uri(baseline),
    )
