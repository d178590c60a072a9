"""Component ``rescore``: student and teacher log-probs (a ``Dataset``), with the stage's report in the KFP UI."""

from kfp import dsl
from kfp.dsl import HTML, Dataset, Input, Markdown, Metrics, Model, Output

from components import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def rescore(
    config_uri: str,
    rl_round: int,
    trajectory_shards: list,
    skills: Input[Dataset],
    metrics: Output[Metrics],
    report: Output[HTML],
    summary: Output[Markdown],
    rescored: Output[Dataset],
    trajectories: Input[Dataset] = None,
    adapter: Input[Model] = None,
) -> str:
    from sdarflow.kfp_runtime import artifact_uri, run_component

    return run_component(
        "rescore",
        config_uri,
        rl_round,
        metrics=metrics,
        html=report,
        markdown=summary,
        output=rescored,
        input=[artifact_uri(trajectories), *trajectory_shards],
        skills=artifact_uri(skills),
        adapter=artifact_uri(adapter),
    )
