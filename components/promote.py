"""Component ``promote``: point a registry stage at a version through the promotion gate (promotion pipeline).

A gate refusal fails the task; its log holds the gate's message with both numbers.
"""

from kfp import dsl
from kfp.dsl import Markdown, Output

from components import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def promote(
    registry: str,
    name: str,
    version: str,
    stage: str,
    force: bool,
    reason: str,
    tighten: dict,
    kfp_run_id: str,
    roll_deployment: str,
    summary: Output[Markdown],
) -> str:
    from sdarflow.kfp_runtime import kfp_actor, run_promotion

    return run_promotion(
        registry,
        name,
        version,
        stage,
        force=force,
        reason=reason,
        thresholds=tighten,
        actor=kfp_actor(kfp_run_id),
        markdown=summary,
        roll_deployment=roll_deployment,
    )
