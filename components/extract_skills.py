"""Component ``extract-skills``: the round's skill library (a ``Dataset``), from one trajectory dataset or the
union of shards."""

from kfp import dsl
from kfp.dsl import HTML, Dataset, Input, Markdown, Output

from components import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def extract_skills(
    config_uri: str,
    rl_round: int,
    trajectory_shards: list,
    library: Output[Dataset],
    report: Output[HTML],
    summary: Output[Markdown],
    trajectories: Input[Dataset] = None,
    previous: Input[Dataset] = None,
    rescored: Input[Dataset] = None,
) -> str:
    """``previous`` is the last round's library (absent in round 0, which merges into the run's seed library);
    ``rescored`` the last round's teacher gaps (for ucb retrieval), absent in round 0."""
    from sdarflow.kfp_runtime import artifact_uri, run_component

    return run_component(
        "extract-skills",
        config_uri,
        rl_round,
        output=library,
        html=report,
        markdown=summary,
        input=[artifact_uri(trajectories), *trajectory_shards],
        previous=artifact_uri(previous),
        rescored=[artifact_uri(rescored)],
    )
