"""Storage URIs (plain path, ``file://``, ``s3://``) through ``pyarrow.fs``: resolving them, confining relative
paths read from data to their root, and whole-object reads and writes (bytes, JSON). S3 endpoints come from
``AWS_ENDPOINT_URL`` and credentials from the standard AWS environment variables (never from configs).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.fs as pafs

from sdarflow.errors import SchemaError, StorageError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Location:
    """A resolved URI: the filesystem and the path inside it."""

    fs: pafs.FileSystem
    path: str
    uri: str


def _s3_filesystem(uri: str) -> pafs.S3FileSystem:
    endpoint = os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL_S3")
    kwargs: dict = {
        "connect_timeout": 5,
        "request_timeout": 30,
        # Few retries: an unreachable endpoint should fail in seconds with a clear message, not minutes.
        "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=2),
        "region": os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION") or "us-east-1",
    }
    if endpoint:
        parsed = urlparse(endpoint)
        kwargs["endpoint_override"] = parsed.netloc or parsed.path
        kwargs["scheme"] = parsed.scheme or "https"
    return pafs.S3FileSystem(**kwargs)


def resolve(uri: str) -> Location:
    """Map a URI to (filesystem, path). Plain paths and ``file://`` are local; ``s3://bucket/key`` is S3."""
    uri = str(uri)
    if uri.startswith("s3://"):
        path = uri[len("s3://") :].rstrip("/")
        if not path or len(path.split("/")[0]) < 3:
            raise StorageError(f"bad S3 URI '{uri}': expected s3://<bucket (3+ chars)>/<prefix>")
        return Location(_s3_filesystem(uri), path, "s3://" + path)
    if "://" in uri and not uri.startswith("file://"):
        raise StorageError(f"unsupported URI scheme in '{uri}': use a local path, file:// or s3://")
    local = Path(uri.removeprefix("file://")).expanduser().absolute()
    return Location(pafs.LocalFileSystem(), str(local), str(local))


def join(uri: str, *parts: str) -> str:
    return "/".join([str(uri).rstrip("/"), *[p.strip("/") for p in parts]])


def confined(rel: object, what: str) -> str:
    """A relative path read from data (a manifest entry, a skill file name) checked before any use: a non-empty
    POSIX path that stays inside its folder. StorageError naming ``what`` for anything else: an absolute path, a
    drive, a ``..`` or ``.`` or empty part, a backslash or a NUL."""
    if not isinstance(rel, str) or not rel:
        raise StorageError(f"{what}: path {rel!r} is not a file name; fix: a relative path inside the folder")
    parts = rel.split("/")
    if (
        rel.startswith("/")
        or "\\" in rel
        or "\0" in rel
        or parts[0][1:2] == ":"
        or any(p in ("", ".", "..") for p in parts)
    ):
        raise StorageError(
            f"{what}: path {rel!r} leaves its folder (absolute, a drive, '..' or an empty part); "
            f"fix: a relative path inside the folder"
        )
    return rel


def inside(root: str | Path, rel: object, what: str) -> Path:
    """``root / rel`` on local disk once ``rel`` is ``confined`` and does not resolve out of ``root`` through a
    symlink."""
    rel = confined(rel, what)
    try:
        base = Path(root).resolve()
        escapes = not (base / rel).resolve().is_relative_to(base)
    except (OSError, RuntimeError) as err:  # RuntimeError: a symlink loop
        raise StorageError(
            f"{what}: {rel!r} cannot be resolved ({err}); fix: replace the links with files"
        ) from err
    target = base / rel
    if escapes:
        raise StorageError(
            f"{what}: {rel!r} resolves outside {base} through a symlink; fix: replace the link with the file"
        )
    return target


@contextlib.contextmanager
def reachable(loc: Location, action: str, errors: tuple = (OSError, pa.ArrowException)) -> Iterator[None]:
    """Turn low-level I/O ``errors`` into one StorageError line that names the URI and the fix."""
    try:
        yield
    except (SchemaError, StorageError):
        raise
    except errors as err:
        hint = "check the path and permissions"
        if loc.uri.startswith("s3://"):
            endpoint = os.environ.get("AWS_ENDPOINT_URL", "<AWS default>")
            hint = (
                f"check AWS_ENDPOINT_URL ({endpoint}), the bucket and the AWS credentials in the environment"
            )
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise StorageError(f"cannot {action} '{loc.uri}': {first}; fix: {hint}") from err


def children(uri: str) -> list[str]:
    """Base names directly under ``uri`` (files and folders); empty when it does not exist."""
    loc = resolve(uri)
    try:
        infos = loc.fs.get_file_info(pafs.FileSelector(loc.path, allow_not_found=True))
    except FileNotFoundError:
        # A folder another writer is creating can vanish between pyarrow's existence check and its listing
        # (seen with concurrent registers): treat it as empty; version claims stay exclusive regardless.
        return []
    except (OSError, pa.ArrowException) as err:
        raise StorageError(f"cannot list '{loc.uri}': {err}; fix: check the URI and credentials") from err
    return sorted({info.base_name for info in infos})


def exists(uri: str) -> bool:
    loc = resolve(uri)
    with reachable(loc, "read"):
        return loc.fs.get_file_info(loc.path).type != pafs.FileType.NotFound


def read_bytes(uri: str) -> bytes:
    loc = resolve(uri)
    with reachable(loc, "read"):
        if loc.fs.get_file_info(loc.path).type == pafs.FileType.NotFound:
            raise StorageError(
                f"'{loc.uri}' does not exist; fix: check the URI or run the stage that writes it"
            )
        with loc.fs.open_input_stream(loc.path) as f:
            return f.read()


def write_bytes(uri: str, data: bytes) -> None:
    """Write a whole object: readers see the old one or the new one, never a part (an S3 PUT is atomic; a local
    file is written beside its name and renamed into place)."""
    loc = resolve(uri)
    with reachable(loc, "write"):
        parent = loc.path.rsplit("/", 1)[0]
        loc.fs.create_dir(parent, recursive=True)
        local = isinstance(loc.fs, pafs.LocalFileSystem)
        target = f"{parent}/.{loc.path.rsplit('/', 1)[1]}.{uuid.uuid4().hex[:8]}.tmp" if local else loc.path
        with loc.fs.open_output_stream(target) as f:
            f.write(data)
        if local:
            os.replace(target, loc.path)


def read_json(uri: str) -> dict:
    return parse_json(read_bytes(uri), uri)


def parse_json(raw: bytes, uri: str) -> dict:
    try:
        return json.loads(raw)
    except RecursionError as err:
        raise StorageError(
            f"'{uri}' is nested too deeply to be a file sdarflow wrote; fix: regenerate it"
        ) from err
    except json.JSONDecodeError as err:
        raise StorageError(
            f"'{uri}' is not valid JSON ({err.msg} at line {err.lineno}); fix: regenerate it"
        ) from err
    except UnicodeDecodeError as err:
        raise StorageError(f"'{uri}' is not UTF-8 text ({err.reason}); fix: regenerate it") from err


def write_json(uri: str, obj: dict) -> None:
    write_bytes(uri, json.dumps(obj, indent=2, sort_keys=True).encode())


def delete_tree(uri: str) -> None:
    loc = resolve(uri)
    with reachable(loc, "delete"):
        if loc.fs.get_file_info(loc.path).type != pafs.FileType.NotFound:
            loc.fs.delete_dir(loc.path)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: Path) -> str:
    """sha256 of a local file, read in 1 MiB blocks (model weights do not fit in memory twice)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
