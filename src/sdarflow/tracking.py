"""Experiment tracking in MLflow, off unless a stage gets ``--tracking-uri``: one MLflow run per stage run, with
the stage's config as parameters, its per-step metrics (train; its summary then under ``summary/``) and summary
metrics, and its published files (reports, the adapter) as artifacts. The experiment is ``$MLFLOW_EXPERIMENT_NAME``
or ``sdarflow``; tags name the stage, its output URI and config hash, so a run in the MLflow UI leads back to the data.

Tracking is a copy for people to browse, never the record the pipeline reads: a tracking server that fails is a
warning, and the stage's published output stands. MLflow is optional (``pip install 'sdarflow[tracking]'``).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sdarflow.config import opt
from sdarflow.errors import ConfigError

log = logging.getLogger(__name__)

DEFAULT_EXPERIMENT = "sdarflow"
_PARAM_CHARS = 500  # MLflow refuses longer parameter values; a list of URIs is cut, not refused


def tracking_opt():
    return opt(
        "",
        "MLflow tracking URI (http://mlflow:5000, databricks, ...): parameters, metrics and reports of this run; "
        "empty = off (needs sdarflow[tracking])",
        io=True,
    )


def check_available(tracking_uri: str) -> None:
    """Fail before the work, not after it, when tracking is asked for but MLflow is not installed."""
    if not tracking_uri:
        return
    try:
        import mlflow  # noqa: F401
    except ImportError:
        raise ConfigError(
            f"--tracking-uri {tracking_uri} needs MLflow, which is not installed; fix: pip install "
            f"'sdarflow[tracking]', or leave --tracking-uri empty"
        ) from None


def finite(v) -> bool:
    """A finite number (not a bool)."""
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _numbers(values: Mapping[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in values.items() if finite(v)}


def log_stage_run(
    tracking_uri: str,
    stage: str,
    params: Mapping[str, Any],
    metrics: Mapping[str, Any],
    *,
    history: Sequence[Mapping[str, Any]] = (),
    artifacts: Path | None = None,
    tags: Mapping[str, str] | None = None,
) -> str | None:
    """Log one stage run to MLflow at ``tracking_uri``; its MLflow run id, or None (off, or it failed)."""
    if not tracking_uri:
        return None
    import mlflow

    try:
        mlflow.set_tracking_uri(tracking_uri)
        mlflow.set_experiment(os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT)
        output = str((tags or {}).get("sdarflow.output", ""))
        with mlflow.start_run(
            run_name=f"{stage}: {output}", tags={"sdarflow.stage": stage, **(tags or {})}
        ) as run:
            mlflow.log_params({k: str(v)[:_PARAM_CHARS] for k, v in params.items()})
            for i, line in enumerate(history, start=1):
                mlflow.log_metrics(_numbers(line), step=int(line.get("step", i)))
            # beside a per-step series, the run's summary (a mean, a total) goes under its own key
            prefix = "summary/" if history else ""
            mlflow.log_metrics({prefix + k: v for k, v in _numbers(metrics).items()})
            if artifacts is not None:
                mlflow.log_artifacts(str(artifacts))
    except Exception as err:  # noqa: BLE001 - any tracking failure: the stage's published output stands
        log.warning(
            "tracking: could not log the %s run to %s (%s: %s)", stage, tracking_uri, type(err).__name__, err
        )
        return None
    log.info("tracking: %s run %s in %s", stage, run.info.run_id, tracking_uri)
    return run.info.run_id
