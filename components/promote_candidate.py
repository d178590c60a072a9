"""Component ``promote`` of the training pipeline: the last round's version to production through the gate,
when the run asked for it (``promote_to=production``), compared with production evaluated on the run's tasks
(``production_evaluation``, its URI; "" when there is none); a refusal is reported, not a failure."""

from kfp import dsl
from kfp.dsl import Markdown, Metrics, Output

from components import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def promote_candidate(
    config_uri: str,
    registered: str,
    kfp_run_id: str,
    production_evaluation: str,
    summary: Output[Markdown],
    metrics: Output[Metrics],
) -> str:
    from sdarflow.kfp_runtime import kfp_actor
    from sdarflow.kfp_runtime import promote_candidate as run

    return run(
        config_uri,
        registered,
        actor=kfp_actor(kfp_run_id),
        markdown=summary,
        metrics=metrics,
        production_evaluation=production_evaluation,
    )
