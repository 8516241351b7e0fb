"""Concurrent uploads enqueued together: one transaction for every upload stored while the
previous group was being committed.

Each upload's request stores its body (:func:`store_body`, in a store thread of its own, so
the uploads' writes and fsyncs run side by side), then hands the stored version to the
service's :class:`UploadEnqueuer` and waits for its own result. A Trio task of the service
(:meth:`GroupCommitter.serve`, the worker's group committer) takes what has gathered, at most
:data:`MAX_GROUP` uploads, and enqueues them with one call of ``trioindex_enqueue_documents``
per job priority, in one transaction: one commit (one WAL flush) and one worker-thread call
for the group instead of one each. The enqueue function decides whether bytes are a new
version, so no upload reads the document's versions first.

Each upload's outcome is what it would have been alone (``created`` or ``unchanged``; the same
key twice in a group is two versions in arrival order). If the call refuses the group (an
element the database will not take), each upload is enqueued again alone and gets the outcome
of its own transaction, so a hostile upload is refused by itself. The handler answers only
after :meth:`GroupCommitter.submit` returns, i.e. after its row is committed; a client that
goes away while its upload is in a group's transaction does not undo it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Mapping, Sequence
from typing import BinaryIO, Final
from uuid import UUID

import attrs

from trioindex.db.enqueue import NewVersion, enqueue_versions, retry_deadlocks
from trioindex.db.pool import Connection, Database
from trioindex.errors import ObjectNotFound
from trioindex.ingest.files import PreparedFile, prepare_bytes, storage_key_for
from trioindex.ingest.results import IngestResult
from trioindex.storage import ObjectStore
from trioindex.worker.committer import GroupCommitter

#: Uploads enqueued in one transaction at most (the service takes
#: ``http.max-concurrent-requests`` requests at once, 64 by default).
MAX_GROUP: Final = 64


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
    """One stored upload for the enqueuer, with its job priority."""

    stored: StoredBody
    priority: int = 0


UploadEnqueuer = GroupCommitter[Upload, IngestResult]


def store_body(store: ObjectStore, body: Body) -> StoredBody:
    """Store the body under its content address (:func:`prepare_bytes` as for new bytes: a
    put is atomic, and the same address always holds the same bytes), noting first whether it
    was there. Blocking: it runs in a store thread."""
    try:
        info = store.stat(storage_key_for(body.sha256))
        was_intact = info.size == body.size and info.sha256 in (None, body.sha256)
    except ObjectNotFound:
        was_intact = False
    return StoredBody(prepare_body(store, body, latest=None).version, was_intact)


def prepare_body(
    store: ObjectStore, body: Body, *, latest: Mapping[str, object] | None
) -> PreparedFile:
    """:func:`prepare_bytes` of an upload's body (``latest``: its document's newest version
    when it was read, None to store the bytes whatever it is). Blocking."""
    return prepare_bytes(
        store,
        body.handle,
        document_key=body.document_key,
        original_name=body.original_name,
        sha256=body.sha256,
        size=body.size,
        latest=latest,
        content_type=body.content_type,
    )


def enqueue_group(
    conn: Connection, uploads: Sequence[Upload], *, model_id: UUID, max_attempts: int
) -> list[IngestResult | Exception]:
    """``uploads`` in one transaction, one :func:`enqueue_versions` per priority; one result
    per upload, in order, run again after a deadlock (:func:`retry_deadlocks`). Raises
    (nothing committed) when the database refuses any of them."""
    by_priority: dict[int, list[int]] = {}
    for i, upload in enumerate(uploads):
        by_priority.setdefault(upload.priority, []).append(i)

    def enqueue_all() -> list[IngestResult | Exception]:
        placed: list[tuple[int, IngestResult]] = []
        # one priority (the usual case) is enqueue_versions' own transaction; several are one
        # transaction around its calls (each then a savepoint)
        with conn.transaction() if len(by_priority) > 1 else contextlib.nullcontext():
            for priority, places in by_priority.items():
                enqueued = enqueue_versions(
                    conn,
                    [uploads[i].stored.version for i in places],
                    model_id=model_id,
                    max_attempts=max_attempts,
                    priority=priority,
                )
                placed += zip(places, enqueued, strict=True)
        return [result for _, result in sorted(placed, key=lambda pair: pair[0])]

    return retry_deadlocks(enqueue_all)


def upload_enqueuer(db: Database, *, model_id: UUID, max_attempts: int) -> UploadEnqueuer:
    """The service's one enqueuer; its :meth:`~GroupCommitter.serve` must run while uploads
    are answered."""
    write = functools.partial(enqueue_group, model_id=model_id, max_attempts=max_attempts)
    return GroupCommitter("upload-enqueue", db, write, max_items=MAX_GROUP, max_weight=MAX_GROUP)
