"""What ``ingest --wait`` polls: the progress of the jobs an ingest created, and those of them
held by a lease whose worker is no longer live."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from trioindex.db.pool import Connection


def jobs_progress(conn: Connection, job_ids: list[UUID]) -> list[dict[str, Any]]:
    """Status, progress, chunk count and failure type of the given jobs (for ``ingest --wait``)."""
    return conn.execute(
        """SELECT j.id, j.status, j.progress, j.last_failure_type, j.last_failure_message,
                  d.external_key, j.chunk_count,
                  (SELECT count(*) FROM embeddings e
                    WHERE e.document_version_id = j.document_version_id
                      AND e.embedding_model_id = j.embedding_model_id) AS embedded
           FROM embedding_jobs j
           JOIN document_versions v ON v.id = j.document_version_id
           JOIN documents d ON d.id = v.document_id
           WHERE j.id = ANY(%s)""",
        (job_ids,),
    ).fetchall()


def abandoned_leases(
    conn: Connection, job_ids: list[UUID], heartbeat_timeout: float
) -> list[dict[str, Any]]:
    """The given jobs that are PROCESSING under a worker that is not live (not RUNNING, or no
    heartbeat within ``heartbeat_timeout`` seconds): each with its document key, that worker
    and when its lease expires (``seconds_left``, 0 once it has), for ``ingest --wait``."""
    return conn.execute(
        """SELECT j.id, d.external_key, j.worker_id, j.lease_expires_at,
                  greatest(0, extract(epoch FROM j.lease_expires_at - now()))::float8
                      AS seconds_left
           FROM embedding_jobs j
           JOIN document_versions v ON v.id = j.document_version_id
           JOIN documents d ON d.id = v.document_id
           WHERE j.id = ANY(%s) AND j.status = 'PROCESSING'
             AND NOT EXISTS (
                 SELECT 1 FROM indexing_workers w
                 WHERE w.id = j.worker_id AND w.status = 'RUNNING'
                   AND w.last_heartbeat_at > now() - make_interval(secs => %s))
           ORDER BY d.external_key""",
        (job_ids, heartbeat_timeout),
    ).fetchall()
