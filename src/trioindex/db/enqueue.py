"""The database side of ingest: document + version + job + ``NOTIFY``, many files per transaction.

The rules live in one SQL function, ``trioindex_enqueue_documents`` (``functions.sql``), which
applications call from SQL in their own transactions too: each file's document row is locked,
so two ingests of the same key serialise and version numbers stay dense; ``NOTIFY
trioindex_jobs`` goes with the commit, so idle workers wake at once instead of at their next
poll. Bytes equal to the latest version create nothing (``unchanged``). A run enqueues its
files in groups (:func:`enqueue_versions`): one transaction and one WAL flush for a few hundred
files instead of one each, with every file's outcome the same as if it had been enqueued alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final, TypeVar
from uuid import UUID

import attrs
import psycopg

from trioindex.db.operations.job_listings import retry_failed_job
from trioindex.db.pool import Connection
from trioindex.errors import NotFound

T = TypeVar("T")

#: Times an enqueue transaction runs in all while PostgreSQL keeps choosing it as the victim of
#: a deadlock.
DEADLOCK_ATTEMPTS: Final = 3

__all__ = [
    "NOTIFY_CHANNEL",
    "IngestResult",
    "NewVersion",
    "enqueue_version",
    "enqueue_versions",
    "latest_version",
    "latest_versions",
    "requeue_failed_job",
]

NOTIFY_CHANNEL = "trioindex_jobs"


@attrs.frozen
class IngestResult:
    """What happened to one file: ``created``, ``unchanged`` or ``repaired``.

    ``repaired``: the bytes were already the latest version, but the store had lost its blob;
    the blob was uploaded again, and ``requeued`` says whether the version's FAILED job went
    back to the queue.
    """

    path: str
    document_key: str
    status: str
    document_id: UUID
    version_id: UUID
    version_no: int
    job_id: UUID | None
    requeued: bool = False

    @property
    def change(self) -> str:
        """``added`` (a new document), ``changed`` (a new version), else the status."""
        if self.status != "created":
            return self.status
        return "added" if self.version_no == 1 else "changed"

    def as_json(self) -> dict[str, object]:
        return {
            "path": self.path,
            "document_key": self.document_key,
            "status": self.status,
            "change": self.change,
            "document_id": str(self.document_id),
            "version_id": str(self.version_id),
            "version_no": self.version_no,
            "job_id": str(self.job_id) if self.job_id else None,
            "requeued": self.requeued,
        }


@attrs.frozen
class NewVersion:
    """One uploaded file to enqueue: its document key and the stored blob's facts."""

    document_key: str
    storage_key: str
    original_name: str
    content_type: str | None
    byte_size: int
    sha256: str
    path: str = ""  # as reported (printable), never read
    source_etag: str | None = None  # the bucket object's ETag, for objects registered in place


def latest_version(conn: Connection, document_key: str) -> dict[str, object] | None:
    """The newest version of a document (id, number, sha256, storage key, size, source ETag),
    or None."""
    return latest_versions(conn, [document_key]).get(document_key)


def latest_versions(conn: Connection, document_keys: Sequence[str]) -> dict[str, dict[str, object]]:
    """:func:`latest_version` of many documents in one query, by key (absent: no document)."""
    rows = conn.execute(
        """SELECT DISTINCT ON (d.external_key) d.external_key, d.id AS document_id,
                  v.id AS version_id, v.version_no, v.sha256, v.storage_key, v.byte_size,
                  v.source_etag
           FROM documents d JOIN document_versions v ON v.document_id = d.id
           WHERE d.external_key = ANY(%s) ORDER BY d.external_key, v.version_no DESC""",
        (list(document_keys),),
    ).fetchall()
    return {row.pop("external_key"): row for row in rows}


def retry_deadlocks(transaction: Callable[[], T]) -> T:
    """Run ``transaction`` (one whole transaction) and return what it returns; run it again
    when PostgreSQL broke a deadlock by aborting it, at most :data:`DEADLOCK_ATTEMPTS` times in
    all. Another transaction locked some of its documents in another order (a delete locks
    them by id, an enqueue by key); it was rolled back whole, so running it again is safe."""
    for attempt in range(1, DEADLOCK_ATTEMPTS + 1):
        try:
            return transaction()
        except psycopg.errors.DeadlockDetected:
            if attempt == DEADLOCK_ATTEMPTS:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def enqueue_version(
    conn: Connection,
    *,
    document_key: str,
    storage_key: str,
    original_name: str,
    content_type: str | None,
    byte_size: int,
    sha256: str,
    model_id: UUID,
    max_attempts: int,
    priority: int = 0,
    path: str = "",
) -> IngestResult:
    """Document (if new) + version UPLOADED + job PENDING + NOTIFY, in one transaction.

    If the document's latest version has the same bytes, nothing is created and the existing
    version is returned as ``unchanged``.
    """
    version = NewVersion(
        document_key, storage_key, original_name, content_type, byte_size, sha256, path
    )
    (result,) = enqueue_versions(
        conn, [version], model_id=model_id, max_attempts=max_attempts, priority=priority
    )
    return result


def enqueue_versions(
    conn: Connection,
    versions: Sequence[NewVersion],
    *,
    model_id: UUID,
    max_attempts: int,
    priority: int = 0,
) -> list[IngestResult]:
    """:func:`enqueue_version` for each of ``versions``, all in one transaction with one
    ``NOTIFY`` (when a job was created); results in the order given.

    One call of ``trioindex_enqueue_documents``, the function applications call from SQL too,
    so ingest and an application enqueue by the same rules: document rows locked in key order
    (two runs over overlapping keys wait for each other instead of deadlocking), the same key
    twice becomes two versions in that order (the second ``unchanged`` when its bytes are the
    first's).
    """
    if not versions:
        return []
    with conn.transaction():
        rows = conn.execute(
            """SELECT * FROM trioindex_enqueue_documents(
                   %s::text[], %s::text[], %s::text[], %s::bigint[], %s::text[], %s::text[],
                   %s, %s, %s, %s::text[])""",
            (
                [v.document_key for v in versions],
                [v.storage_key for v in versions],
                [v.sha256 for v in versions],
                [v.byte_size for v in versions],
                [v.content_type for v in versions],
                [v.original_name for v in versions],
                priority,
                max_attempts,
                model_id,
                [v.source_etag for v in versions],
            ),
        ).fetchall()
    return [
        IngestResult(
            new.path,
            new.document_key,
            row["status"],
            row["document_id"],
            row["version_id"],
            row["version_no"],
            row["job_id"],
        )
        for new, row in zip(versions, sorted(rows, key=lambda r: r["ord"]), strict=True)
    ]


def requeue_failed_job(conn: Connection, job_id: UUID, *, extra_attempts: int) -> bool:
    """Put a FAILED job back to PENDING with a fresh budget (``jobs retry``'s own transaction,
    event and NOTIFY); False, changing nothing, when the job is not FAILED."""
    try:
        retry_failed_job(conn, job_id, extra_attempts=extra_attempts)
    except NotFound:
        return False
    return True
