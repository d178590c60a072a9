"""Component ``run_report``: the whole run on one page (the promotion's outcome, every round's rollouts, learning
signal and held-out evaluation against the base model, three transcripts), in the KFP UI and at
``<storage>/runs/<run_id>/report``."""

from kfp import dsl
from kfp.dsl import HTML, Markdown, Output

from components import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def run_report(
    config_uri: str,
    promotion: str,
    base_evaluation: str,
    rounds: int,
    shards: int,
    report: Output[HTML],
    summary: Output[Markdown],
) -> str:
    from sdarflow.kfp_runtime import run_report_component

    # `promotion` (the promote task's outcome) also orders this task after every round
    return run_report_component(
        config_uri, rounds, shards, promotion, base_evaluation, html=report, markdown=summary
    )
