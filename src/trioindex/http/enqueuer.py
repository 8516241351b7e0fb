"""Concurrent uploads stored and enqueued together: one worker-thread call, one disk flush and
one transaction for every upload that arrived while the previous group was being committed.

An upload hands its body (or, for a body too large to keep in memory, the version it stored
already) to the service's :class:`UploadEnqueuer` and waits for its own result. A Trio task of
the service (:meth:`GroupCommitter.serve`, the worker's group committer) takes what has
gathered, at most :data:`MAX_GROUP` uploads and :data:`MAX_GROUP_BYTES` of bodies, and in one
thread stores the bodies under their content addresses in one ``deferred_sync`` block (their
fsyncs made together at its end, as ``ingest`` does for a slice of files), then enqueues them
with one call of ``trioindex_enqueue_documents`` per job priority, in one transaction: one
commit (one WAL flush) for the group instead of one per upload. No row is written before the
bytes it names are durable.

Each upload's outcome is what it would have been alone (``created`` or ``unchanged``; the same
key twice in a group is two versions in arrival order); a body the store refuses is that
upload's error alone. If the enqueue call refuses the group (an element the database will not
take), each upload is stored and enqueued again alone and gets the outcome of its own
transaction, so a hostile upload is refused by itself. The handler answers only after
:meth:`GroupCommitter.submit` returns, i.e. after its row is committed; a client that goes
away while its upload is in a group's transaction does not undo it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence
from typing import BinaryIO, Final
from uuid import UUID

import attrs
import psycopg

from trioindex.db.enqueue import NewVersion, enqueue_versions
from trioindex.db.pool import Connection, Database
from trioindex.errors import ObjectNotFound
from trioindex.ingest.files import prepare_bytes, storage_key_for
from trioindex.ingest.results import IngestResult
from trioindex.storage import ObjectStore
from trioindex.worker.committer import GroupCommitter

#: Uploads enqueued in one transaction at most (the service takes
#: ``http.max-concurrent-requests`` requests at once, 64 by default).
MAX_GROUP: Final = 64
#: Bytes of bodies one group stores at most (a body is at most 1 MiB when it reaches the
#: enqueuer: larger ones are stored by their own request first).
MAX_GROUP_BYTES: Final = 8 << 20
#: Times a group's transaction is run again after PostgreSQL broke a deadlock with it (a delete
#: locks documents by id, an enqueue by key): rolled back whole, so running it again is safe.
DEADLOCK_RETRIES: Final = 3


@attrs.frozen
class Body:
    """An upload's bytes and what is known of them (``content_type`` None: guessed from the
    name)."""

    document_key: str
    original_name: str
    sha256: str
    size: int
    content_type: str | None
    handle: BinaryIO = attrs.field(repr=False)


@attrs.frozen
class StoredBody:
    """An upload's bytes in the store: the version to register, and whether an intact blob
    of these bytes was at their content address before this upload stored them."""

    version: NewVersion
    was_intact: bool


@attrs.frozen
class Upload:
    """One upload for the enqueuer: a body to store (``body``) or one stored already
    (``stored``), and its job priority."""

    priority: int
    body: Body | None = None
    stored: StoredBody | None = None


@attrs.frozen
class Enqueued:
    """One upload's outcome: its enqueue result and how its bytes were stored."""

    result: IngestResult
    stored: StoredBody


UploadEnqueuer = GroupCommitter[Upload, Enqueued]


def store_body(store: ObjectStore, body: Body) -> StoredBody:
    """Store the body under its content address (:func:`prepare_bytes` as for new bytes: a
    put is atomic, and the same address always holds the same bytes), noting first whether it
    was there: the enqueue function decides whether the bytes are a new version, so the
    document's versions are not read here. Blocking: it runs in a worker thread."""
    try:
        info = store.stat(storage_key_for(body.sha256))
        was_intact = info.size == body.size and info.sha256 in (None, body.sha256)
    except ObjectNotFound:
        was_intact = False
    body.handle.seek(0)  # from its start: a group that failed stores its bodies again, alone
    prepared = prepare_bytes(
        store,
        body.handle,
        document_key=body.document_key,
        original_name=body.original_name,
        sha256=body.sha256,
        size=body.size,
        latest=None,
        content_type=body.content_type,
    )
    return StoredBody(prepared.version, was_intact)


def store_and_enqueue(
    conn: Connection,
    uploads: Sequence[Upload],
    *,
    store: ObjectStore,
    model_id: UUID,
    max_attempts: int,
) -> list[Enqueued | Exception]:
    """Store the bodies of ``uploads`` (fsynced together), then enqueue every upload stored;
    one result per upload, in order: its outcome, or the exception refusing it. Raises
    (nothing committed) when the database refuses the enqueue."""
    stored: list[StoredBody | Exception] = []
    with store.deferred_sync():
        for upload in uploads:
            try:
                stored.append(upload.stored or _store(store, upload))
            except Exception as exc:  # this upload's own refusal; the others go on
                stored.append(exc)
    versions = [
        (s.version, upload.priority)
        for upload, s in zip(uploads, stored, strict=True)
        if isinstance(s, StoredBody)
    ]
    enqueued = iter(_enqueue_retrying(conn, versions, model_id=model_id, max_attempts=max_attempts))
    return [s if isinstance(s, Exception) else Enqueued(next(enqueued), s) for s in stored]


def _store(store: ObjectStore, upload: Upload) -> StoredBody:
    assert upload.body is not None
    return store_body(store, upload.body)


def _enqueue_retrying(
    conn: Connection,
    versions: Sequence[tuple[NewVersion, int]],
    *,
    model_id: UUID,
    max_attempts: int,
) -> list[IngestResult]:
    for attempt in range(1, DEADLOCK_RETRIES + 1):
        try:
            return _enqueue(conn, versions, model_id=model_id, max_attempts=max_attempts)
        except psycopg.errors.DeadlockDetected:
            if attempt == DEADLOCK_RETRIES:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def _enqueue(
    conn: Connection,
    versions: Sequence[tuple[NewVersion, int]],
    *,
    model_id: UUID,
    max_attempts: int,
) -> list[IngestResult]:
    """One :func:`enqueue_versions` per priority, in one transaction; results in order."""
    by_priority: dict[int, list[int]] = {}
    for i, (_, priority) in enumerate(versions):
        by_priority.setdefault(priority, []).append(i)
    results: list[IngestResult | None] = [None] * len(versions)
    # one priority (the usual case) is enqueue_versions' own transaction; several are one
    # transaction around its calls (each then a savepoint)
    with conn.transaction() if len(by_priority) > 1 else contextlib.nullcontext():
        for priority, places in by_priority.items():
            enqueued = enqueue_versions(
                conn,
                [versions[i][0] for i in places],
                model_id=model_id,
                max_attempts=max_attempts,
                priority=priority,
            )
            for i, result in zip(places, enqueued, strict=True):
                results[i] = result
    return [r for r in results if r is not None]


def _weight(upload: Upload) -> int:
    """A group's share of :data:`MAX_GROUP_BYTES`, in KiB (at least 1)."""
    return 1 + (upload.body.size >> 10 if upload.body is not None else 0)


def upload_enqueuer(
    db: Database, store: ObjectStore, *, model_id: UUID, max_attempts: int
) -> UploadEnqueuer:
    """The service's one enqueuer; its :meth:`~GroupCommitter.serve` must run while uploads
    are answered."""
    write = functools.partial(
        store_and_enqueue, store=store, model_id=model_id, max_attempts=max_attempts
    )
    return GroupCommitter(
        "upload",
        db,
        write,
        weight=_weight,
        max_items=MAX_GROUP,
        max_weight=MAX_GROUP_BYTES >> 10,
    )
