"""Serving follows a promotion: roll the serving Deployment so its new pods fetch what the alias now points at.

A serving pod resolves ``<name>:production`` when it starts (its init container, ``registry serve-fetch``), so a
promotion reaches it only through a new pod. :class:`ServingRoll` is made before the alias moves: it reads the
Deployment and refuses one that cannot follow (missing, paused, pinning version numbers as ``registry
serve-config`` does, serving another name or registry) and one the caller may not patch (a server-side dry run;
an admission webhook that takes no dry runs only warns).
After the alias moves, :meth:`ServingRoll.roll` records the alias's last move in the pod template (the annotation
``sdarflow.io/versions``, JSON: ``{"name:alias": {"version": 7, "at": "<time of the move>"}}``, from the registry's
alias history); the changed template is what makes Kubernetes roll (the Deployment's ``RollingUpdate``: the new pod
serves before the old one stops). Each move has its own time, so every move rolls, even back to a version the
annotation names (after ``kubectl rollout undo`` it would be stale), and a promotion that moved nothing (a retry)
rolls only if the template does not hold the last move yet.

Credentials as kubectl finds them: ``$KUBECONFIG``, else ``~/.kube/config``, else the pod's service account. The
pipeline runner's right to get and patch the Deployment is k8s/serving/roller.yaml.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sdarflow.defaults import ADAPTERS_ANNOTATION, REGISTRY_ANNOTATION, VERSIONS_ANNOTATION
from sdarflow.errors import ConfigError, SdarflowError

if TYPE_CHECKING:
    from sdarflow.registry.store import Registry

log = logging.getLogger(__name__)

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# Another writer (kubectl, a second promotion) may change the Deployment between our read and our patch.
CONFLICT_RETRIES = 3
# (connect, read) seconds per request, each retried once on a connection error: the client waits forever by
# default, and an API server that accepts and never answers would hang the promotion. A pair, because the client
# ignores a lone float.
REQUEST_TIMEOUT_S = (10.0, 30.0)
CONNECTION_RETRIES = 1


def parse_target(target: str) -> tuple[str | None, str]:
    """``[NAMESPACE/]NAME`` -> (namespace or None, name)."""
    namespace, slash, name = target.rpartition("/")
    if not name or "/" in namespace or (slash and not namespace):
        raise ConfigError(
            f"serving deployment {target!r}: expected [NAMESPACE/]NAME; fix: e.g. sdarflow/sdarflow-serve"
        )
    return namespace or None, name


class ServingRoll:
    """The Deployment ``target`` ([NAMESPACE/]NAME) that serves ``name``'s ``stage`` from ``registry``, checked:
    constructing it refuses a Deployment that cannot follow the alias or that the caller may not patch, so a caller
    makes it before it moves the alias."""

    def __init__(self, target: str, registry: Registry, name: str, stage: str):
        from kubernetes.client import AppsV1Api

        namespace, self.deployment = parse_target(target)
        client, default_namespace = _api_client()
        self.namespace = namespace or default_namespace
        self.where = f"deployment {self.namespace}/{self.deployment}"
        self.registry, self.name, self.stage, self.key = registry, name, stage, f"{name}:{stage}"
        self.api = AppsV1Api(client)
        self._recorded(self._read())
        self._dry_run()

    def roll(self, version: int) -> str:
        """Record the alias's last move (its version and time, from the registry) in the pod template unless it is
        recorded there already; one line saying what happened. ``version``: the one the caller moved the alias to.
        Raised after the alias moved, an error says so and how to roll without moving it again."""
        try:
            last = self.registry.alias_history(self.name, self.stage)[-1]
            return self._roll({"version": last["version"], "at": last["at"]})
        except SdarflowError as err:
            flags = {
                "--registry": self.registry.uri,
                "--policy-name": self.name,
                "--stage": self.stage,
                "--version": str(version),
                "--roll-deployment": f"{self.namespace}/{self.deployment}",
            }
            again = shlex.join(
                ["sdarflow", "registry", "promote", *(x for flag in flags.items() for x in flag)]
            )
            raise ConfigError(
                f"{self.key} points at v{version} now, but serving did not roll: {err}; then run `{again}` "
                f"(it moves nothing and rolls)"
            ) from None

    def _roll(self, move: dict[str, Any]) -> str:
        for _ in range(CONFLICT_RETRIES):
            deployment = self._read()
            versions = self._recorded(deployment)
            entry = versions.get(self.key)
            was = entry.get("version") if isinstance(entry, dict) else None
            if entry == move:  # this move is what the template holds: a retried promotion rolls nothing
                return f"{self.where} already serves {self.key} v{move['version']}"
            versions[self.key] = move
            patch = {
                # The version read: the API server refuses the patch (409) if the Deployment changed since.
                "metadata": {"resourceVersion": deployment["metadata"].get("resourceVersion")},
                "spec": {
                    "template": {
                        "metadata": {
                            "annotations": {VERSIONS_ANNOTATION: json.dumps(versions, sort_keys=True)}
                        }
                    }
                },
            }
            try:
                with self._errors():
                    self.api.patch_namespaced_deployment(
                        self.deployment, self.namespace, patch, _request_timeout=REQUEST_TIMEOUT_S
                    )
                break
            except _Conflict:
                log.info("%s changed while rolling it; reading it again", self.where)
        else:
            raise ConfigError(
                f"{self.where} kept changing while it was rolled ({CONFLICT_RETRIES} tries); fix: wait"
            )
        line = f"{self.where} rolls to {self.key} v{move['version']}" + (
            f" (was v{was})" if was is not None else ""
        )
        log.info("%s", line)
        return line

    def _dry_run(self) -> None:
        """RBAC's patch verb and admission, without changing anything. An admission webhook that declares side
        effects refuses every dry run (HTTP 400 naming it), after RBAC allowed the patch: then only a warning."""
        from kubernetes.client.exceptions import ApiException

        try:
            with self._errors(raw=True):
                self.api.patch_namespaced_deployment(
                    self.deployment, self.namespace, {}, dry_run="All", _request_timeout=REQUEST_TIMEOUT_S
                )
        except ApiException as err:
            if err.status == 400 and "dry run" in str(err.body).lower():
                log.warning(
                    "%s: an admission webhook does not take dry runs; RBAC allowed the patch", self.where
                )
                return
            raise ConfigError(_api_error(err, self.where)) from None

    def _read(self) -> dict[str, Any]:
        with self._errors():
            found = self.api.read_namespaced_deployment(
                self.deployment, self.namespace, _request_timeout=REQUEST_TIMEOUT_S
            )
        return self.api.api_client.sanitize_for_serialization(found)

    def _recorded(self, deployment: dict[str, Any]) -> dict[str, Any]:
        """The versions the pod template records; refuses a Deployment that would not roll to ``key``."""
        if deployment.get("spec", {}).get("paused"):
            raise ConfigError(
                f"{self.where} is paused, so a changed template does not roll it; fix: `kubectl -n {self.namespace} "
                f"rollout resume deployment/{self.deployment}`"
            )
        annotations = (
            deployment.get("spec", {}).get("template", {}).get("metadata", {}).get("annotations") or {}
        )
        served = [s.strip() for s in str(annotations.get(ADAPTERS_ANNOTATION, "")).split(",") if s.strip()]
        if self.key not in served:
            pinned = [s for s in served if s.partition(":")[0] == self.name]
            why = (
                f"pins {', '.join(pinned)}, so a new pod serves the same version"
                if pinned
                else f"serves {served or 'no annotated adapter'}"
            )
            raise ConfigError(
                f"{self.where} {why}, not {self.key} ({ADAPTERS_ANNOTATION} in its pod template); fix: serve the "
                f"alias (k8s/serving), or regenerate a pinned Deployment with `sdarflow registry serve-config` and "
                f"apply it"
            )
        served_registry = annotations.get(REGISTRY_ANNOTATION)
        if served_registry is None or served_registry.rstrip("/") != self.registry.uri.rstrip("/"):
            raise ConfigError(
                f"{self.where} serves the registry {served_registry or '(not annotated: ' + REGISTRY_ANNOTATION + ')'}"
                f", not {self.registry.uri}; fix: roll the Deployment that serves this registry (k8s/serving "
                f"annotates it from its ConfigMap)"
            )
        try:
            versions = json.loads(annotations.get(VERSIONS_ANNOTATION) or "{}")
        except json.JSONDecodeError:
            versions = None
        if not isinstance(versions, dict):  # someone else's edit: start the record again
            log.warning("%s: %s is not a JSON object; writing it anew", self.where, VERSIONS_ANNOTATION)
            versions = {}
        return versions

    @contextlib.contextmanager
    def _errors(self, raw: bool = False):
        """The Kubernetes API's refusals as one line each (a conflict as :class:`_Conflict`, which roll retries;
        ``raw``: the API's own exception, for the caller to read)."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            yield
        except ApiException as err:
            if raw:
                raise
            if err.status == 409:
                raise _Conflict from None
            raise ConfigError(_api_error(err, self.where)) from None
        except (HTTPError, OSError) as err:  # urllib3's MaxRetryError, whose reason says: refused, no answer
            cause = getattr(err, "reason", None)
            raise ConfigError(
                f"{self.where}: the Kubernetes API is unreachable or did not answer "
                f"({type(cause if isinstance(cause, Exception) else err).__name__}); fix: check the kubeconfig's "
                f"server and the network"
            ) from None


class _Conflict(Exception):
    """The Deployment changed between the read and the patch (HTTP 409)."""


def _api_client():
    """(ApiClient, default namespace), found as kubectl finds them: ``$KUBECONFIG``, else ``~/.kube/config``,
    else (neither there) the pod's service account."""
    import yaml
    from kubernetes import client, config

    configuration = client.Configuration()
    # paths joined by ':' merge, as kubectl merges them
    path = os.environ.get("KUBECONFIG") or str(Path("~/.kube/config").expanduser())
    try:
        if (
            not os.environ.get("KUBECONFIG")
            and not Path(path).is_file()
            and (SERVICE_ACCOUNT / "token").is_file()
        ):
            config.load_incluster_config(client_configuration=configuration)
            namespace = (SERVICE_ACCOUNT / "namespace").read_text().strip()
        else:
            config.load_kube_config(config_file=path, client_configuration=configuration)
            _, context = config.list_kube_config_contexts(config_file=path)
            namespace = (context.get("context") or {}).get("namespace") or "default"
    except (config.ConfigException, yaml.YAMLError, OSError, KeyError, TypeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(
            f"no usable Kubernetes credentials to roll serving with ({first}); fix: run in the cluster with "
            f"k8s/serving's role, or set KUBECONFIG"
        ) from None
    configuration.retries = CONNECTION_RETRIES
    return client.ApiClient(configuration), namespace


def _api_error(err, where: str) -> str:
    """One line for the Kubernetes API's refusal."""
    if err.status == 404:
        return f"{where} not found; fix: apply serving first (k8s/README step 9), or name the right NAMESPACE/NAME"
    if err.status in (401, 403):
        return (
            f"{where}: the caller may not read and patch it (HTTP {err.status}); fix: bind k8s/serving's role "
            f"sdarflow-serve-roller to the caller's service account (k8s/README step 9)"
        )
    return f"{where}: the Kubernetes API answered HTTP {err.status} ({err.reason}); fix: retry, or roll it by hand"
