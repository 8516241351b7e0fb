"""Job listings for operators: a page of jobs with their attempts, the jobs a filter matches
(and how many), the jobs an id prefix names, one job with its attempts, the FAILED jobs, and
manual retry of a FAILED job. :data:`JOB_SELECT` is the one query that reads a job as
:class:`~trioindex.values.JobView` shows it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

import attrs

from trioindex.db.jobs import retry_failed
from trioindex.db.pool import Connection
from trioindex.errors import FailureType, NotFound
from trioindex.values import AttemptView, JobStatus, JobView

JOB_SELECT = """
SELECT j.id, j.status, j.priority, j.attempt_count, j.max_attempts, j.available_at, j.worker_id,
       j.lease_expires_at, j.progress, j.last_failure_type, j.last_failure_message, j.created_at,
       j.finished_at, j.chunk_count, d.external_key, v.version_no,
       EXISTS (SELECT 1 FROM served_versions s
               WHERE s.embedding_model_id = j.embedding_model_id
                 AND s.document_version_id = j.document_version_id) AS version_served,
       m.name AS model_name,
       (SELECT count(*) FROM trioindex_job_attempts a
        WHERE a.embedding_job_id = j.id AND a.status <> 'CANCELLED'
          AND a.started_at > coalesce(
              (SELECT max(e.created_at) FROM indexing_events e
               WHERE e.embedding_job_id = j.id AND e.event_type = 'JOB_RETRY_REQUESTED'),
              '-infinity')) AS attempts_spent
FROM embedding_jobs j
JOIN document_versions v ON v.id = j.document_version_id
JOIN documents d ON d.id = v.document_id
JOIN embedding_models m ON m.id = j.embedding_model_id
"""


@attrs.frozen
class JobFilter:
    """Which jobs a listing shows: each field None (or "") matches every job. ``since``
    keeps the jobs created at or after it; ``key_prefix`` the jobs of documents whose key
    starts with it."""

    status: JobStatus | None = None
    failure_type: FailureType | None = None
    model: str | None = None
    key_prefix: str = ""
    since: datetime | None = None

    def where(self) -> tuple[str, dict[str, Any]]:
        """The SQL condition on ``JOB_SELECT``'s aliases, and its parameters."""
        return (
            """(%(status)s::text IS NULL OR j.status = %(status)s)
               AND (%(failure)s::text IS NULL OR j.last_failure_type = %(failure)s)
               AND (%(model)s::text IS NULL OR m.name = %(model)s)
               AND starts_with(d.external_key, %(prefix)s)
               AND (%(since)s::timestamptz IS NULL OR j.created_at >= %(since)s)""",
            {
                "status": self.status.value if self.status else None,
                "failure": self.failure_type.value if self.failure_type else None,
                "model": self.model,
                "prefix": self.key_prefix,
                "since": self.since,
            },
        )


def list_jobs(
    conn: Connection,
    *,
    status: JobStatus | None = None,
    limit: int = 50,
    where: JobFilter | None = None,
    offset: int = 0,
) -> list[JobView]:
    """The newest jobs ``where`` matches (or of ``status``), from ``offset``, at most
    ``limit``."""
    condition, params = (where or JobFilter(status=status)).where()
    rows = conn.execute(
        f"""{JOB_SELECT} WHERE {condition}
            ORDER BY j.created_at DESC, j.id LIMIT %(limit)s OFFSET %(offset)s""",
        {**params, "limit": limit, "offset": offset},
    ).fetchall()
    return [JobView.from_row(row) for row in rows]


def count_jobs(conn: Connection, where: JobFilter) -> int:
    """How many jobs ``where`` matches."""
    condition, params = where.where()
    row = conn.execute(
        f"""SELECT count(*) AS n FROM embedding_jobs j
            JOIN document_versions v ON v.id = j.document_version_id
            JOIN documents d ON d.id = v.document_id
            JOIN embedding_models m ON m.id = j.embedding_model_id
            WHERE {condition}""",
        params,
    ).fetchone()
    return int(row["n"]) if row else 0


def show_job(conn: Connection, job_id: UUID) -> JobView:
    with conn.transaction():
        row = conn.execute(f"{JOB_SELECT} WHERE j.id = %s", (job_id,)).fetchone()
        if row is None:
            raise NotFound(f"no job with id {job_id}")
        attempts = tuple(
            AttemptView.from_row(a)
            for a in conn.execute(
                """SELECT * FROM trioindex_job_attempts
                   WHERE embedding_job_id = %s ORDER BY attempt_no""",
                (job_id,),
            ).fetchall()
        )
    return JobView.from_row(row, attempts)


def retry_failed_job(conn: Connection, job_id: UUID, *, extra_attempts: int) -> JobView:
    """FAILED → PENDING with a fresh budget of ``extra_attempts`` attempts (the transition is
    :func:`trioindex.db.jobs.retry_failed`); the job as it is now.

    The version goes back to UPLOADED so the whole pipeline runs again (the parse step replaces
    the chunks atomically; attempt numbers continue where they stopped).
    """
    retry_failed(conn, job_id, extra_attempts=extra_attempts)
    return show_job(conn, job_id)


def failed_job_ids(conn: Connection, failure_type: FailureType | None = None) -> list[UUID]:
    """The FAILED jobs, oldest first; only those whose last failure is ``failure_type`` when
    one is given."""
    return [
        row["id"]
        for row in conn.execute(
            """SELECT id FROM embedding_jobs
               WHERE status = 'FAILED' AND (%(t)s::text IS NULL OR last_failure_type = %(t)s)
               ORDER BY created_at""",
            {"t": failure_type.value if failure_type else None},
        ).fetchall()
    ]


@attrs.frozen
class JobPage:
    """The newest ``jobs`` (each with its attempts) and how many jobs the filter matches."""

    jobs: tuple[JobView, ...]
    total: int


def job_page(conn: Connection, *, status: JobStatus | None = None, limit: int = 50) -> JobPage:
    """:func:`list_jobs` with every listed job's attempts, and the count of all it matched."""
    with conn.transaction():
        jobs = list_jobs(conn, status=status, limit=limit)
        total = count_jobs(conn, JobFilter(status=status))
        attempts: dict[UUID, list[AttemptView]] = {}
        for a in conn.execute(
            """SELECT * FROM trioindex_job_attempts WHERE embedding_job_id = ANY(%s)
               ORDER BY embedding_job_id, attempt_no""",
            ([j.id for j in jobs],),
        ).fetchall():
            attempts.setdefault(a["embedding_job_id"], []).append(AttemptView.from_row(a))
    listed = tuple(attrs.evolve(j, attempts=tuple(attempts.get(j.id, ()))) for j in jobs)
    return JobPage(listed, total)


def job_ids_with_prefix(conn: Connection, prefix: str, *, limit: int = 2) -> list[UUID]:
    """Up to ``limit`` job ids whose text form starts with ``prefix`` (lower-case hex and
    hyphens, as the ids are printed)."""
    return [
        row["id"]
        for row in conn.execute(
            "SELECT id FROM embedding_jobs WHERE starts_with(id::text, %s) ORDER BY id LIMIT %s",
            (prefix, limit),
        ).fetchall()
    ]
