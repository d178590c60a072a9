"""Serving follows a promotion: roll the serving Deployment so its new pods fetch what the alias now points at.

A serving pod resolves ``<name>:production`` when it starts (its init container, ``registry serve-fetch``), so a
promotion reaches it only through a new pod. After the alias moves, :func:`roll_serving` records the version in
the Deployment's pod template (the annotation ``sdarflow.io/versions``, a JSON map of ``name:alias`` to version);
a changed template is what makes Kubernetes roll (the Deployment's ``RollingUpdate``: the new pod serves before
the old one stops). The same version again changes nothing, so a retried promotion does not roll twice.

A Deployment that pins version numbers (``registry serve-config``) would restart into the same versions: it is
refused, as is one that does not serve the alias. The caller needs ``get`` and ``patch`` on the Deployment
(k8s/serving's Role for the pipeline runner); credentials come from the pod's service account in a cluster, else
from the kubeconfig (``$KUBECONFIG`` or ``~/.kube/config``), as ``kubectl`` reads them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from sdarflow.errors import ConfigError

log = logging.getLogger(__name__)

ADAPTERS_ANNOTATION = (
    "sdarflow.io/adapters"  # what the pods serve: name:alias or name:version, comma-separated
)
REGISTRY_ANNOTATION = "sdarflow.io/registry"
VERSIONS_ANNOTATION = "sdarflow.io/versions"
SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# Another writer (kubectl, a second promotion) may change the Deployment between our read and our patch.
CONFLICT_RETRIES = 3
# (connect, read) seconds. The client waits forever by default: an API server that accepts and never answers would
# hang the promotion. A pair, because the client ignores a lone float.
REQUEST_TIMEOUT_S = (10.0, 30.0)


def parse_target(target: str) -> tuple[str | None, str]:
    """``[NAMESPACE/]NAME`` -> (namespace or None, name)."""
    namespace, slash, name = target.rpartition("/")
    if not name or "/" in namespace or (slash and not namespace):
        raise ConfigError(
            f"serving deployment {target!r}: expected [NAMESPACE/]NAME; fix: e.g. sdarflow/sdarflow-serve"
        )
    return namespace or None, name


class ServingRoll:
    """The Deployment ``target`` ([NAMESPACE/]NAME) that serves ``name``'s ``stage`` from ``registry_uri``.
    Constructing it reads the Deployment and refuses one that cannot follow the alias, so a caller checks before
    it moves the alias; :meth:`roll` then records the version the alias points at."""

    def __init__(self, target: str, registry_uri: str, name: str, stage: str):
        from kubernetes.client import AppsV1Api

        namespace, self.deployment = parse_target(target)
        client, default_namespace = _api_client()
        self.namespace = namespace or default_namespace
        self.where = f"deployment {self.namespace}/{self.deployment}"
        self.registry_uri, self.name, self.stage = registry_uri, name, stage
        self.api = AppsV1Api(client)
        # Refuses now, before the caller moves anything.
        _template_patch(self._read(), self.where, registry_uri, name, stage, None)

    def roll(self, version: int) -> str:
        """Patch the pod template when ``version`` differs from the one recorded there; one line saying what
        happened."""
        key = f"{self.name}:{self.stage}"
        for attempt in range(CONFLICT_RETRIES):
            patch, was = _template_patch(
                self._read(), self.where, self.registry_uri, self.name, self.stage, version
            )
            if patch is None:
                return f"{self.where} already serves {key} v{version}"
            try:
                with self._errors():
                    self.api.patch_namespaced_deployment(
                        self.deployment, self.namespace, patch, _request_timeout=REQUEST_TIMEOUT_S
                    )
                break
            except _Conflict:
                if attempt == CONFLICT_RETRIES - 1:
                    raise ConfigError(
                        f"{self.where} kept changing while it was rolled ({CONFLICT_RETRIES} tries); fix: run the "
                        f"same command again"
                    ) from None
                log.info("%s changed while rolling it; reading it again", self.where)
        line = f"{self.where} rolls to {key} v{version}" + (f" (was v{was})" if was is not None else "")
        log.info("%s", line)
        return line

    def _read(self) -> dict[str, Any]:
        with self._errors():
            found = self.api.read_namespaced_deployment(
                self.deployment, self.namespace, _request_timeout=REQUEST_TIMEOUT_S
            )
        return self.api.api_client.sanitize_for_serialization(found)

    @contextlib.contextmanager
    def _errors(self):
        """The Kubernetes API's refusals as one line each (a conflict as :class:`_Conflict`, which roll retries)."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            yield
        except ApiException as err:
            if err.status == 409:
                raise _Conflict from None
            raise ConfigError(_api_error(err, self.where)) from None
        except (HTTPError, OSError) as err:  # urllib3's MaxRetryError, whose reason says: refused, no answer
            cause = getattr(err, "reason", None)
            raise ConfigError(
                f"{self.where}: the Kubernetes API is unreachable or did not answer "
                f"({type(cause if isinstance(cause, Exception) else err).__name__}); fix: "
                f"check the kubeconfig's server and the network"
            ) from None


class _Conflict(Exception):
    """The Deployment changed between the read and the patch (HTTP 409)."""


def _template_patch(
    deployment: dict[str, Any], where: str, registry_uri: str, name: str, stage: str, version: int | None
) -> tuple[dict[str, Any] | None, int | None]:
    """The merge patch that records ``version`` in the pod template (None when it is recorded already, or when
    ``version`` is None: only the checks), and the version recorded before; refuses a Deployment that does not
    serve ``name:stage`` from ``registry_uri``."""
    template = deployment.get("spec", {}).get("template", {}).get("metadata", {})
    annotations = template.get("annotations") or {}
    served = [s.strip() for s in str(annotations.get(ADAPTERS_ANNOTATION, "")).split(",") if s.strip()]
    key = f"{name}:{stage}"
    if key not in served:
        pinned = [s for s in served if s.partition(":")[0] == name]
        why = (
            f"pins {', '.join(pinned)}, so a new pod serves the same version"
            if pinned
            else f"serves {served or 'no annotated adapter'}"
        )
        raise ConfigError(
            f"{where} {why}, not {key} ({ADAPTERS_ANNOTATION} in its pod template); fix: serve the alias "
            f"(k8s/serving), or regenerate a pinned Deployment with `sdarflow registry serve-config` and apply it"
        )
    served_registry = annotations.get(REGISTRY_ANNOTATION)
    if served_registry and served_registry.rstrip("/") != registry_uri.rstrip("/"):
        raise ConfigError(
            f"{where} serves the registry {served_registry}, not {registry_uri}; fix: roll the Deployment that "
            f"serves this registry"
        )
    try:
        versions = json.loads(annotations.get(VERSIONS_ANNOTATION) or "{}")
    except json.JSONDecodeError:
        versions = None
    if not isinstance(versions, dict):  # someone else's edit: start the record again
        log.warning("%s: %s is not a JSON object; writing it anew", where, VERSIONS_ANNOTATION)
        versions = {}
    was = versions.get(key)
    if version is None or was == version:
        return None, was
    versions[key] = version
    patch = {
        # The version read: the API server refuses the patch (409) if the Deployment changed since.
        "metadata": {"resourceVersion": deployment.get("metadata", {}).get("resourceVersion")},
        "spec": {
            "template": {
                "metadata": {"annotations": {VERSIONS_ANNOTATION: json.dumps(versions, sort_keys=True)}}
            }
        },
    }
    return patch, was if isinstance(was, int) else None


def _api_client():
    """(ApiClient, default namespace): the pod's service account in a cluster, else the kubeconfig's context."""
    from kubernetes import client, config

    if SA_NAMESPACE.is_file():
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)
        return client.ApiClient(configuration), SA_NAMESPACE.read_text().strip()
    # kubectl's order: $KUBECONFIG (paths joined by ':'), else ~/.kube/config; read now, not at import time
    path = os.environ.get("KUBECONFIG") or "~/.kube/config"
    try:
        api = config.new_client_from_config(config_file=path)
        _, context = config.list_kube_config_contexts(config_file=path)
    except (config.ConfigException, OSError) as err:
        raise ConfigError(
            f"no Kubernetes credentials to roll serving with ({err}); fix: run in the cluster with k8s/serving's "
            f"role, or set KUBECONFIG"
        ) from None
    return api, (context.get("context") or {}).get("namespace") or "default"


def _api_error(err, where: str) -> str:
    """One line for the Kubernetes API's refusal."""
    if err.status == 404:
        return f"{where} not found; fix: apply serving first (k8s/README step 9), or name the right [NAMESPACE/]NAME"
    if err.status in (401, 403):
        return (
            f"{where}: the caller may not read and patch it (HTTP {err.status}); fix: apply k8s/serving's role for "
            f"the pipeline runner's service account (k8s/README step 9)"
        )
    return f"{where}: the Kubernetes API answered HTTP {err.status} ({err.reason}); fix: retry, or roll it by hand"
