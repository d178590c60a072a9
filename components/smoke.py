"""Component ``smoke``: the cluster check a team runs first (``sdarflow pipeline smoke``), in a pod wired as the
train task's; its table of checks in the UI (Markdown), the failed count in its Metrics."""

from kfp import dsl
from kfp.dsl import Markdown, Metrics, Output

from components import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def smoke(
    storage: str, gpus: int, kfp_run_id: str, summary: Output[Markdown], metrics: Output[Metrics]
) -> str:
    from sdarflow.kfp_runtime import smoke as run

    return run(storage, gpus, kfp_run_id, markdown=summary, metrics=metrics)
