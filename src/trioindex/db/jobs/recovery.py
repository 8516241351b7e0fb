"""Lease recovery (expired claims back to the queue, or FAILED on their last attempt) and the
drain count of the work a draining worker still owes."""

from __future__ import annotations

from uuid import UUID

from trioindex.db.jobs.attempt_steps import ATTEMPT_STEPS_CLEARED
from trioindex.db.pool import Connection
from trioindex.values import BackoffPolicy, DrainState, FailOutcome, RecoveredJob

# One statement: one round trip, atomic without BEGIN/COMMIT.
_RECOVER_SQL = """
WITH expired AS (
    -- the locked row as it is now (a step committed after this statement began included):
    -- what the attempt's row records
    SELECT j.id, j AS job FROM embedding_jobs j
    -- IS NOT NULL, a condition the open-jobs index can use (the clock's is not): only the
    -- PROCESSING jobs' entries are read, not those of the PENDING and FAILED jobs beside them
    WHERE j.status = 'PROCESSING' AND j.lease_expires_at IS NOT NULL
      AND j.lease_expires_at <= clock_timestamp()
    ORDER BY j.lease_expires_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
), attempt AS (
    -- the running attempt's row, written as it ends, from the job row before it is freed
    INSERT INTO embedding_job_attempts
    SELECT a.* FROM expired e
    CROSS JOIN LATERAL trioindex_ended_attempt(e.job, 'EXPIRED') AS a
    RETURNING id, embedding_job_id, attempt_no
), job AS (
    UPDATE embedding_jobs j
    SET status = CASE WHEN j.attempt_count < j.max_attempts THEN 'PENDING' ELSE 'FAILED' END,
        available_at = CASE WHEN j.attempt_count < j.max_attempts
            THEN now() + make_interval(secs => trioindex_retry_delay(
                 j.attempt_count, %(initial)s, %(max)s, %(jitter)s, random()))
            ELSE j.available_at END,
        finished_at = CASE WHEN j.attempt_count < j.max_attempts THEN NULL ELSE now() END,
        last_failure_type = CASE WHEN j.attempt_count < j.max_attempts
            THEN j.last_failure_type ELSE 'WORKER_INTERNAL_ERROR' END,
        last_failure_message = CASE WHEN j.attempt_count < j.max_attempts
            THEN j.last_failure_message
            ELSE 'the lease expired on the last attempt (worker stopped renewing it)' END,
        worker_id = NULL, claim_token = NULL, locked_at = NULL, lease_expires_at = NULL,
        attempt_id = NULL, {attempt_steps_cleared}
    FROM expired e
    WHERE j.id = e.id
    RETURNING j.id, j.status, j.document_version_id, j.attempt_count
), event AS (
    INSERT INTO indexing_events
        (event_type, embedding_job_id, document_version_id, attempt_id, detail)
    SELECT CASE WHEN job.status = 'FAILED' THEN 'LEASE_EXPIRED_FAILED'
                ELSE 'LEASE_EXPIRED_REQUEUED' END,
           job.id, job.document_version_id, attempt.id,
           jsonb_build_object('attempt_no', job.attempt_count)
    FROM job LEFT JOIN attempt ON attempt.embedding_job_id = job.id
)
SELECT id, status, attempt_count FROM job
""".replace("{attempt_steps_cleared}", ATTEMPT_STEPS_CLEARED)


def recover_expired(
    conn: Connection, backoff: BackoffPolicy, *, batch: int = 100
) -> list[RecoveredJob]:
    """Return PROCESSING jobs whose lease has expired to the queue, in one atomic statement.

    The attempt becomes EXPIRED; the job goes back to PENDING with backoff
    (``trioindex_retry_delay``, as for a failure report), or to FAILED when its attempts are
    spent. Rows another transaction holds — a renewal or a completion in
    flight — are skipped, so recovery and the owner never both win.
    """
    rows = conn.execute(
        _RECOVER_SQL,
        {
            "batch": batch,
            "max": backoff.maximum,
            "initial": backoff.initial,
            "jitter": backoff.jitter,
        },
    ).fetchall()
    return [
        RecoveredJob(
            job_id=row["id"],
            attempt_no=row["attempt_count"],
            outcome=FailOutcome.FAILED
            if row["status"] == "FAILED"
            else FailOutcome.RETRY_SCHEDULED,
        )
        for row in rows
    ]


_DRAIN_SQL = """
SELECT count(*) FILTER (WHERE j.status = 'PENDING') AS scheduled,
       count(*) FILTER (WHERE j.status = 'PROCESSING') AS orphaned,
       count(*) FILTER (WHERE j.status = 'PROCESSING'
                          AND j.lease_expires_at <= clock_timestamp()) AS expired_orphans,
       greatest(0, extract(epoch FROM min(CASE WHEN j.status = 'PENDING' THEN j.available_at
                                               ELSE j.lease_expires_at END)
                                      - clock_timestamp()))::float8 AS next_due_in
FROM embedding_jobs j
LEFT JOIN indexing_workers w ON w.id = j.worker_id
WHERE j.worker_id IS DISTINCT FROM %(me)s
  AND (%(model)s::uuid IS NULL OR j.embedding_model_id = %(model)s::uuid)
  AND (j.status = 'PENDING'
       OR (j.status = 'PROCESSING'
           AND NOT (w.status = 'RUNNING'
                    AND w.last_heartbeat_at > now() - make_interval(secs => %(timeout)s))))
"""


def drain_state(
    conn: Connection, model_id: UUID | None, *, heartbeat_timeout: float, exclude: UUID
) -> DrainState:
    """Count the work a draining worker still owes (see :class:`DrainState`); one read.

    Jobs held by ``exclude`` (the draining worker itself) are not orphans: it is alive and
    waits for its own jobs anyway.
    """
    row = conn.execute(
        _DRAIN_SQL,
        {"model": model_id, "timeout": heartbeat_timeout, "me": exclude},
    ).fetchone()
    assert row is not None
    return DrainState(
        scheduled=row["scheduled"],
        orphaned=row["orphaned"],
        expired_orphans=row["expired_orphans"],
        next_due_in=row["next_due_in"],
    )
