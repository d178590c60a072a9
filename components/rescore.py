"""Component ``rescore``: student and teacher log-probs, with the stage's report shown in the KFP UI."""

from kfp import dsl
from kfp.dsl import HTML, Markdown, Metrics, Output

from components import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def rescore(
    config_uri: str,
    rl_round: int,
    trajectories: str,
    trajectory_shards: list,
    skills: str,
    adapter: str,
    metrics: Output[Metrics],
    report: Output[HTML],
    summary: Output[Markdown],
) -> str:
    from sdarflow.pipeline_config import run_component

    return run_component(
        "rescore",
        config_uri,
        rl_round,
        metrics=metrics,
        html=report,
        markdown=summary,
        input=[trajectories, *trajectory_shards],
        skills=skills,
        adapter=adapter,
    )
