"""The operator's retry of a FAILED job."""

from __future__ import annotations

from uuid import UUID

from trioindex.db.events import record_event
from trioindex.db.pool import Connection
from trioindex.errors import NotFound


def retry_failed(conn: Connection, job_id: UUID, *, extra_attempts: int) -> None:
    """FAILED → PENDING with a fresh budget of ``extra_attempts`` attempts, claimable at once.

    The next claim runs what is left (the parse when its chunk set is missing, else the embed
    step); attempt numbers continue where they stopped. Raises :class:`NotFound` (changing
    nothing) when there is no such job or it is not FAILED.
    """
    with conn.transaction():
        row = conn.execute(
            "SELECT id, status, document_version_id FROM embedding_jobs WHERE id = %s FOR UPDATE",
            (job_id,),
        ).fetchone()
        if row is None:
            raise NotFound(f"no job with id {job_id}")
        if row["status"] != "FAILED":
            raise NotFound(f"job {job_id} is {row['status']}; only FAILED jobs can be retried")
        conn.execute(
            """UPDATE embedding_jobs
               SET status = 'PENDING', available_at = now(), finished_at = NULL, progress = 0,
                   max_attempts = attempt_count + %s
               WHERE id = %s""",
            (extra_attempts, job_id),
        )
        record_event(
            conn,
            "JOB_RETRY_REQUESTED",
            job_id=job_id,
            version_id=row["document_version_id"],
            detail={"extra_attempts": extra_attempts},
        )
        conn.execute("NOTIFY trioindex_jobs")
