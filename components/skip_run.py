"""Component ``skip-run``: the training pipeline's branch for a run that would train nothing new (``prepare``'s
``skip``): it says why in the log, its Markdown summary and its Metrics (``skipped`` 1)."""

from kfp import dsl
from kfp.dsl import Markdown, Metrics, Output

from components import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def skip_run(reason: str, summary: Output[Markdown], metrics: Output[Metrics]) -> str:
    from sdarflow.kfp_runtime import skip_run as run

    return run(reason, markdown=summary, metrics=metrics)
