"""What the thin KFP components call: ``run_component`` runs a stage and fills its typed UI artifacts (Metrics,
HTML, Markdown, Dataset/Model pointing at the published output); ``run_promotion`` is the promotion pipeline's step
and ``promote_candidate`` the training pipeline's last one."""

from __future__ import annotations

import gc
import json
import logging
import os
import sys
import traceback
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from sdarflow import progress, stopping, storage
from sdarflow.config import SHARED_CACHE_ENV
from sdarflow.defaults import VERSION_KIND
from sdarflow.errors import ConfigError
from sdarflow.evaluate.metrics import REPORT, REPORT_KIND
from sdarflow.model_cache import with_local_model
from sdarflow.pipeline_config import (
    PipelineConfig,
    base_eval_config,
    load,
    production_eval_config,
    shared_cache,
    stage_config,
)
from sdarflow.registry import GateRefused, Registry
from sdarflow.registry.roll import ServingRoll
from sdarflow.stages import STAGES

log = logging.getLogger(__name__)


def _load(config_uri: str) -> PipelineConfig:
    """The run's pipeline config; this task shares what it generates (games) in the storage's cache."""
    pc = load(config_uri)
    os.environ[SHARED_CACHE_ENV] = shared_cache(pc)
    return pc


def run_stage(stage: str, config_uri: str, round_: int, **io: Any) -> dict:
    return STAGES.get(stage).run(with_local_model(stage_config(_load(config_uri), stage, round_, **io)))


def run_base_evaluation(config_uri: str) -> dict:
    """Evaluate the base model (``pipeline_config.base_eval_config``), or return the evaluation an earlier run
    published for the same base weights and settings, without fetching the model."""
    cfg = base_eval_config(_load(config_uri))
    if storage.is_published(cfg.output):
        result = storage.read_manifest(cfg.output).get("result")  # recorded once the evaluation finished
        if result is not None:
            log.info("base model evaluation: reusing %s (same base weights and settings)", cfg.output)
            return result
    return STAGES.get("evaluate").run(with_local_model(cfg))


def setup_component() -> None:
    """What every component process does first: log lines a pod log can read, no library progress bars,
    SIGTERM (how Kubernetes stops the pod) unwinding through the stage's cleanups (``sdarflow.stopping``), and a
    failure's frames freed once it is printed (:func:`_print_then_free`)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    progress.quiet_library_bars()
    stopping.unwind_on_sigterm()
    sys.excepthook = _print_then_free


def _print_then_free(kind: type[BaseException], err: BaseException, tb: TracebackType | None) -> None:
    """KFP's executor lets a stage's exception end the process. Its traceback keeps the failed frames, and with
    them Arrow tables read from Python bytes, alive in reference cycles until interpreter teardown, after torch's,
    where their destructors abort the process (SIGABRT, "terminate called without an active exception", in place
    of the error's exit 1). So, as the CLI's ``main`` does, free them while everything is alive: print the
    exception, then clear the frames' locals and collect."""
    sys.__excepthook__(kind, err, tb)
    traceback.clear_frames(tb)
    gc.collect()


def kfp_actor(run_id: str) -> str:
    """Who acts in the registry's audit log for a pipeline run (``run_id`` is a whole parameter: KFP resolves a
    placeholder only when it is the whole value)."""
    return f"kfp-run:{run_id}"


def artifact_uri(artifact) -> str:
    """The data URI a typed KFP input artifact points at ("" when the optional input was not given)."""
    return "" if artifact is None else str(artifact.metadata.get("uri", ""))


def _point(artifact, uri: str) -> None:
    """Point a typed KFP output artifact at the published output ``uri``: the URI and the manifest's kind, rows and
    config hash as metadata, the manifest as its file. The data stays where it is (an artifact whose URI were the
    dataset's prefix would be downloaded whole into every consuming pod)."""
    manifest = storage.read_manifest(uri)
    artifact.metadata.update(
        {"uri": uri, **{k: manifest[k] for k in ("kind", "rows", "config_hash") if k in manifest}}
    )
    with open(artifact.path, "w") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)


def run_component(
    stage: str,
    config_uri: str,
    round_: int,
    *,
    metrics=None,
    html=None,
    markdown=None,
    output=None,
    actor: str | None = None,
    **io: Any,
) -> str:
    """What every stage component calls: run the stage, fill the UI artifacts (:func:`_fill_outputs`) and return
    the output URI; ``actor`` is who the registry's audit log names (``SDARFLOW_ACTOR``)."""
    setup_component()
    if actor:
        os.environ["SDARFLOW_ACTOR"] = actor
    return _fill_outputs(stage, run_stage(stage, config_uri, round_, **io), metrics, html, markdown, output)


def run_base_component(config_uri: str, *, metrics=None, html=None, markdown=None, output=None) -> str:
    """What the base-model evaluation component calls: :func:`run_base_evaluation`, outputs as ``run_component``."""
    setup_component()
    return _fill_outputs("evaluate", run_base_evaluation(config_uri), metrics, html, markdown, output)


def run_production_component(config_uri: str, *, metrics=None, html=None, markdown=None, output=None) -> str:
    """What the production evaluation component calls (``pipeline_config.production_eval_config``), outputs as
    ``run_component``; with nothing to evaluate, the output artifact points nowhere ("") and the reports say why."""
    setup_component()
    cfg = production_eval_config(_load(config_uri))
    if cfg is not None:
        result = STAGES.get("evaluate").run(with_local_model(cfg))
        return _fill_outputs("evaluate", result, metrics, html, markdown, output)
    note = (
        "no production evaluation: the run does not promote to production, or there is no production version"
    )
    log.info(note)
    for artifact, text in ((html, f"<p>{note}</p>"), (markdown, f"_{note}_\n"), (output, "{}")):
        _write_text(artifact, text)
    return ""


def _fill_outputs(stage: str, result: dict, metrics, html, markdown, output) -> str:
    """Point ``output`` at the stage's output, log its metrics and copy its reports; the output URI."""
    if output is not None:
        _point(output, str(result["uri"]))
    if metrics is not None:
        for key, value in sorted(result.get("metrics", {}).items()):
            metrics.log_metric(key.replace("/", "_"), float(value))
    _write_reports(html, markdown, str(result["uri"]), stage)
    return str(result["uri"])


def _write_reports(html, markdown, uri: str, stage: str) -> None:
    """Copy ``uri``'s published report.html / report.md into the UI artifacts (each optional); a stage that
    publishes none gets a placeholder, because the KFP launcher fails a task whose output artifact file is missing."""
    for artifact, name in ((html, "report.html"), (markdown, "report.md")):
        if artifact is None:
            continue
        if storage.member_entry(storage.read_manifest(uri), name) is not None:
            data = storage.read_member(uri, name)
        else:
            log.warning("%s: no %s in %s; the KFP UI shows a placeholder", stage, name, uri)
            note = f"{stage} published no {name} in {uri}"
            data = (f"<p>{note}</p>" if name.endswith(".html") else f"_{note}_\n").encode()
        Path(artifact.path).write_bytes(data)


def run_report_component(
    config_uri: str,
    rounds: int,
    shards: int,
    promotion: str = "",
    base_uri: str = "",
    *,
    html=None,
    markdown=None,
) -> str:
    """The training pipeline's run report (``sdarflow.run_report``), also shown in the KFP UI; ``promotion`` is
    the promote task's outcome, ``base_uri`` the base model's evaluation."""
    from sdarflow.run_report import publish_run_report

    setup_component()
    pc = load(config_uri)
    uri = publish_run_report(pc.storage, pc.run_id, rounds, shards, promotion, base_uri)
    _write_reports(html, markdown, uri, "run-report")
    log.info("run report -> %s", uri)
    return uri


def run_promotion(
    registry: str,
    name: str,
    version: str,
    stage: str = "production",
    *,
    force: bool = False,
    reason: str = "",
    thresholds: Mapping[str, float] | None = None,
    actor: str | None = None,
    markdown=None,
    current_report: tuple[int, Mapping[str, Any]] | None = None,
    roll_deployment: str = "",
) -> str:
    """The promotion pipeline's step: ``Registry.promote`` through the gate, which ``thresholds`` may only
    tighten; ``current_report``: the stage's version evaluated on the candidate's tasks; ``roll_deployment``:
    the serving Deployment ([NAMESPACE/]NAME) rolled to the promoted version, checked before the alias moves. A
    refusal raises GateRefused; returns one summary line, also written to the Markdown artifact."""
    setup_component()
    store = Registry(registry)
    roller = ServingRoll(roll_deployment, store, name, stage) if roll_deployment else None
    event = store.promote(
        name,
        version,
        stage=stage,
        thresholds=thresholds,
        force=force,
        reason=reason,
        actor=actor,
        current_report=current_report,
    )
    line = f"{name} {stage} -> v{event['version']} (gate: {event.get('gate', 'unchanged')})"
    if roller:
        line += f"; {roller.roll(event['version'])}"
    _write_text(markdown, f"**{line}**\n\nregistry: `{registry}`; reason: {reason or '-'}\n")
    log.info("promotion: %s", line)
    return line


def promote_candidate(
    config_uri: str,
    registered: str,
    actor: str | None = None,
    markdown=None,
    metrics=None,
    production_evaluation: str = "",
) -> str:
    """After the last round: promote its registered version to production when ``promote_to=production``, through
    the gate (which the run's gate parameters may only tighten), comparing with ``production_evaluation``. A gate
    refusal is an expected outcome of retraining: it is reported (result, Markdown, Metrics ``gate_refused`` 1)
    and the run still succeeds, production left as it was."""
    setup_component()
    pc = load(config_uri)
    if pc.promote_to != "production":
        line = f"not promoted: promote_to is {pc.promote_to or 'empty'}"
        _write_text(markdown, line + "\n")
        _log_promotion(metrics, promoted=False, refused=False)
        return line
    # the version folder's manifest records its number (registry.store.Registry.register)
    version = storage.read_manifest(registered, kind=VERSION_KIND).get("version")
    if not (isinstance(version, int) and version >= 1):
        raise ConfigError(
            f"'{registered}' is not a registry version (its manifest names no version number); "
            f"fix: pass the register task's output"
        )
    try:
        line = run_promotion(
            pc.registry,
            pc.policy_name,
            str(version),
            force=False,
            thresholds=pc.gate,
            actor=actor,
            markdown=markdown,
            current_report=_evaluated_version(pc, production_evaluation),
            roll_deployment=pc.serve_deployment,
        )
    except GateRefused as err:
        log.warning("promotion of %s v%s refused: %s", pc.policy_name, version, err)
        _write_text(markdown, f"**{pc.policy_name} v{version} not promoted**\n\n{err}\n")
        _log_promotion(metrics, promoted=False, refused=True)
        return f"refused: {err}"
    _log_promotion(metrics, promoted=True, refused=False)
    return line


def skip_run(reason: str, markdown=None, metrics=None) -> str:
    """A run that would train nothing new (``pipeline_config.unchanged_since``) ends here, saying why."""
    setup_component()
    log.warning("run skipped: %s", reason)
    _write_text(markdown, f"**Run skipped**\n\n{reason}\n")
    if metrics is not None:
        metrics.log_metric("skipped", 1.0)
    return f"skipped: {reason}"


def smoke(storage_uri: str, gpus: int, run_id: str, markdown=None, metrics=None) -> str:
    """The smoke pipeline's task (:mod:`sdarflow.cluster_check`): its table in the UI, then a one-line failure
    naming each failed check and its fix, if any failed."""
    from sdarflow import cluster_check

    setup_component()
    checks = cluster_check.check_cluster(storage_uri, gpus, run_id)
    _write_text(markdown, cluster_check.markdown(checks))
    if metrics is not None:
        metrics.log_metric("checks_failed", float(sum(not c.ok for c in checks)))
    cluster_check.raise_failed(checks)
    return f"all {len(checks)} checks passed"


def _evaluated_version(pc: PipelineConfig, evaluation: str) -> tuple[int, dict] | None:
    """(version, report) of a registry version's evaluation in this run, the version its adapter copy's manifest
    names (of the run's registry and policy); None for ""."""
    if not evaluation:
        return None
    report = storage.read_member_json(evaluation, REPORT, kind=REPORT_KIND)
    source = storage.read_manifest(str(report.get("adapter", "")), kind="adapter")
    if (source.get("registry"), source.get("name")) != (pc.registry, pc.policy_name):
        raise ConfigError(
            f"'{evaluation}' evaluated {report.get('adapter')!r}, not a version of {pc.policy_name} in "
            f"{pc.registry}; fix: pass the production evaluation task's output"
        )
    return int(source["version"]), report


def _log_promotion(metrics, *, promoted: bool, refused: bool) -> None:
    # a check the UI shows per run, and a schedule's runs side by side
    if metrics is not None:
        metrics.log_metric("promoted", float(promoted))
        metrics.log_metric("gate_refused", float(refused))


def _write_text(artifact, text: str) -> None:
    if artifact is not None:
        Path(artifact.path).write_text(text)
