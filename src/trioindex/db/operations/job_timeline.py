"""A job's timeline for operators: its event rows, and its claims and success as its attempts
record them (ids, counts, attempt numbers, failure types and model names only)."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

import attrs

from trioindex.db.pool import Connection


@attrs.frozen
class EventView:
    """One entry of a job's timeline: its type, time, attempt and worker, and ``detail`` (ids,
    counts, attempt numbers, failure types and model names only). ``id`` is the event row's;
    None for ``JOB_CLAIMED`` and ``JOB_SUCCEEDED``, which are read from the attempt row."""

    id: int | None
    event_type: str
    created_at: datetime
    attempt_id: UUID | None
    worker_id: UUID | None
    detail: dict[str, Any]


# The job's event rows, and its claims and success from its attempts (each attempt's
# started_at is a claim, the running one's included; a SUCCEEDED attempt's finished_at the
# success, with the job's chunk count: a job succeeds once). At one time, a claim comes first
# and a success last.
_TIMELINE_SQL = """
SELECT * FROM (
    SELECT e.id, e.event_type, e.created_at, e.attempt_id, e.worker_id, e.detail, 1 AS rank
    FROM indexing_events e WHERE e.embedding_job_id = %(job)s
    UNION ALL
    SELECT NULL, 'JOB_CLAIMED', a.started_at, a.id, a.worker_id,
           jsonb_build_object('attempt_no', a.attempt_no), 0
    FROM trioindex_job_attempts a WHERE a.embedding_job_id = %(job)s
    UNION ALL
    SELECT NULL, 'JOB_SUCCEEDED', a.finished_at, a.id, a.worker_id,
           jsonb_build_object('attempt_no', a.attempt_no, 'chunks', j.chunk_count,
                              'became_current', a.became_current), 2
    FROM embedding_job_attempts a JOIN embedding_jobs j ON j.id = a.embedding_job_id
    WHERE a.embedding_job_id = %(job)s AND a.status = 'SUCCEEDED'
) AS timeline
ORDER BY created_at, rank, id LIMIT %(limit)s
"""


def job_events(conn: Connection, job_id: UUID, *, limit: int = 500) -> list[EventView]:
    """The first ``limit`` entries of a job's timeline, oldest first: its events, and its
    claims and success as its attempt rows record them."""
    return [
        EventView(
            row["id"],
            row["event_type"],
            row["created_at"],
            row["attempt_id"],
            row["worker_id"],
            row["detail"],
        )
        for row in conn.execute(_TIMELINE_SQL, {"job": job_id, "limit": limit}).fetchall()
    ]
