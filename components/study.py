"""Components of the study pipeline (``settings`` is the URI the first one stores them at): check the settings, evaluate the base model, train and evaluate one (method,
seed) cell, and write the comparison report (shown in the KFP UI). Each calls ``sdarflow.study.run_step``, the code
``sdarflow study`` runs."""

from typing import List  # noqa: UP035 - KFP reads typing.List for list parameters and a collected fan-in

from kfp import dsl
from kfp.dsl import HTML, Markdown, Metrics, Output

from components import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def study_settings(
    out: str,
    base_model: str,
    methods: List[str],  # noqa: UP006
    seeds: List[int],  # noqa: UP006
    rounds: int,
    env: str,
    preset: str,
    stage_settings: dict,
) -> str:
    # typed pipeline parameters in; the checked settings are stored in `out` and their URI goes to the other tasks
    settings = dict(locals())  # first statement: exactly the pipeline parameters
    from sdarflow.study import run_step

    return run_step("check", settings)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def study_start(settings: str) -> str:
    # the cells' seed skills and warm start, made once before the base and the cells (which take its output)
    from sdarflow.study import run_step

    return run_step("start", settings)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def study_base(settings: str) -> str:
    from sdarflow.study import run_step

    return run_step("base", settings)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def study_cell(settings: str, method: str, seed: str) -> str:
    # method and seed: one item of the pipeline's fan-out (loop items arrive as strings)
    from sdarflow.study import run_step

    return run_step("cell", settings, method, int(float(seed)))


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def study_report(
    settings: str,
    cells: List[str],  # noqa: UP006 - the finished cells' folders: the report runs after all of them
    base: str,
    metrics: Output[Metrics],
    report: Output[HTML],
    summary: Output[Markdown],
) -> str:
    from sdarflow.study import run_step

    return run_step("report", settings, html=report, markdown=summary, metrics=metrics)
