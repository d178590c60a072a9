"""The method study as a KFP pipeline: the base model's evaluation and every (method, seed) cell fan out with
``dsl.ParallelFor`` after a first task checks the settings and a second makes the start point (a pretrained base's seed skills and warm
start); a last task writes ``study.json`` and the report (HTML in the KFP UI). Each task calls
``sdarflow.study.run_step``, the code ``sdarflow study`` runs, and a cell already finished in ``out`` is read back,
so a retried or re-run study redoes only the missing cells.

Methods and seeds are fixed at compile time (``sdarflow pipeline compile --pipeline study --methods ... --seeds
...``) so the UI shows one task per cell. A cell runs its stages in one pod, so it is wired as a training task
(its GPUs) on the rollout image, which has vLLM for a preset that rolls out with it and DeepSpeed too (the train
image has no vLLM); the base evaluation as an evaluate task; the report as a CPU task.
"""

from kfp import dsl

from components.study import study_base, study_cell, study_report, study_settings, study_start
from pipelines.kube import KubeOptions, wire
from pipelines.params import describe
from sdarflow.study import StudySettings

PIPELINE_NAME = "sdar-study"


def build_study_pipeline(methods: list[str], seeds: list[int], kube: KubeOptions | None = None):
    """Return the ``@dsl.pipeline`` function comparing ``methods`` over ``seeds`` (validated now)."""
    StudySettings(methods=list(methods), seeds=list(seeds), rounds=1, out="-")
    cells = [{"method": m, "seed": s} for m in methods for s in seeds]
    root = kube.pipeline_root if kube and kube.pipeline_root else None

    # A sub-pipeline, as training's sharded generate: the KFP local runner (2.17) hands a loop's task-output inputs
    # (here the settings URI) the loop item instead; a sub-pipeline's inputs arrive correctly.
    @dsl.pipeline(name="study-cells", description="every (method, seed) cell in parallel")
    def study_cells(settings: str) -> list[str]:
        with dsl.ParallelFor(cells, parallelism=kube.parallelism if kube else 0) as cell:
            run = study_cell(settings=settings, method=cell.method, seed=cell.seed)
            wire(run, "train", kube, "study: cell")
            if kube and kube.gpus_for("train"):
                run.set_container_image(kube.rollout_image)
        return dsl.Collected(run.output)

    def sdar_study(
        out: str,
        base_model: str,
        rounds: int = 2,
        env: str = "textworld-cooking",
        preset: str = "demo",
        stage_settings: dict = {},  # noqa: B006 - KFP needs a literal default
    ) -> str:
        settings = study_settings(
            out=out,
            base_model=base_model,
            methods=list(methods),
            seeds=list(seeds),
            rounds=rounds,
            env=env,
            preset=preset,
            stage_settings=stage_settings,
        )
        wire(settings, "prepare", kube, "study: settings")
        start = study_start(settings=settings.output)  # a pretrained base's seed skills and SFT warm start
        wire(start, "train", kube, "study: start point")
        base = study_base(settings=start.output)
        wire(base, "evaluate", kube, "study: base model")
        runs = study_cells(settings=start.output)
        runs.set_display_name(f"study: {len(cells)} cells")
        rep = study_report(settings=settings.output, cells=runs.output, base=base.output)
        wire(rep, "register", kube, "study: report")
        return rep.outputs["Output"]

    description = "Compare SDAR with its baselines: every method x seed from one base model, relative to GRPO"
    helps = {
        "out": "where the study writes its cells, study.json and the report (folder or s3://)",
        "base_model": "base model HF folder every cell starts from (empty: build the preset's demo model)",
        "rounds": "RL rounds per cell",
        "env": "environment suite of every cell",
        "preset": "sizes of every cell: demo, smoke, gpu or pretrained (sdarflow.sizes.SIZES)",
        "stage_settings": 'per-stage settings on top of the preset\'s, e.g. {"train": {"lr": 0.002}}',
    }
    describe(sdar_study, f"{description}; methods {', '.join(methods)}, seeds {seeds}", helps)
    return dsl.pipeline(name=PIPELINE_NAME, description=description, pipeline_root=root)(sdar_study)
