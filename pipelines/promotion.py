"""The promotion pipeline: one task that points a registry stage (production by default) at an adapter version
through the promotion gate, so users promote from the KFP UI. A gate refusal fails the run with the gate's
message (the failing criterion with both numbers); ``force`` with a ``reason`` overrides it, audited.
"""

import dataclasses

from kfp import dsl

from components.promote import promote
from pipelines.kube import KubeOptions, wire
from pipelines.params import describe
from sdarflow.defaults import DEFAULT_POLICY_NAME
from sdarflow.registry.gate import GATE_HELP

PIPELINE_NAME = "sdar-promotion"


def build_promotion_pipeline(kube: KubeOptions | None = None):
    """Return the ``@dsl.pipeline`` function; the gate is the registry's policy."""
    root = kube.pipeline_root if kube and kube.pipeline_root else None

    def sdar_promotion(
        registry: str,
        version: str,
        name: str = DEFAULT_POLICY_NAME,
        stage: str = "production",
        force: bool = False,
        reason: str = "",
        tighten: dict = {},  # noqa: B006 - KFP reads the default; the function never changes it
        roll_deployment: str = "",
    ) -> str:
        task = promote(
            registry=registry,
            name=name,
            version=version,
            stage=stage,
            force=force,
            reason=reason,
            tighten=tighten,
            kfp_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
            roll_deployment=roll_deployment,
        )
        # Not retried: a gate refusal fails this task and would fail it again; a rerun is one click.
        wire(task, "promote", dataclasses.replace(kube, retries=0) if kube else None, "promote")
        return task.outputs["Output"]

    description = (
        "Promote an adapter version to a registry stage through the gate: a test pass@1 gain beyond the noise, "
        "pass@k and OOD guards, task-paired 95-percent bounds against production and the base model"
    )
    helps = {
        "registry": "adapter registry URI: local folder or s3://bucket/prefix",
        "version": "version number, latest, or staging",
        "name": "policy name in the registry",
        "stage": "production (gated) or staging (gated when the registry has a staging policy)",
        "force": "override a gate refusal (needs a reason; audited)",
        "reason": "why; written to the alias history and the audit log (required with force)",
        "tighten": 'gate thresholds this promotion tightens the registry\'s policy to, e.g. {"min_gain": 0.02} '
        f"({', '.join(GATE_HELP)}); empty: the registry's policy (`sdarflow registry gate`)",
        "roll_deployment": "the serving Deployment ([NAMESPACE/]NAME, e.g. sdarflow/sdarflow-serve) that serves the "
        "stage's alias, rolled to the promoted version (checked before the alias moves; the run's service account "
        "needs k8s/serving's role); empty: serving is not rolled",
    }
    describe(sdar_promotion, description, helps)
    return dsl.pipeline(name=PIPELINE_NAME, description=description, pipeline_root=root)(sdar_promotion)
