"""The database side of ingest: document + version + job + ``NOTIFY``, in one transaction.

The transaction locks the document row, so two ingests of the same key serialise and version
numbers stay dense; it ends with ``NOTIFY trioindex_jobs`` so idle workers wake at once instead
of at their next poll. Bytes equal to the latest version create nothing (``unchanged``).
"""

from __future__ import annotations

from uuid import UUID

from trioindex import admin
from trioindex.db.events import record_event
from trioindex.db.pool import Connection
from trioindex.errors import NotFound
from trioindex.ingest.results import IngestResult

__all__ = ["NOTIFY_CHANNEL", "enqueue_version", "latest_version", "requeue_failed_job"]

NOTIFY_CHANNEL = "trioindex_jobs"


def latest_version(conn: Connection, document_key: str) -> dict[str, object] | None:
    """The newest version of a document (id, number, sha256, storage key), or None."""
    return conn.execute(
        """SELECT d.id AS document_id, v.id AS version_id, v.version_no, v.sha256, v.storage_key
           FROM documents d JOIN document_versions v ON v.document_id = d.id
           WHERE d.external_key = %s ORDER BY v.version_no DESC LIMIT 1""",
        (document_key,),
    ).fetchone()


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
    with conn.transaction():
        conn.execute(
            """INSERT INTO documents (external_key) VALUES (%s)
               ON CONFLICT (external_key) DO NOTHING""",
            (document_key,),
        )
        document = conn.execute(
            "SELECT id FROM documents WHERE external_key = %s FOR UPDATE", (document_key,)
        ).fetchone()
        assert document is not None
        document_id: UUID = document["id"]
        latest = conn.execute(
            """SELECT v.id, v.version_no, v.sha256, j.id AS job_id
               FROM document_versions v
               LEFT JOIN embedding_jobs j
                 ON j.document_version_id = v.id AND j.embedding_model_id = %s
               WHERE v.document_id = %s ORDER BY v.version_no DESC LIMIT 1""",
            (model_id, document_id),
        ).fetchone()
        if latest is not None and latest["sha256"] == sha256:
            return IngestResult(
                path,
                document_key,
                "unchanged",
                document_id,
                latest["id"],
                latest["version_no"],
                latest["job_id"],
            )
        version_no = 1 if latest is None else latest["version_no"] + 1
        version = conn.execute(
            """INSERT INTO document_versions
                   (document_id, version_no, storage_key, original_name, content_type,
                    byte_size, sha256)
               VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING id""",
            (document_id, version_no, storage_key, original_name, content_type, byte_size, sha256),
        ).fetchone()
        assert version is not None
        job = conn.execute(
            """INSERT INTO embedding_jobs
                   (document_version_id, embedding_model_id, max_attempts, priority)
               VALUES (%s, %s, %s, %s) RETURNING id""",
            (version["id"], model_id, max_attempts, priority),
        ).fetchone()
        assert job is not None
        record_event(
            conn,
            "JOB_ENQUEUED",
            job_id=job["id"],
            version_id=version["id"],
            detail={"version_no": version_no, "byte_size": byte_size},
        )
        conn.execute(f"NOTIFY {NOTIFY_CHANNEL}")
    return IngestResult(
        path, document_key, "created", document_id, version["id"], version_no, job["id"]
    )


def requeue_failed_job(conn: Connection, job_id: UUID, *, extra_attempts: int) -> bool:
    """Put a FAILED job back to PENDING with a fresh budget (``jobs retry``'s own transaction,
    event and NOTIFY); False, changing nothing, when the job is not FAILED."""
    try:
        admin.retry_failed_job(conn, job_id, extra_attempts=extra_attempts)
    except NotFound:
        return False
    return True
