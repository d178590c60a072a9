"""Operations on a KFP server through ``kfp.Client`` (KFP v2 REST API, ``/apis/v2beta1``): upload a compiled
pipeline (a new pipeline, or a new version of an existing one), start a run, and create a recurring run.

Runs and schedules take either a compiled package (``--package FILE``: the spec travels with the request) or an
uploaded pipeline by name (its newest version unless one is named). Parameters are checked against the spec's
declared inputs first, so a typo fails here with the valid names instead of as a failed run an hour later.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sdarflow import __version__
from sdarflow.errors import ConfigError

log = logging.getLogger(__name__)

TOKEN_ENV = "KFP_TOKEN"
# The oldest KFP backend the compiled pipelines run on, read from kubeflow/pipelines' history: every task takes
# the S3 Secret's optional keys (AWS_ENDPOINT_URL, AWS_DEFAULT_REGION) as `secretAsEnv` with `optional: true`,
# which the driver honours since 2.15.0 (55ec8469, #12216); 2.4.1-2.14 drop the field, so a Secret without those
# keys fails every pod, and 2.4.0 and older refuse the whole spec (`unknown field "optional"`, #12495, #11935).
MIN_BACKEND = (2, 15, 0)
# The oldest that applies the tasks' security context (kfp-kubernetes set_security_context, read by the driver
# since 2.16.0: 64ad98e7, #12832) and hardens the rest of the pod (07f35fc0, #12782): older backends run the
# tasks without it, and a namespace enforcing Pod Security "restricted" rejects every task pod.
RESTRICTED_BACKEND = (2, 16, 0)
DEFAULT_EXPERIMENT = "sdarflow"


@dataclass(frozen=True)
class Source:
    """What to run: a compiled package, or an uploaded pipeline's version (ids resolved on the server)."""

    package: str | None = None
    pipeline_id: str | None = None
    version_id: str | None = None
    spec: dict | None = None  # the pipeline spec, for checking parameters

    def kwargs(self) -> dict[str, str]:
        if self.package:
            return {"pipeline_package_path": self.package}
        return {"pipeline_id": self.pipeline_id, "version_id": self.version_id}


class _NoRetryLines(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Retrying")


_NO_RETRY_LINES = _NoRetryLines()


def unreachable(host: str, reason: object) -> ConfigError:
    """The one line for a KFP server that does not answer (``reason``'s last part: "[Errno 111] Connection
    refused", not the connection object's repr)."""
    return ConfigError(
        f"the KFP server at {host} is unreachable ({str(reason).rsplit(': ', 1)[-1]}); fix: check --host and that the server runs (from "
        f"outside the cluster: kubectl -n kubeflow port-forward svc/ml-pipeline-ui 8080:80, then --host "
        f"http://localhost:8080)"
    )


def connect(host: str, namespace: str | None = None):
    """A ``kfp.Client`` for ``host``; a bearer token comes from ``$KFP_TOKEN`` (never a flag: shell history).
    A server that does not answer is a ConfigError (one line), not urllib3's retries and traceback."""
    import kfp
    import urllib3

    if not host:
        raise ConfigError("no KFP host; fix: pass --host http://HOST:PORT or set KF_PIPELINES_ENDPOINT")
    kwargs: dict[str, Any] = {"host": host, "existing_token": os.environ.get(TOKEN_ENV) or None}
    if namespace:
        kwargs["namespace"] = namespace
    # urllib3 logs each retry of a refused connection as a warning; the error below says it once
    logging.getLogger("urllib3.connectionpool").addFilter(_NO_RETRY_LINES)
    with warnings.catch_warnings():
        # "only works with KFP >= 2.0.0-beta.2": true of every server this targets; noise in every command.
        warnings.filterwarnings("ignore", "This client only works", FutureWarning)
        try:
            return kfp.Client(**kwargs)  # asks the server's healthz
        except urllib3.exceptions.HTTPError as err:
            raise unreachable(host, getattr(err, "reason", None) or type(err).__name__) from None


def check_backend(host: str) -> str | None:
    """The KFP backend's version (the v1 API's healthz ``tag_name``; the v2 one does not say), after checking it
    is at least ``MIN_BACKEND``: ConfigError (one line) when older. None, with a warning, when the server does not
    tell: it is not refused for that."""
    import urllib.error
    import urllib.request

    headers = {"Authorization": f"Bearer {os.environ[TOKEN_ENV]}"} if os.environ.get(TOKEN_ENV) else {}
    request = urllib.request.Request(f"{host.rstrip('/')}/apis/v1beta1/healthz", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            tag = str(json.loads(resp.read()).get("tag_name", ""))
    except (urllib.error.HTTPError, ValueError, AttributeError):
        tag = ""  # the server answered, but not with its version
    except (urllib.error.URLError, OSError) as err:  # no answer at all
        raise unreachable(host, getattr(err, "reason", err)) from None
    parts = tag.lstrip("v").split("-")[0].split(".")
    if len(parts) < 2 or not all(p.isascii() and p.isdigit() for p in parts):
        log.warning(
            "the KFP server at %s does not tell its version; it needs %s or newer", host, _dotted(MIN_BACKEND)
        )
        return None
    version = tuple(int(p) for p in parts) + (0,) * (3 - len(parts))  # "2.15" is 2.15.0
    if version < MIN_BACKEND:
        raise ConfigError(
            f"the KFP backend at {host} is {tag}, older than {_dotted(MIN_BACKEND)}, whose driver the pipelines need "
            f"(optional Secret keys as env, fan-in over a sub-DAG, task timeouts and volumes); fix: upgrade Kubeflow "
            f"Pipelines, or pass --skip-version-check to upload anyway"
        )
    if version < RESTRICTED_BACKEND:
        log.warning(
            "the KFP backend at %s is %s: it ignores the tasks' security context (applied since %s), so a namespace "
            "enforcing Pod Security restricted rejects every task pod; runs in a baseline namespace are not affected",
            host, tag, _dotted(RESTRICTED_BACKEND),
        )  # fmt: skip
    return tag


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


def read_spec(package: str | Path) -> dict:
    """The pipeline spec document of a compiled IR YAML (the first document; the second is the platform spec)."""
    path = Path(package)
    if not path.is_file():
        raise ConfigError(
            f"pipeline package '{package}' not found; fix: run `sdarflow pipeline compile` first"
        )
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    if not docs or "pipelineInfo" not in docs[0]:
        raise ConfigError(
            f"'{package}' is not a compiled KFP pipeline; fix: `sdarflow pipeline compile --output`"
        )
    return docs[0]


def upload(client, package: str, name: str | None = None, version_name: str | None = None) -> dict[str, str]:
    """Upload ``package`` as pipeline ``name`` (default: the spec's name), or as a new version if it exists."""
    spec = read_spec(package)
    name = name or spec["pipelineInfo"]["name"]
    description = spec["pipelineInfo"].get("description", "")
    pipeline_id = client.get_pipeline_id(name)
    if pipeline_id is None:
        pipeline_id = client.upload_pipeline(package, pipeline_name=name, description=description).pipeline_id
        version = _latest_version(client, pipeline_id)
    else:
        # Version names must be unique within a pipeline: the package version plus the upload time is.
        version_name = version_name or f"{name}-{__version__}-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S}"
        version = client.upload_pipeline_version(
            package, pipeline_version_name=version_name, pipeline_id=pipeline_id, description=description
        )
    return {"pipeline": name, "pipeline_id": pipeline_id, "version_id": version.pipeline_version_id}


def _latest_version(client, pipeline_id: str, version_name: str | None = None):
    flt = None
    if version_name:
        pred = {"operation": "EQUALS", "key": "display_name", "stringValue": version_name}
        flt = json.dumps({"predicates": [pred]})
    result = client.list_pipeline_versions(pipeline_id, page_size=1, sort_by="created_at desc", filter=flt)
    if not result.pipeline_versions:
        what = f"version '{version_name}'" if version_name else "versions"
        raise ConfigError(f"pipeline {pipeline_id} has no {what}; fix: `sdarflow pipeline upload` it")
    return result.pipeline_versions[0]


def resolve_source(
    client, package: str | None, pipeline: str | None, version_name: str | None = None
) -> Source:
    """``--package FILE`` or ``--pipeline NAME [--pipeline-version V]`` (exactly one) as a ``Source``."""
    if bool(package) == bool(pipeline):
        raise ConfigError("pass exactly one of --package FILE or --pipeline NAME")
    if package:
        return Source(package=package, spec=read_spec(package))
    pipeline_id = client.get_pipeline_id(pipeline)
    if pipeline_id is None:
        raise ConfigError(
            f"no pipeline named '{pipeline}' on the server; fix: `sdarflow pipeline upload --package FILE`"
        )
    version = _latest_version(client, pipeline_id, version_name)
    spec = version.pipeline_spec or {}
    # With a platform spec (Kubernetes settings) the server stores {"pipeline_spec": ..., "platform_spec": ...}.
    spec = spec.get("pipeline_spec", spec)
    return Source(pipeline_id=pipeline_id, version_id=version.pipeline_version_id, spec=spec)


# Python types a KFP parameter type accepts (int is a valid NUMBER_DOUBLE; bool is never a number).
_TYPES: dict[str, type | tuple[type, ...]] = {
    "NUMBER_INTEGER": int,
    "NUMBER_DOUBLE": (int, float),
    "BOOLEAN": bool,
    "STRUCT": dict,
    "LIST": list,
}


def _typed(key: str, kind: str, raw: str) -> Any:
    """A ``--param`` value as the parameter's type; strings stay verbatim (a run id '007' is not a number)."""
    if kind == "STRING":
        return raw
    value = yaml.safe_load(raw)
    expected = _TYPES.get(kind)
    if expected is None:
        return value
    if not isinstance(value, expected) or (isinstance(value, bool) and kind != "BOOLEAN"):
        raise ConfigError(f"pipeline parameter {key}={raw!r} is not a {kind}; fix: pass a {kind} value")
    return float(value) if kind == "NUMBER_DOUBLE" else value


def check_params(spec: dict | None, params: dict[str, str]) -> dict[str, Any]:
    """``KEY=VALUE`` strings typed by the spec's parameter types; unknown or missing required names fail."""
    if not spec:
        return {k: yaml.safe_load(v) for k, v in params.items()}
    declared = spec.get("root", {}).get("inputDefinitions", {}).get("parameters", {})
    unknown = sorted(set(params) - set(declared))
    if unknown:
        raise ConfigError(f"unknown pipeline parameter(s) {unknown}; valid: {', '.join(sorted(declared))}")
    missing = sorted(
        k
        for k, d in declared.items()
        if k not in params and "defaultValue" not in d and not d.get("isOptional")
    )
    if missing:
        raise ConfigError(
            f"missing required pipeline parameter(s) {missing}; fix: --param {missing[0]}=VALUE"
        )
    return {k: _typed(k, declared[k].get("parameterType", "STRING"), v) for k, v in params.items()}


def start_run(
    client,
    source: Source,
    params: dict[str, Any],
    *,
    experiment: str = DEFAULT_EXPERIMENT,
    run_name: str | None = None,
    service_account: str | None = None,
) -> dict[str, str]:
    exp = client.create_experiment(experiment)
    run_name = run_name or f"sdarflow-{dt.datetime.now(dt.UTC):%Y%m%d-%H%M%S}"
    run = client.run_pipeline(
        experiment_id=exp.experiment_id,
        job_name=run_name,
        params=params,
        service_account=service_account,
        **source.kwargs(),
    )
    return {"run_id": run.run_id, "experiment_id": exp.experiment_id, "name": run_name}


def check_cron(cron: str) -> str:
    fields = cron.split()
    if len(fields) != 6:
        hint = f"'0 {cron}'" if len(fields) == 5 else "'0 0 3 * * *' (03:00 every day)"
        raise ConfigError(
            f"cron '{cron}' has {len(fields)} fields; KFP's cron has 6 (seconds first); fix: {hint}"
        )
    return cron


def schedule(
    client,
    source: Source,
    params: dict[str, Any],
    *,
    cron: str,
    name: str,
    start_from: str = "production",
    experiment: str = DEFAULT_EXPERIMENT,
    service_account: str | None = None,
) -> dict[str, str]:
    """A recurring run: cron trigger, no catch-up (a paused schedule does not replay missed runs), at most one
    run at a time (each continues from production, so overlapping runs would train from the same start).

    ``start_from`` is the training pipeline's ``start_adapter``: each run resolves it when it starts, so
    ``production`` means the production adapter of that moment, not of when the schedule was made.
    """
    check_cron(cron)
    if params.get("run_id"):
        raise ConfigError(
            "a recurring run must not fix run_id: every run would write the same folder; fix: drop --param run_id"
        )
    if "start_adapter" in params:
        raise ConfigError(
            "set the start adapter of scheduled runs with --start-from, not --param start_adapter"
        )
    declared = (source.spec or {}).get("root", {}).get("inputDefinitions", {}).get("parameters", {})
    if start_from and "start_adapter" in declared:
        params = {**params, "start_adapter": start_from}
    exp = client.create_experiment(experiment)
    job = client.create_recurring_run(
        experiment_id=exp.experiment_id,
        job_name=name,
        description=f"sdarflow retraining, cron '{cron}', starting from {start_from or 'a new LoRA'}",
        cron_expression=cron,
        max_concurrency=1,
        no_catchup=True,
        params=params,
        service_account=service_account,
        **source.kwargs(),
    )
    return {"recurring_run_id": job.recurring_run_id, "experiment_id": exp.experiment_id, "name": name}
