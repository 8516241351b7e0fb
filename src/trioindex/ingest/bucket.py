"""``ingest s3://bucket/prefix``: register objects already in the configured bucket, in place.

Nothing is uploaded: each object under the prefix becomes a document whose key is the object's
key and whose version names the object itself (its storage key). An object is read once, as a
stream, to compute its SHA-256 (the hash the worker checks before parsing); an object whose
key, size and ETag match its document's newest version is skipped without being read
(``unchanged``). The bucket must be the one ``storage.url`` names — the workers read from
there. With ``sync``, the documents under the prefix whose object is no longer listed (and that
got no version since the run began) are deleted; the bucket's objects are the application's and
are never removed by trioindex.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit
from uuid import UUID

import attrs

from trioindex.db.documents import database_now, keys_under
from trioindex.db.enqueue import NewVersion, enqueue_versions, latest_versions
from trioindex.db.pool import Database
from trioindex.errors import ConfigError, ContentInvalid, ObjectNotFound, TrioindexError
from trioindex.ingest.results import (
    DeletedDocument,
    FileNotIngested,
    IngestEntry,
    IngestResult,
    SkippedFile,
)
from trioindex.removal import delete_documents
from trioindex.storage import AsyncObjectStore

if TYPE_CHECKING:
    from trioindex.storage.s3 import ListedObject, S3Store

__all__ = ["BucketLocation", "bucket_location", "ingest_bucket"]

logger = logging.getLogger(__name__)

# Objects hashed and enqueued per transaction (the same grouping as a folder ingest).
OBJECTS_PER_TRANSACTION = 256


@attrs.frozen
class BucketLocation:
    """An ``s3://bucket/prefix`` argument."""

    bucket: str
    prefix: str

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


def bucket_location(argument: str | Path) -> BucketLocation | None:
    """The bucket and key prefix an ingest argument names, or None for a local path. A
    ``Path`` made from ``s3://b/p`` (which collapses the double slash) is recognised too."""
    text = str(argument)
    if text.startswith("s3:/") and not text.startswith("s3://"):
        text = "s3://" + text[len("s3:/") :]
    if not text.startswith("s3://"):
        return None
    parts = urlsplit(text)
    if not parts.netloc:
        raise ConfigError(f"ingest: {text!r} names no bucket (s3://BUCKET/PREFIX)")
    return BucketLocation(parts.netloc, unquote(parts.path.lstrip("/")))


def _bucket_store(store: AsyncObjectStore, location: BucketLocation) -> S3Store:
    from trioindex.storage.s3 import S3Store

    blocking = store.store
    if not isinstance(blocking, S3Store):
        raise TrioindexError(
            f"ingest {location}: storage.url is not an S3 bucket ({store.description}); "
            "objects can be registered in place only from the bucket the workers read"
        )
    if blocking.bucket != location.bucket:
        raise TrioindexError(
            f"ingest {location}: the workers read bucket {blocking.bucket!r} (storage.url), "
            f"not {location.bucket!r}"
        )
    return blocking


async def ingest_bucket(
    location: BucketLocation,
    *,
    db: Database,
    store: AsyncObjectStore,
    model_id: UUID,
    max_attempts: int,
    max_bytes: int,
    priority: int = 0,
    sync: bool = False,
) -> list[IngestEntry]:
    """Register every object under ``location`` (see the module docstring); one entry per
    object in key order, then one per deleted document with ``sync``. An object that cannot be
    read is an ``error`` entry and the run goes on; an outage of the bucket ends the run."""
    bucket = _bucket_store(store, location)
    started = await db.run(database_now) if sync else None
    listing = await store.run(lambda _: list(bucket.list_objects(location.prefix)))
    entries: list[IngestEntry] = []
    for start in range(0, len(listing), OBJECTS_PER_TRANSACTION):
        group = listing[start : start + OBJECTS_PER_TRANSACTION]
        latest = await db.run(latest_versions, [obj.key for obj in group])
        done: dict[int, IngestEntry] = {}
        fresh: list[tuple[int, NewVersion]] = []
        for i, obj in enumerate(group):
            where = f"s3://{location.bucket}/{obj.key}"
            before = latest.get(obj.key)
            if before is not None and _same_object(before, obj):
                done[i] = _unchanged(where, obj.key, before)
                continue
            try:  # one thread hop per object: reading it is the cost, not the hop
                sha256, size = await store.run(
                    functools.partial(_digest, bucket, key=obj.key, max_bytes=max_bytes)
                )
            except FileNotIngested as exc:
                done[i] = SkippedFile(where, obj.key, "error", exc.reason)
                continue
            name = obj.key.rsplit("/", 1)[-1]
            fresh.append((i, NewVersion(obj.key, obj.key, name, None, size, sha256, where,
                                        obj.etag)))  # fmt: skip
        results = await db.run(
            enqueue_versions,
            [new for _, new in fresh],
            model_id=model_id,
            max_attempts=max_attempts,
            priority=priority,
        )
        done.update((i, result) for (i, _), result in zip(fresh, results, strict=True))
        entries.extend(done[i] for i in range(len(group)))
    if sync:
        entries.extend(await _delete_gone(db, store, location, {o.key for o in listing}, started))
    return entries


def _same_object(before: Mapping[str, object], obj: ListedObject) -> bool:
    """Whether the document's newest version names this very object, unchanged since."""
    return (before["storage_key"], before["byte_size"], before["source_etag"]) == (
        obj.key,
        obj.size,
        obj.etag,
    )


def _unchanged(where: str, key: str, before: Mapping[str, object]) -> IngestResult:
    return IngestResult(
        where,
        key,
        "unchanged",
        UUID(str(before["document_id"])),
        UUID(str(before["version_id"])),
        int(str(before["version_no"])),
        None,
    )


def _digest(bucket: S3Store, _: object, *, key: str, max_bytes: int) -> tuple[str, int]:
    """The object's hash and size; an object too large or gone is this object's error (an
    outage of the bucket is raised as itself and ends the run)."""
    try:
        info = bucket.digest(key, max_bytes=max_bytes)
    except ContentInvalid as exc:
        raise FileNotIngested(str(exc)) from None
    except ObjectNotFound:
        raise FileNotIngested("the object was removed while the bucket was listed") from None
    assert info.sha256 is not None
    return info.sha256, info.size


async def _delete_gone(
    db: Database,
    store: AsyncObjectStore,
    location: BucketLocation,
    listed: set[str],
    started: datetime | None,
) -> list[DeletedDocument]:
    stored = await db.run(keys_under, location.prefix)
    gone = sorted(key for key in stored if key not in listed and location.prefix != "")
    if not gone:
        return []
    report = await delete_documents(db, store, gone, unchanged_since=started)
    return [DeletedDocument(key) for key in report.deleted]


def plain_paths(arguments: Sequence[str | Path]) -> tuple[list[Path], list[BucketLocation]]:
    """The local paths and the bucket locations among ingest arguments, each in order."""
    paths, buckets = [], []
    for argument in arguments:
        location = bucket_location(argument)
        if location is None:
            paths.append(Path(argument))
        else:
            buckets.append(location)
    return paths, buckets
