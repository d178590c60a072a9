"""The smoke pipeline: one task wired exactly as the training pipeline's train task (image, GPUs, node selector,
tolerations, /dev/shm, the model cache emptyDir, the S3 Secret, image pull secrets, the security context, the
Kueue label), which checks from inside the pod what a first run needs (:mod:`sdarflow.cluster_check`). A team runs
it before the first training run: each failed check names the flag or manifest that fixes it."""

import dataclasses

from kfp import dsl

from components.smoke import smoke
from pipelines.kube import KubeOptions, wire
from pipelines.params import describe

PIPELINE_NAME = "sdar-smoke"


def build_smoke_pipeline(kube: KubeOptions | None = None):
    """Return the ``@dsl.pipeline`` function."""
    root = kube.pipeline_root if kube and kube.pipeline_root else None
    gpus = kube.gpus_for("train") if kube else 0

    def sdar_smoke(storage: str = "s3://sdarflow/sdar") -> str:
        task = smoke(storage=storage, gpus=gpus, kfp_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER)
        # no retries: a failed check fails the same way again, on a GPU node
        wire(task, "train", dataclasses.replace(kube, retries=0) if kube else None, "smoke (wired as train)")
        return task.outputs["Output"]

    description = (
        "Check the cluster before a first run: a pod wired as the train task's runs non-root, reaches the storage "
        "with the Secret's credentials, and finds its model cache, /dev/shm and GPUs"
    )
    describe(sdar_smoke, description, {"storage": "the runs' storage URI (s3://bucket/prefix); a probe is written "
                                       "under <storage>/smoke/ and deleted"})  # fmt: skip
    return dsl.pipeline(name=PIPELINE_NAME, description=description, pipeline_root=root)(sdar_smoke)
