"""Conditional object writes for the state concurrent runs share (the next version number, the aliases):
create-if-absent and compare-and-swap (CAS). S3: conditional PUTs through boto3 (``IfNoneMatch="*"`` to create,
``IfMatch=<etag>`` to swap; the loser gets 412). Local: ``O_CREAT | O_EXCL`` to create, and read-compare-write-
``os.replace`` under an ``fcntl.flock`` lock file to swap. An etag is opaque: S3's ETag, or a local file's sha256.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs

from sdarflow import storage
from sdarflow.errors import StorageError
from sdarflow.registry.errors import RegistryConflict
from sdarflow.storage.files import reachable, sha256

log = logging.getLogger(__name__)

# S3 error codes that mean "the condition did not hold": 412 for IfNoneMatch/IfMatch, 409 when two conditional
# writes to one key overlap on the server, NoSuchKey when the object was deleted between our read and IfMatch.
_S3_CONFLICT_CODES = {"PreconditionFailed", "ConditionalRequestConflict", "NoSuchKey", "412", "409"}


def _local_path(uri: str) -> str | None:
    loc = storage.resolve(uri)
    return loc.path if isinstance(loc.fs, pafs.LocalFileSystem) else None


def _bucket_key(uri: str) -> tuple[str, str]:
    bucket, _, key = storage.resolve(uri).path.partition("/")
    if not key:
        raise StorageError(f"'{uri}' names a bucket, not an object; fix: use s3://<bucket>/<prefix>")
    return bucket, key


@contextlib.contextmanager
def _io(uri: str, action: str) -> Iterator[None]:
    """Local and S3 transport errors as one StorageError line naming the URI and the fix."""
    from botocore.exceptions import BotoCoreError

    with reachable(storage.resolve(uri), action, (OSError, BotoCoreError)):
        yield


_client_lock = threading.Lock()


@functools.cache
def _cached_client(endpoint: str | None, region: str, access_key: str | None) -> Any:
    import boto3
    from botocore.config import Config

    # A fresh Session per client: boto3's default session is not thread-safe to create clients from.
    session = boto3.session.Session()
    config = Config(connect_timeout=5, read_timeout=30, retries={"max_attempts": 2, "mode": "standard"})
    return session.client("s3", endpoint_url=endpoint, region_name=region, config=config)


def _s3_client() -> Any:
    endpoint = os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL_S3") or None
    region = os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION") or "us-east-1"
    # Keyed by endpoint and key id so a changed environment (tests, profiles) gets its own client.
    with _client_lock:
        return _cached_client(endpoint, region, os.environ.get("AWS_ACCESS_KEY_ID"))


def create_exclusive(uri: str, data: bytes) -> bool:
    """Create ``uri`` holding ``data`` only if it does not exist. True if we created it, False if it existed."""
    path = _local_path(uri)
    if path is not None:
        with _io(uri, "create"):
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        return True
    response = _s3_request(uri, "create", "put_object", _S3_CONFLICT_CODES, Body=data, IfNoneMatch="*")
    return response is not None


def _s3_request(uri: str, action: str, method: str, quiet: set[str], **kwargs: Any) -> Any:
    """An S3 request's response; None when it fails with a ``quiet`` code (a lost condition, a missing object)."""
    from botocore.exceptions import ClientError

    bucket, key = _bucket_key(uri)
    with _io(uri, action):
        try:
            return getattr(_s3_client(), method)(Bucket=bucket, Key=key, **kwargs)
        except ClientError as err:
            if str((err.response or {}).get("Error", {}).get("Code", "")) in quiet:
                return None
            raise StorageError(
                f"cannot {action} '{uri}': {err}; fix: check the bucket and credentials"
            ) from err


def read_versioned(uri: str) -> tuple[bytes | None, str | None]:
    """Read ``uri`` with its etag; ``(None, None)`` when it does not exist. Pass the etag to :func:`cas_write`."""
    path = _local_path(uri)
    if path is not None:
        with _io(uri, "read"):
            try:
                data = Path(path).read_bytes()
            except FileNotFoundError:
                return None, None
        return data, sha256(data)
    response = _s3_request(uri, "read", "get_object", {"NoSuchKey", "404"})
    if response is None:
        return None, None
    with _io(uri, "read"):
        return response["Body"].read(), response["ETag"]


def cas_write(uri: str, data: bytes, expected_etag: str | None) -> str:
    """Replace ``uri`` with ``data`` only if it still has ``expected_etag`` (``None``: only if it does not exist
    yet). Returns the new etag; raises :class:`RegistryConflict` if someone else wrote it in between."""
    path = _local_path(uri)
    if path is not None:
        return _local_cas(uri, path, data, expected_etag)

    condition = {"IfNoneMatch": "*"} if expected_etag is None else {"IfMatch": expected_etag}
    response = _s3_request(uri, "write", "put_object", _S3_CONFLICT_CODES, Body=data, **condition)
    if response is None:
        raise _conflict(uri)
    return response["ETag"]


def _local_cas(uri: str, path: str, data: bytes, expected_etag: str | None) -> str:
    target = Path(path)
    with _io(uri, "write"):
        target.parent.mkdir(parents=True, exist_ok=True)
        # flock locks an open file description, so two threads of one process exclude each other too.
        with open(f"{path}.lock", "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                current = target.read_bytes()
            except FileNotFoundError:
                current = None
            current_etag = None if current is None else sha256(current)
            if current_etag != expected_etag:
                raise _conflict(uri)
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, target)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
    return sha256(data)


def _conflict(uri: str) -> RegistryConflict:
    return RegistryConflict(
        f"'{uri}' was changed by someone else since it was read; fix: retry (the retry re-reads the new state)"
    )
