"""One file: read and hash it once, upload it (or restore a lost blob), then enqueue it.

A run prepares many files at once (:func:`prepare_file`: read, hash, upload) and enqueues them
in groups (:func:`enqueue_files`); :func:`ingest_file` is both for one file.

A file under a folder is opened from the folder's descriptor, name by name, never through a
symbolic link (:mod:`.nofollow`), and must be the very file the walk found (its
``(st_dev, st_ino)``): a file, or a folder on its path, that someone replaced after the walk
is an ``error`` for that file alone, and nothing outside the folder is read.

Objects are content-addressed (:func:`storage_key_for`), so uploading the same bytes twice
stores them once, and every upload is verified against the hash it is stored under: a file
that changes while it is read is never stored under the wrong hash (it is read again once,
then reported). When the bytes are already the latest version but the store lost their blob,
the blob is uploaded again and the version's failed job requeued (``repaired``).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import mimetypes
import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import BinaryIO, Final
from uuid import UUID

import attrs

from trioindex.db.enqueue import (
    NewVersion,
    enqueue_versions,
    latest_version,
    requeue_failed_job,
    retry_deadlocks,
)
from trioindex.db.pool import Connection, Database
from trioindex.errors import ObjectNotFound
from trioindex.ingest import nofollow
from trioindex.ingest.discover import SourceFile
from trioindex.ingest.results import FileChanged, FileNotIngested, IngestResult, printable
from trioindex.storage import AsyncObjectStore, ObjectStore
from trioindex.storage.contract import OWN_BLOB_PREFIX

__all__ = [
    "PreparedFile",
    "digest",
    "enqueue_files",
    "ingest_file",
    "open_source",
    "prepare_bytes",
    "prepare_file",
    "prepare_file_sync",
    "storage_key_for",
]

# The package's logger: a run's lines keep the one name they had when ingest was one module.
logger = logging.getLogger(__package__)

_READ_CHUNK = 1 << 20
# A file named directly is opened as named, following links (the user named it).
_NAMED_FLAGS: Final = nofollow.FILE_FLAGS & ~os.O_NOFOLLOW


def storage_key_for(sha256: str) -> str:
    return f"{OWN_BLOB_PREFIX}{sha256[:2]}/{sha256}"


def open_source(source: SourceFile) -> BinaryIO:
    """Open the file for reading, re-checking what discovery saw (it may have changed): below
    ``source.inside`` name by name without following a link, and it must be the regular file
    the walk found."""
    inside = source.inside
    try:
        if inside is None:
            fd = os.open(source.path, _NAMED_FLAGS)
        else:
            fd = nofollow.open_file(inside, _below(source, inside))
    except OSError as exc:
        why = nofollow.change(exc)
        if why is None:
            raise FileNotIngested(f"cannot open: {exc.strerror}") from None
        raise FileNotIngested(f"changed since the walk found it ({why}); not ingested") from None
    handle = os.fdopen(fd, "rb")
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        handle.close()
        raise FileNotIngested("no longer a regular file; not ingested")
    if source.identity is not None and nofollow.identity(st) != source.identity:
        handle.close()
        raise FileNotIngested(
            "another file took its place since the walk found it; not ingested (ingest it again)"
        )
    return handle


def _below(source: SourceFile, inside: Path) -> tuple[str, ...]:
    """The file's names under ``inside``: as the walk found them, else those of its resolved
    path (a :class:`SourceFile` built without them)."""
    if source.below is not None:
        return source.below
    try:
        real = Path(os.path.realpath(source.path))
    except OSError as exc:
        raise FileNotIngested(f"cannot open: {exc.strerror}") from None
    if real == inside or not real.is_relative_to(inside):
        raise FileNotIngested("symbolic link now leads outside the folder; not ingested")
    return real.relative_to(inside).parts


def digest(handle: BinaryIO) -> tuple[str, int]:
    """SHA-256 (hex) and size of what ``handle`` reads from its start, in 1 MiB pieces."""
    sha = hashlib.sha256()
    size = 0
    handle.seek(0)
    try:
        while block := handle.read(_READ_CHUNK):
            sha.update(block)
            size += len(block)
    except OSError as exc:
        raise FileNotIngested(f"cannot read: {exc.strerror}") from None
    return sha.hexdigest(), size


@attrs.frozen
class PreparedFile:
    """A file read, hashed and in the store, ready to enqueue; ``restored``: its bytes were the
    latest version's, whose lost blob was uploaded again."""

    version: NewVersion
    restored: bool = False


async def ingest_file(
    source: SourceFile,
    *,
    db: Database,
    store: AsyncObjectStore,
    model_id: UUID,
    max_attempts: int,
    priority: int = 0,
) -> IngestResult:
    """Upload one file (unless its bytes are already the latest version) and enqueue it.

    :func:`prepare_file`, then :func:`enqueue_files` for this one file. Storage and database
    errors propagate (they are not about this file).
    """
    latest = await db.run(latest_version, source.document_key)
    prepared = await prepare_file(source, store=store, latest=latest)
    (result,) = await enqueue_files(
        [prepared], db=db, model_id=model_id, max_attempts=max_attempts, priority=priority
    )
    return result


async def prepare_file(
    source: SourceFile, *, store: AsyncObjectStore, latest: Mapping[str, object] | None
) -> PreparedFile:
    """:func:`prepare_file_sync` in one of the store's threads."""
    return await store.run(functools.partial(prepare_file_sync, source, latest=latest))


def prepare_file_sync(
    source: SourceFile, store: ObjectStore, *, latest: Mapping[str, object] | None
) -> PreparedFile:
    """Read and hash the file, and upload it unless ``latest`` (its document's newest version,
    looked up just before) has the same bytes; restore that version's blob if the store lost it.
    Blocking: it runs in a store thread (:meth:`AsyncObjectStore.run`), many files to a hop.

    A file that changes between hashing and upload is read again from the start once; a second
    change, or a file that cannot be read, raises :class:`FileNotIngested`.
    """
    try:
        return _prepare_once(source, store, latest)
    except FileChanged:
        logger.info("ingest %s: changed while being read; reading it again", source.document_key)
        try:
            return _prepare_once(source, store, latest)
        except FileChanged:
            raise FileNotIngested(
                "the file changed while it was being read, twice; not ingested "
                "(ingest it again once it stops changing)"
            ) from None


async def enqueue_files(
    prepared: Sequence[PreparedFile],
    *,
    db: Database,
    model_id: UUID,
    max_attempts: int,
    priority: int = 0,
) -> list[IngestResult]:
    """Enqueue prepared files in one transaction (:func:`enqueue_versions`), then requeue the
    FAILED job of each restored version (``repaired``); one result per file, in order."""
    versions = [p.version for p in prepared]

    def enqueue(conn: Connection) -> list[IngestResult]:
        return retry_deadlocks(
            lambda: enqueue_versions(
                conn, versions, model_id=model_id, max_attempts=max_attempts, priority=priority
            )
        )

    results = await db.run(enqueue)
    finished: list[IngestResult] = []
    for file, enqueued in zip(prepared, results, strict=True):
        result = enqueued
        if file.restored and result.status == "unchanged":
            requeued = result.job_id is not None and await db.run(
                requeue_failed_job, result.job_id, extra_attempts=max_attempts
            )
            result = attrs.evolve(result, status="repaired", requeued=requeued)
        logger.info(
            "ingest %s: %s (document %s, version %d)",
            result.document_key,
            result.status,
            result.document_id,
            result.version_no,
        )
        finished.append(result)
    return finished


def _prepare_once(
    source: SourceFile, store: ObjectStore, latest: Mapping[str, object] | None
) -> PreparedFile:
    # One open file for hashing and upload: the bytes uploaded are those of the same inode, and
    # the store checks them against the hash before anything becomes visible.
    handle, sha256, size = _open_and_digest(source)
    with handle:
        return prepare_bytes(
            store,
            handle,
            document_key=source.document_key,
            original_name=source.path.name,
            sha256=sha256,
            size=size,
            latest=latest,
            path=printable(source.path),
        )


def prepare_bytes(
    store: ObjectStore,
    handle: BinaryIO,
    *,
    document_key: str,
    original_name: str,
    sha256: str,
    size: int,
    latest: Mapping[str, object] | None,
    content_type: str | None = None,
    path: str = "",
) -> PreparedFile:
    """Store the ``size`` bytes ``handle`` reads from its position, hashed already
    (``sha256``), under their content address, unless ``latest`` (the document's newest
    version, looked up just before) has the same bytes; then restore that version's blob only
    if the store lost it. ``content_type`` None is guessed from ``original_name``. Blocking: it
    runs in a store thread. The upload of any file (ingest, the HTTP service) goes through
    here, so the rules for unchanged and repaired bytes are the same everywhere."""
    if content_type is None:
        content_type = mimetypes.guess_type(original_name)[0]
    upload = functools.partial(
        _upload, store, handle, size=size, sha256=sha256, content_type=content_type
    )
    restored = False
    if latest is None or latest["sha256"] != sha256:
        upload(storage_key_for(sha256))
    elif not _blob_intact(store, str(latest["storage_key"]), sha256, size):
        logger.warning(
            "ingest %s: version %s lost its stored copy in %s; uploading it again",
            document_key,
            latest["version_no"],
            store.description,
        )
        upload(str(latest["storage_key"]))
        restored = True
    version = NewVersion(
        document_key=document_key,
        storage_key=storage_key_for(sha256),
        original_name=original_name,
        content_type=content_type,
        byte_size=size,
        sha256=sha256,
        path=path,
    )
    return PreparedFile(version, restored)


def _upload(
    store: ObjectStore,
    handle: BinaryIO,
    key: str,
    *,
    size: int,
    sha256: str,
    content_type: str | None,
) -> None:
    try:
        store.put(key, handle, size=size, sha256=sha256, content_type=content_type)
    except ValueError:
        # the store read other bytes (or fewer) than were hashed: nothing was stored
        raise FileChanged() from None


def _open_and_digest(source: SourceFile) -> tuple[BinaryIO, str, int]:
    """:func:`open_source` and :func:`digest`; the handle is left at its start, for the
    upload."""
    handle = open_source(source)
    try:
        sha256, size = digest(handle)
        handle.seek(0)
    except BaseException:
        handle.close()
        raise
    return handle, sha256, size


def _blob_intact(store: ObjectStore, key: str, sha256: str, size: int) -> bool:
    """One stat: is the version's blob in the store, with its size and (when known) hash?"""
    try:
        info = store.stat(key)
    except ObjectNotFound:
        return False
    return info.size == size and info.sha256 in (None, sha256)
