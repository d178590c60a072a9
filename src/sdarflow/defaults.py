"""Names that several layers share and that must cost nothing to import (the CLI builds flags from them, the KFP
components and Kubernetes manifests use them): defined here once, with no dependency."""

# The Kubernetes Secret (k8s/base) whose AWS_* keys pods, jobs and servers get as environment variables.
S3_SECRET = "sdarflow-s3"
# The registry's stage aliases; only production is gated.
RELEASE_STAGES: tuple[str, ...] = ("production", "staging")
# The name a pipeline registers its adapters under unless told.
DEFAULT_POLICY_NAME = "sdar-policy"
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
