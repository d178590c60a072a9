"""Where sdarflow reads and writes: URIs (plain path, ``file://``, ``s3://``) through ``pyarrow.fs``
(:mod:`sdarflow.storage.files`), and artifacts published atomically, a folder whose ``_manifest.json`` is written
last and lists every file with its sha256 (:mod:`sdarflow.storage.publish`). Callers use ``storage.<name>``."""

from sdarflow.storage.files import (
    children,
    confined,
    delete_tree,
    exists,
    file_sha256,
    inside,
    join,
    read_bytes,
    read_json,
    resolve,
    write_bytes,
    write_json,
)
from sdarflow.storage.publish import (
    GENERATION,
    MANIFEST,
    fetch_dir,
    is_published,
    member_entry,
    publish_dir,
    publishing,
    read_manifest,
    read_member,
    read_member_json,
    read_table,
    write_table,
)
