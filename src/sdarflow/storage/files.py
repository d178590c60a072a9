"""Storage URIs (plain path, ``file://``, ``s3://``) through ``pyarrow.fs``: resolving them, confining relative
paths read from data to their root, and whole-object reads and writes (bytes, JSON). S3 endpoints come from
``AWS_ENDPOINT_URL`` and credentials from the standard AWS environment variables (never from configs).

Atomic publish of artifacts. Every artifact sdarflow writes (a Parquet dataset, a skill library, an adapter, a
report) is a *folder* whose ``_manifest.json`` is written last: a folder without a manifest does not exist for
readers, and readers read only the files the manifest lists. A failed write removes what it wrote, so nothing
half-published is left behind. Replacing a published artifact (``--overwrite``) writes the new files beside the old
ones, in a generation folder the new manifest names as its ``prefix``; the manifest swap is the commit, so an
interrupted overwrite leaves the old artifact readable.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import io
import json
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from sdarflow import __version__, stopping
from sdarflow.config import FileSchema, opt
from sdarflow.defaults import GATE_POLICY, REGISTRY_AUDIT, REGISTRY_CLAIMS, VERSION_KIND
from sdarflow.errors import ConfigError, SchemaError, StorageError
from sdarflow.schema import check_turns_unique, fingerprint, validate

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Location:
    """A resolved URI: the filesystem and the path inside it."""

    fs: pafs.FileSystem
    path: str
    uri: str


def _s3_filesystem() -> pafs.S3FileSystem:
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
        return Location(_s3_filesystem(), path, "s3://" + path)
    if "://" in uri and not uri.startswith("file://"):
        raise StorageError(f"unsupported URI scheme in '{uri}'; fix: use a local path, file:// or s3://")
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
    """``root / rel`` once ``rel`` is ``confined`` and does not resolve out of ``root`` through a symlink."""
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


def registry_folder_of(uri: str) -> str | None:
    """The registry name folder that ``uri`` is or lies inside, or None: a folder holding the registry's audit log
    and its version claims or gate policy (what ``register`` or ``registry gate`` made). Local links are followed."""
    loc = resolve(uri)
    s3 = loc.uri.startswith("s3://")
    parts = (loc.path if s3 else str(Path(loc.path).resolve())).split("/")
    for end in range(len(parts), 1, -1):  # from the URI up to the bucket (S3) or the first folder (local)
        folder = ("s3://" if s3 else "") + "/".join(parts[:end])
        if exists(join(folder, REGISTRY_AUDIT)) and (
            exists(join(folder, REGISTRY_CLAIMS)) or exists(join(folder, GATE_POLICY))
        ):
            return folder
    return None


def refuse_inside_registry(uri: str, what: str) -> None:
    """StorageError when ``uri`` is or lies inside a registry name folder, where only the registry writes: another
    artifact in ``versions/`` would break or shadow a version, a fetch would mix its files into one."""
    if (folder := registry_folder_of(uri)) is not None:
        raise StorageError(
            f"{what}: '{uri}' lies inside the registry folder {folder}, where only `sdarflow registry` writes; "
            f"fix: choose an output outside the registry"
        )


@contextlib.contextmanager
def replacing_folder(out: str | Path, own: str, what: str) -> Iterator[Path]:
    """A new staging folder beside the local folder ``out`` that takes its place when the block completes (and is
    removed if it raises). ``out`` may be absent, empty, or this command's own earlier output (a folder holding the
    file ``own``); anything else there (a file, another model, a registry, a user's notes) is refused before the
    block runs: nothing is deleted that the command did not make, and a killed command leaves ``out`` as it was;
    never inside a registry's folder."""
    out = Path(out)
    refuse_inside_registry(str(out), what)
    _check_replaceable(out, own, what)
    out.parent.mkdir(parents=True, exist_ok=True)
    staged, old = (out.with_name(f".{out.name}.{uuid.uuid4().hex[:8]}.{k}") for k in ("staging", "replaced"))
    staged.mkdir()  # unique, so two commands on one output never share it; with the umask's mode
    swapped = False
    try:
        yield staged
        _check_replaceable(out, own, what)  # nothing else appeared there meanwhile
        with stopping.signals_deferred():  # a stop between the renames would leave no --output
            if out.exists():
                out.rename(old)
            staged.rename(out)
            swapped = True
    finally:
        shutil.rmtree(staged, ignore_errors=True)
        if swapped:  # also when a stop held back during the swap is taken right after it
            shutil.rmtree(old, ignore_errors=True)


def _check_replaceable(out: Path, own: str, what: str) -> None:
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ConfigError(f"{what}: --output {out} is not a folder; fix: pass a new folder")
    if (out / MANIFEST).exists():
        raise ConfigError(
            f"{what}: --output {out} is a published artifact (it has {MANIFEST}), which it never replaces; fix: "
            f"pass a new or empty folder"
        )
    if out.is_dir() and any(out.iterdir()) and not (out / own).is_file():
        raise ConfigError(
            f"{what}: --output {out} holds files {what} did not write (no {own}), which it never replaces; fix: "
            f"pass a new or empty folder"
        )


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


# The most a JSON file is read whole: none sdarflow writes comes near it (a manifest of 10,000 files is about 2 MB),
# and a bigger one, not ours, would take the memory of whatever reads it.
MAX_JSON_BYTES = 64 * 2**20


def _too_big(uri: str, size: int | None, most: int | None) -> None:
    if most is not None and size is not None and size > most:
        raise StorageError(
            f"'{uri}' is {size} bytes, more than the {most} read whole here; fix: check the URI (the files sdarflow "
            f"writes there are far smaller), or regenerate it"
        )


def read_bytes(uri: str, most: int | None = None) -> bytes:
    """A whole file; StorageError when it is missing, or larger than ``most`` bytes (before reading it)."""
    loc = resolve(uri)
    with reachable(loc, "read"):
        info = loc.fs.get_file_info(loc.path)
        if info.type == pafs.FileType.NotFound:
            raise StorageError(
                f"'{loc.uri}' does not exist; fix: check the URI or run the stage that writes it"
            )
        _too_big(loc.uri, info.size, most)
        with loc.fs.open_input_stream(loc.path) as f:
            return f.read()


def write_bytes(uri: str, data: bytes) -> None:
    """Write a whole object: readers see the old one or the new one, never a part (a local file is written beside
    its name and renamed into place; an S3 upload that fails part-way is deleted, so an overwrite leaves none)."""
    write_stream(uri, io.BytesIO(data))


def write_stream(
    uri: str, source: BinaryIO, check: Callable[[int, str], None] | None = None
) -> tuple[int, str]:
    """:func:`write_bytes` from a readable stream, in blocks (a model's weights need not fit in memory); returns
    its (bytes, sha256). ``check(bytes, sha256)`` may refuse what was copied before it becomes visible: a local file
    is then never renamed into place (an S3 upload cannot be held back, so check before publishing there)."""
    loc = resolve(uri)
    with reachable(loc, "write"):
        parent = loc.path.rsplit("/", 1)[0]
        loc.fs.create_dir(parent, recursive=True)
        local = isinstance(loc.fs, pafs.LocalFileSystem)
        target = f"{parent}/.{loc.path.rsplit('/', 1)[1]}.{uuid.uuid4().hex[:8]}.tmp" if local else loc.path
        opened = False
        try:
            with loc.fs.open_output_stream(target) as f:
                opened = True
                size, digest = copy_hashing(source, f)
            if check:
                check(size, digest)
            if local:
                os.replace(target, loc.path)
        except BaseException:
            # closing the stream completed the upload: take the partial object back (a stream that never opened
            # wrote nothing, and the object there is still the old one)
            if opened and not local:
                with contextlib.suppress(OSError):
                    loc.fs.delete_file(target)
            raise
        finally:
            if local and os.path.exists(target):
                os.remove(target)
    return size, digest


class _Reading:
    """A readable stream whose read errors name the URI read from (a copy's writer would name its target)."""

    def __init__(self, stream, loc: Location):
        self.stream, self.loc = stream, loc

    def read(self, n: int) -> bytes:
        with reachable(self.loc, "read"):
            return self.stream.read(n)


def copy_hashing(source: BinaryIO, dest: BinaryIO | None = None) -> tuple[int, str]:
    """Read ``source`` in 1 MiB blocks (model weights do not fit in memory twice), copying them to ``dest`` if
    given; the (bytes, sha256) of what was read."""
    digest, size = hashlib.sha256(), 0
    for block in iter(lambda: source.read(1 << 20), b""):
        digest.update(block)
        if dest is not None:
            dest.write(block)
        size += len(block)
    return size, digest.hexdigest()


def read_json(uri: str) -> dict:
    return parse_json(read_bytes(uri, MAX_JSON_BYTES), uri)


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    # json.loads keeps the last of two equal keys: a file that says one thing twice is not one sdarflow wrote
    out = dict(pairs)
    if len(out) < len(pairs):
        keys = [k for k, _ in pairs]
        raise _DuplicateKey(next(k for k in keys if keys.count(k) > 1))
    return out


def parse_json(raw: bytes, uri: str) -> dict:
    try:
        return json.loads(raw, object_pairs_hook=_unique_keys)
    except _DuplicateKey as err:
        raise StorageError(
            f"'{uri}' has the key {err.args[0]!r} twice in one object; fix: regenerate it"
        ) from err
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
    """sha256 of a local file, read in blocks."""
    with Path(path).open("rb") as f:
        return copy_hashing(f)[1]


MANIFEST = "_manifest.json"
# A dataset's attachments (its reports) live here: Parquet readers of the folder (pyarrow, pandas, Spark) skip
# paths that start with "_", so they see only the parts.
ATTACHMENTS = "_attachments"


def is_published(uri: str) -> bool:
    return exists(join(uri, MANIFEST))


GENERATION = "_gen-"


@dataclass(frozen=True)
class Target:
    """Where a publish writes: the artifact's URI and its files' generation folder (``prefix``, see ``publishing``)."""

    uri: str
    prefix: str = ""

    def file(self, rel: str) -> str:
        return join(self.uri, self.prefix, rel) if self.prefix else join(self.uri, rel)

    def manifest(self, kind: str, files: list[dict], **meta) -> dict:
        """Write the manifest: the commit of a publish."""
        manifest = {
            "kind": kind,
            "files": files,
            "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "sdarflow_version": __version__,
            **({"prefix": self.prefix} if self.prefix else {}),
            **meta,
        }
        write_json(join(self.uri, MANIFEST), manifest)
        return manifest


def members(manifest: dict) -> list[dict]:
    """Every file a manifest publishes: its ``files`` and its ``attachments`` (reports beside a dataset)."""
    return [*manifest["files"], *manifest.get("attachments", [])]


def _member_location(loc: Location, manifest: dict, rel: str, what: str) -> str:
    """Where a listed file is, in ``loc.fs``: on local disk only once it resolves inside the artifact (no
    symlink out), so nothing outside is ever read or deleted through a listed path."""
    path = f"{manifest['prefix']}/{rel}" if manifest.get("prefix") else rel
    if isinstance(loc.fs, pafs.LocalFileSystem):
        return str(inside(loc.path, path, f"{what} {loc.uri}"))
    return f"{loc.path}/{path}"


@contextlib.contextmanager
def publishing(uri: str, overwrite: bool = False, kind: str | None = None) -> Iterator[Target]:
    """Guard a folder write: refuse to replace a published artifact (unless ``overwrite``, and then only one of
    the same ``kind``: a report never replaces a registered adapter), write a replacement beside it, and remove
    what the body wrote if it raises. The body writes its files at ``Target.file`` and the
    manifest last (``Target.manifest``): that write is the commit. After it, the replaced files are removed.
    Inside a registry's folder only the registry publishes (a version, ``VERSION_KIND``)."""
    loc = resolve(uri)
    if kind != VERSION_KIND:
        refuse_inside_registry(loc.uri, f"publish {kind or 'artifact'}")
    old = None
    if is_published(uri):
        if not overwrite:
            raise StorageError(
                f"'{loc.uri}' is already published; fix: choose a new output URI or pass --overwrite"
            )
        try:
            old = read_manifest(uri)
        except StorageError:
            old = {"files": []}  # a broken artifact: nothing of it is worth keeping readable
        if kind and old.get("kind", kind) != kind:
            raise StorageError(
                f"'{loc.uri}' is a published {old['kind']}, and --overwrite replaces only a {kind}; fix: choose a "
                f"new output URI"
            )
    # Into a fresh generation when something is there already (a published artifact, or files this publish did
    # not write: a killed run's leftovers, or a user's): a failure then removes only what this publish wrote.
    with reachable(loc, "list"):
        is_dir = loc.fs.get_file_info(loc.path).type == pafs.FileType.Directory
        present = loc.fs.get_file_info(pafs.FileSelector(loc.path)) if is_dir else []
    beside = old is not None or bool(present)
    target = Target(loc.uri, f"{GENERATION}{uuid.uuid4().hex[:12]}" if beside else "")
    with reachable(loc, "delete"):  # generations an interrupted overwrite left (no manifest names them)
        for info in present:
            if info.base_name.startswith(GENERATION) and info.base_name != (old or {}).get("prefix", ""):
                loc.fs.delete_dir(info.path)
    try:
        yield target
    except BaseException:
        # Nothing half-written: readers would not see it (the manifest is written last), but it would confuse a
        # rerun. A replacement removes only its own generation: the old artifact stays as it was.
        with contextlib.suppress(StorageError):
            delete_tree(join(loc.uri, target.prefix) if target.prefix else loc.uri)
        raise
    if old is not None:
        with contextlib.suppress(StorageError):  # the new artifact is published; leftovers only cost space
            _remove_replaced(loc, old)


def _remove_replaced(loc: Location, old: dict) -> None:
    """The files a replaced manifest listed, and its generation folder."""
    with reachable(loc, "delete"):
        if old.get("prefix"):
            loc.fs.delete_dir(f"{loc.path}/{old['prefix']}")
            return
        for entry in members(old):
            try:
                path = _member_location(loc, old, entry["path"], "replaced artifact")
            except StorageError:
                continue  # a link out of the folder: never delete through it
            if loc.fs.get_file_info(path).type == pafs.FileType.File:
                loc.fs.delete_file(path)


def read_manifest(uri: str, kind: str | None = None) -> dict:
    loc = resolve(uri)
    if not is_published(uri):
        raise StorageError(
            f"'{loc.uri}' has no {MANIFEST}: the dataset is missing or was never fully published; "
            f"fix: check the URI or rerun the stage that writes it"
        )
    manifest = read_json(join(uri, MANIFEST))
    where, fix = f"{loc.uri}/{MANIFEST}", "fix: republish the artifact with the stage that writes it"
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), list):
        raise StorageError(f"'{where}' is not a manifest (an object with a 'files' list); {fix}")
    _Manifest.check(manifest, f"'{where}'", fix, StorageError)  # its shape before any entry is used
    if kind is not None and manifest.get("kind") != kind:
        raise StorageError(
            f"'{loc.uri}' holds a '{manifest.get('kind')}' artifact, expected '{kind}'; fix: pass the right URI"
        )
    return manifest


@dataclass
class _Member(FileSchema):
    """One file a manifest lists."""

    path: str = opt("", "the file's path inside the artifact")
    rows: int | None = opt(None, "rows of a Parquet part", ge=0)
    bytes: int | None = opt(None, "the file's size", ge=0)
    sha256: str = opt("0" * 64, "the file's sha256 digest")

    def validate(self) -> None:
        try:
            confined(self.path, "file")
        except StorageError as err:
            raise ConfigError(str(err)) from None
        if not (len(self.sha256) == 64 and all(c in "0123456789abcdef" for c in self.sha256)):
            raise ConfigError(f"sha256 = {self.sha256!r} is not a sha256 digest")


@dataclass
class _Manifest(FileSchema):
    """A manifest's shape, checked before any entry is used."""

    files: list[_Member] = opt([], "the artifact's files")
    attachments: list[_Member] = opt([], "reports beside a dataset")
    rows: int | None = opt(None, "rows of a dataset", ge=0)
    prefix: str = opt("", "the generation folder holding the files")

    def validate(self) -> None:
        if self.prefix and not (self.prefix.startswith(GENERATION) and "/" not in self.prefix):
            raise ConfigError(f"prefix {self.prefix!r} is not a generation folder")
        paths = [m.path for m in [*self.files, *self.attachments]]
        if len(set(paths)) != len(paths):
            raise ConfigError("it lists a file more than once")


def write_table(
    table: pa.Table,
    uri: str,
    *,
    kind: str,
    schema: pa.Schema,
    config_hash: str,
    inputs: list[str],
    rows_per_part: int = 50_000,
    overwrite: bool = False,
    attachments: dict[str, bytes] | None = None,
    **meta,
) -> dict:
    """Validate and publish ``table`` as ``part-NNNNN.parquet`` files (zstd) plus a manifest written last.
    ``attachments`` (name -> bytes, e.g. reports about the data) are published with it, read by ``read_member``."""
    table = validate(table, schema, f"output {uri}")
    with publishing(uri, overwrite, kind) as target:
        files = []
        for i in range(max(1, -(-table.num_rows // rows_per_part))):
            part = table.slice(i * rows_per_part, rows_per_part)
            buffer = pa.BufferOutputStream()
            pq.write_table(part, buffer, compression="zstd")
            entry = _write_file(target, f"part-{i:05d}.parquet", buffer.getvalue().to_pybytes())
            files.append({**entry, "rows": part.num_rows})
        return target.manifest(
            kind,
            files,
            attachments=[
                _write_file(target, f"{ATTACHMENTS}/{rel}", data)
                for rel, data in sorted((attachments or {}).items())
            ],
            rows=table.num_rows,
            schema_fingerprint=fingerprint(schema),
            config_hash=config_hash,
            inputs=list(inputs),
            **meta,
        )


def read_table(uris: str | list[str], *, kind: str, schema: pa.Schema) -> pa.Table:
    """Read and validate one dataset, or the union of several (e.g. the shards of one stage)."""
    uris = [uris] if isinstance(uris, str) else list(uris)
    if not uris:
        raise StorageError(f"no input {kind} dataset given; fix: pass at least one --input URI")
    tables = []
    for uri in uris:
        manifest = read_manifest(uri, kind)
        loc = resolve(uri)
        with reachable(loc, "read"):
            parts = []
            for entry in manifest["files"]:
                data = _read_entry(loc, manifest, entry, "dataset")  # the part published: its size and sha256
                try:
                    parts.append(pq.read_table(pa.BufferReader(data)))
                except pa.ArrowInvalid as err:
                    raise SchemaError(
                        f"dataset {loc.uri}: '{entry['path']}' is not valid Parquet ({err}); fix: regenerate it"
                    ) from err
        table = pa.concat_tables(parts) if parts else schema.empty_table()
        # what the manifest promises against what the files hold: a mismatch means they changed after publishing
        rows = manifest.get("rows", table.num_rows)
        if rows != table.num_rows:
            raise SchemaError(
                f"dataset {loc.uri}: its files hold {table.num_rows} rows, its manifest says {rows} (changed after "
                f"publishing); fix: regenerate it"
            )
        written = manifest.get("schema_fingerprint", fingerprint(schema))
        if written != fingerprint(schema):
            raise SchemaError(
                f"dataset {loc.uri} was written with schema {written}, this reader expects {fingerprint(schema)} "
                f"(another sdarflow version?); fix: regenerate it with this version"
            )
        tables.append(validate(table, schema, f"dataset {loc.uri}"))
    table = pa.concat_tables(tables)
    check_turns_unique(table, ", ".join(uris))
    return table


def _write_file(target: Target, rel: str, data: bytes | Path) -> dict:
    """One file of a publish (bytes, or a local file streamed in blocks) and its manifest entry."""
    with data.open("rb") if isinstance(data, Path) else io.BytesIO(data) as source:
        # a local file's read error names that file, not the target
        readable = _Reading(source, resolve(str(data))) if isinstance(data, Path) else source
        size, digest = write_stream(target.file(confined(rel, f"publish {target.uri}")), readable)
    return {"path": rel, "bytes": size, "sha256": digest}


def publish_dir(local_dir: str | Path, uri: str, *, kind: str, overwrite: bool = False, **meta) -> dict:
    """Copy a local folder (adapter, skill library, report) to ``uri`` with sha256 sums in the manifest."""
    local_dir = Path(local_dir)
    with publishing(uri, overwrite, kind) as target:
        files = [
            _write_file(target, path.relative_to(local_dir).as_posix(), path)
            for path in sorted(p for p in local_dir.rglob("*") if p.is_file() and p.name != MANIFEST)
        ]
        return target.manifest(kind, files, **meta)


def fetch_dir(
    uri: str, *, kind: str, dest: str | Path | None = None, scratch: str | Path | None = None
) -> Path:
    """Materialize a published folder locally after verifying sha256 sums: a view of a local one, else a copy in
    ``dest`` or in a new folder under ``scratch`` (the system's temporary folder by default), which the caller
    removes. Files are read in blocks, hashed on the way (a model's weights need not fit in memory); a copy that
    fails verification is removed if this call made its folder."""
    manifest = read_manifest(uri, kind)
    loc = resolve(uri)
    if isinstance(loc.fs, pafs.LocalFileSystem) and dest is None:
        _fetch_files(loc, manifest, kind, None)
        return Path(loc.path) / manifest.get("prefix", "")
    target = Path(dest if dest is not None else tempfile.mkdtemp(prefix=f"sdarflow-{kind}-", dir=scratch))
    try:
        _fetch_files(loc, manifest, kind, target)
    except BaseException:
        if dest is None:
            shutil.rmtree(target, ignore_errors=True)
        raise
    return target


def _fetch_files(loc: Location, manifest: dict, kind: str, target: Path | None) -> None:
    """Verify each listed file, copying it into ``target`` (None: verify in place)."""
    for entry in manifest["files"]:
        path = _member_location(loc, manifest, entry["path"], kind)
        with reachable(loc, "read"):
            if loc.fs.get_file_info(path).type != pafs.FileType.File:
                raise StorageError(
                    f"{kind} {loc.uri}: '{entry['path']}' is listed in its manifest but missing; "
                    f"fix: republish the artifact"
                )
            with loc.fs.open_input_stream(path) as source:
                if target is None:
                    _verify(entry, *copy_hashing(source), loc.uri)
                    continue
                # a file that does not match is never renamed into place
                out = inside(target, entry["path"], f"{kind} {loc.uri}")
                write_stream(
                    str(out),
                    _Reading(source, loc),
                    check=lambda size, digest, e=entry: _verify(e, size, digest, loc.uri),
                )


def download_dir(uri: str, target: Path, *, marker: str, what: str) -> bool:
    """Copy the folder at ``uri`` (an unpublished one, e.g. an HF model folder) to the local ``target`` once;
    whether this call copied it. A ``target`` holding ``marker`` is a finished copy and is kept. The processes of
    one node (a TrainJob's ranks) take turns on a lock beside ``target``, so one copies and the others find its
    copy. A copy goes to a sibling temp folder renamed into place when complete; a copier killed mid-copy leaves
    its temp folder, which the next one removes before copying."""
    import fcntl

    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / marker).is_file():
            return False
        if target.exists():
            raise ConfigError(
                f"{what}: '{target}' exists but holds no {marker} (not a finished copy); fix: remove it"
            )
        for stale in target.parent.glob(f".{target.name}.partial-*"):  # a killed copier's, under our lock
            shutil.rmtree(stale, ignore_errors=True)
        loc = resolve(uri)
        partial = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
        try:
            with reachable(loc, "read"):
                if loc.fs.get_file_info(join(loc.path, marker)).type == pafs.FileType.NotFound:
                    raise ConfigError(f"{what} '{uri}' has no {marker}; fix: upload the whole folder there")
                pafs.copy_files(
                    loc.path,
                    str(partial),
                    source_filesystem=loc.fs,
                    destination_filesystem=pafs.LocalFileSystem(),
                )
            partial.rename(target)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    return True


def member_entry(manifest: dict, name: str) -> dict | None:
    """The manifest entry of the file ``name``: a listed file, or a dataset's attachment of that name."""
    by_path = {e["path"]: e for e in members(manifest)}
    return by_path.get(name) or by_path.get(f"{ATTACHMENTS}/{name}")


def read_member(uri: str, name: str, kind: str | None = None, most: int | None = None) -> bytes:
    """One file of a published artifact (a listed file or an attachment), verified against its manifest; larger
    than ``most`` bytes (as its manifest or the file says) is refused before it is read."""
    manifest = read_manifest(uri, kind)
    entry = member_entry(manifest, name)
    loc = resolve(uri)
    if entry is None:
        raise StorageError(
            f"'{loc.uri}' publishes no '{name}'; fix: pass the output of the stage that writes {name}"
        )
    _too_big(join(loc.uri, name), entry.get("bytes"), most)
    return _read_entry(loc, manifest, entry, manifest.get("kind", "artifact"), most)


def _read_entry(loc: Location, manifest: dict, entry: dict, what: str, most: int | None = None) -> bytes:
    """A listed file's bytes, verified against its manifest entry."""
    path = _member_location(loc, manifest, entry["path"], what)
    data = read_bytes(path if isinstance(loc.fs, pafs.LocalFileSystem) else "s3://" + path, most)
    _verify(entry, len(data), sha256(data), loc.uri)
    return data


def read_member_json(uri: str, name: str, kind: str | None = None) -> dict:
    return parse_json(read_member(uri, name, kind, MAX_JSON_BYTES), join(uri, name))


def _verify(entry: dict, size: int, digest: str, uri: str) -> None:
    """A published file's (bytes, sha256) against its manifest entry; an entry without a sha256 (every publish
    writes one) fails."""
    if entry.get("bytes", size) != size or digest != entry.get("sha256"):
        raise StorageError(
            f"'{uri}/{entry['path']}' does not match its recorded sha256 (corrupt or tampered); "
            f"fix: republish the artifact from its source"
        )
