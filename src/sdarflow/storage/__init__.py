"""Where sdarflow reads and writes: URIs (plain path, ``file://``, ``s3://``) through ``pyarrow.fs``, and artifacts
published atomically, a folder whose ``_manifest.json`` is written last and lists every file with its sha256
(:mod:`sdarflow.storage.files`). Callers use ``storage.<name>``."""

from sdarflow.storage.files import (
    GENERATION,
    MANIFEST,
    children,
    confined,
    copy_hashing,
    delete_tree,
    download_dir,
    exists,
    fetch_dir,
    file_sha256,
    inside,
    is_published,
    join,
    member_entry,
    publish_dir,
    publishing,
    read_bytes,
    read_json,
    read_manifest,
    read_member,
    read_member_json,
    read_table,
    refuse_inside_registry,
    replacing_folder,
    resolve,
    write_bytes,
    write_json,
    write_table,
)
