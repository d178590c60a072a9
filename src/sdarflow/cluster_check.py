"""What a team checks before its first run: does a pod wired as the train task's (``sdarflow pipeline smoke``)
start, run as a non-root user, reach the storage with the Secret's credentials, and find its model cache,
``/dev/shm`` and GPUs? Each check says what it saw and, when it fails, the compile flag or manifest that fixes it.
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

from sdarflow import storage
from sdarflow.errors import SdarflowError

log = logging.getLogger(__name__)

GIB = 1 << 30
MIN_SHM_GIB = 1  # NCCL and vLLM's workers share tensors through /dev/shm; Docker's default 64 MiB fails them


class ClusterCheckFailed(SdarflowError):
    """At least one check failed."""


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    seen: str
    fix: str = ""


def _user() -> Check:
    uid, gid = os.getuid(), os.getgid()
    return Check(
        "non-root user", uid != 0, f"uid {uid}, gid {gid}",
        "compile with --run-as-user UID (the images' user is 10001) so Pod Security restricted admits the pods",
    )  # fmt: skip


def _credentials(uri: str) -> Check:
    keys = [k for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY") if os.environ.get(k)]
    web_identity = bool(os.environ.get("AWS_ROLE_ARN") and os.environ.get("AWS_WEB_IDENTITY_TOKEN_FILE"))
    if not uri.startswith("s3://"):
        return Check("S3 credentials", True, "not needed (local storage)")
    seen = "web identity (IRSA)" if web_identity else (", ".join(keys) or "none")
    if os.environ.get("AWS_ENDPOINT_URL"):
        seen += f"; endpoint {os.environ['AWS_ENDPOINT_URL']}"
    return Check(
        "S3 credentials", web_identity or len(keys) == 2, seen,
        "create the sdarflow-s3 Secret in the run's namespace (k8s/README step 3), or compile with --s3-secret NAME",
    )  # fmt: skip


def _round_trip(uri: str, run_id: str) -> Check:
    folder = storage.join(uri, "smoke", f"{run_id}-{uuid.uuid4().hex[:8]}")  # ours alone: deleted after
    probe, data = storage.join(folder, "probe.txt"), f"sdarflow smoke {run_id}\n".encode()
    fix = "check the storage URI, the bucket, AWS_ENDPOINT_URL and that the key may read, write and delete there"
    try:
        try:
            storage.write_bytes(probe, data)
            back = storage.read_bytes(probe)
        finally:  # nothing left behind, whichever step failed
            storage.delete_tree(folder)
    except (SdarflowError, OSError) as err:
        return Check("storage write, read, delete", False, str(err).splitlines()[0], fix)
    return Check("storage write, read, delete", back == data, f"{len(data)} bytes at {probe}", fix)


def _cache() -> Check:
    fix = "compile with --model-cache-size SIZE (an emptyDir the base model is copied into)"
    root = os.environ.get("SDARFLOW_CACHE")
    if not root:
        return Check(
            "model cache", False, "SDARFLOW_CACHE is not set: models go to the container's disk", fix
        )
    try:
        Path(root).mkdir(parents=True, exist_ok=True)
        probe = Path(root) / f".smoke-{uuid.uuid4().hex[:8]}"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as err:
        return Check("model cache", False, f"{root} is not writable ({err.strerror})", fix)
    return Check("model cache", True, f"{root}, {shutil.disk_usage(root).free / GIB:.1f} GiB free", fix)


def _shm(gpus: int) -> Check:
    shm = Path("/dev/shm")
    size = shutil.disk_usage(shm).total / GIB if shm.is_dir() else 0.0
    return Check(
        "/dev/shm", gpus == 0 or size >= MIN_SHM_GIB, f"{size:.2f} GiB" + ("" if gpus else " (no GPUs asked)"),
        f"compile with --shm-size (at least {MIN_SHM_GIB}Gi; a memory-backed emptyDir)",
    )  # fmt: skip


def _gpus(gpus: int) -> Check:
    import torch

    found = torch.cuda.device_count() if torch.cuda.is_available() else 0
    names = sorted({torch.cuda.get_device_name(i) for i in range(found)})
    return Check(
        "GPUs", found >= gpus, f"{found} visible ({', '.join(names) or 'none'}), {gpus} asked",
        "check the GPU pool's device plugin and the compile flags --gpus, --node-selector and --toleration",
    )  # fmt: skip


def check_cluster(uri: str, gpus: int, run_id: str) -> list[Check]:
    """Every check, in the order a failure is easiest to fix, each logged."""
    credentials, trip = _credentials(uri), _round_trip(uri, run_id)
    if (
        trip.ok and not credentials.ok
    ):  # another credential source (EKS Pod Identity, an instance role) worked
        credentials = Check(credentials.name, True, f"{credentials.seen}; the round trip worked without them")
    checks = [_user(), credentials, trip, _cache(), _shm(gpus), _gpus(gpus)]
    for c in checks:
        log.info("smoke: %s: %s (%s)", c.name, "ok" if c.ok else "FAILED", c.seen)
    return checks


def raise_failed(checks: list[Check]) -> None:
    """ClusterCheckFailed, one line naming each failed check and its fix, if any failed."""
    failed = [c for c in checks if not c.ok]
    if failed:
        raise ClusterCheckFailed(
            "smoke: " + "; ".join(f"{c.name} failed ({c.seen}); fix: {c.fix}" for c in failed)
        )


def markdown(checks: list[Check]) -> str:
    rows = [
        f"| {c.name} | {'ok' if c.ok else 'FAILED'} | {c.seen} | {'' if c.ok else c.fix} |" for c in checks
    ]
    return "\n".join(["| check | result | seen | fix |", "|---|---|---|---|", *rows]) + "\n"
