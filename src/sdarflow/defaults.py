"""Names that several layers share and that must cost nothing to import (the CLI builds flags from them, the KFP
components and Kubernetes manifests use them): defined here once, with no dependency but the errors."""

import re

from sdarflow.errors import ConfigError

# The Kubernetes Secret (k8s/base) whose AWS_* keys pods, jobs and servers get as environment variables.
S3_SECRET = "sdarflow-s3"
# The registry's stage aliases; only production is gated.
RELEASE_STAGES: tuple[str, ...] = ("production", "staging")
# What only the registry writes in a name's folder (registry/layout.py has the whole layout), named here so that
# storage can refuse every other writer there: the audit log, the version claims, the gate policy, and the kind of
# the one artifact published there, a version.
REGISTRY_AUDIT = "audit"
REGISTRY_CLAIMS = "claims"
GATE_POLICY = "gate_policy.json"
VERSION_KIND = "sdarflow-adapter-version"
# The name a pipeline registers its adapters under unless told.
DEFAULT_POLICY_NAME = "sdar-policy"
# A serving Deployment's pod-template annotations (serve-config and k8s/serving write them, registry/roll.py reads
# and writes them): what the pods serve (name:alias or name:version, comma-separated), from which registry, and
# the alias moves the template was rolled for.
ADAPTERS_ANNOTATION = "sdarflow.io/adapters"
REGISTRY_ANNOTATION = "sdarflow.io/registry"
VERSIONS_ANNOTATION = "sdarflow.io/versions"
# The non-root user our images run as (images/Dockerfile.*: USER 10001). Every pod we compile or ship runs with
# the security contexts below, so that a namespace enforcing Pod Security "restricted" admits it: the pod runs as a
# non-root user (an image's USER does not satisfy runAsNonRoot's check: the pod spec must say so) under the
# runtime's default seccomp profile; each container drops every capability and cannot gain privileges.
RUN_AS_UID = 10001


def pod_security_context(uid: int | None = RUN_AS_UID) -> dict:
    """A pod's ``securityContext``: non-root, as ``uid`` (user and group; None: the platform assigns one, as
    OpenShift's restricted SCC does), RuntimeDefault seccomp."""
    ids = {"runAsUser": uid, "runAsGroup": uid} if uid is not None else {}
    return {"runAsNonRoot": True, **ids, "seccompProfile": {"type": "RuntimeDefault"}}


def container_security_context() -> dict:
    """A container's ``securityContext``: no privilege escalation, every capability dropped."""
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


# The quantities both KFP's SDK (PipelineTask.set_cpu_*/set_memory_*) and the API server accept: Kubernetes'
# grammar narrowed to KFP's forms (KFP's "K" is no Kubernetes suffix and Kubernetes' "k" no KFP one, so neither).
_QUANTITY = {
    "CPU": (re.compile(r"([0-9]*\.)?[0-9]+m?"), "2, 0.5 or 500m"),
    "size": (re.compile(r"[0-9]+(Ei|Pi|Ti|Gi|Mi|Ki|E|P|T|G|M)?"), "16Gi, 512Mi or 20G"),
}


def quantity(value: str, what: str, kind: str = "size") -> None:
    """Refuse ``value`` now, in one line, unless it is a Kubernetes ``kind`` quantity ("CPU" or "size": memory,
    volumes), where the API server would refuse the pod only when it runs. One set of forms for every size we
    take (the ones KFP accepts too), so a value that works in one place works in all."""
    pattern, example = _QUANTITY[kind]
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise ConfigError(
            f"{what}: {value!r} is not a {kind} in the forms sdarflow takes (those Kubernetes and KFP both "
            f"accept); fix: e.g. {example}"
        )


def volume_sizes(what: str, sizes: dict[str, str]) -> None:
    """Each flag's volume size, where given ('' = none), as :func:`quantity` checks it."""
    for flag, size in sizes.items():
        if size:
            quantity(size, f"{what}: {flag}")
