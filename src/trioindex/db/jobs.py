"""The job state machine on PostgreSQL: worker rows, claim, renew, complete, fail, release,
recover, operator retry and the drain count — every write of ``embedding_jobs.status`` (and of
the attempts' status) from Python is one function here; the fenced ones are SQL functions of
``functions.sql`` that these call (docs/design/state-machine.md lists every transition).

Every public function takes a connection in autocommit mode and runs exactly one short
transaction: a ``with conn.transaction()`` block, or a single statement, which autocommit makes
its own transaction without the extra BEGIN/COMMIT round trips (see docs/design/architecture.md).
:class:`trioindex.worker.queue.JobQueue` is the async facade that runs them in threads. Lock order
is always job row, then version row, then document row. A job is the state of one (version,
model) pair: failing, retrying or recovering it never touches another model's job or what
another model serves. Events are written through :mod:`trioindex.db.events`.

Every write after the claim — renew included — goes through the fence
(:mod:`trioindex.db.fence`): a claim that no longer owns its job gets
:class:`~trioindex.errors.OwnershipLost` (raised by a one-job function, returned in its own
result by a group function: the group renewal, the grouped completion) and nothing is written
for it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from datetime import datetime
from uuid import UUID

from trioindex.db.events import record_claim_event, record_event
from trioindex.db.fence import claim_arrays, fenced_errors, lock_owned_job, refusal_error
from trioindex.db.pool import Connection
from trioindex.errors import FailureType, ModelRemoved, NotFound, bounded
from trioindex.values import (
    CHARACTER_CHUNKING,
    BackoffPolicy,
    Claim,
    CompleteResult,
    DrainState,
    FailOutcome,
    FailResult,
    RecoveredJob,
    WorkerStatus,
)

_system_random = random.SystemRandom()


# ---------------------------------------------------------------------------------------------
# workers


def register_worker(
    conn: Connection,
    *,
    hostname: str,
    pid: int,
    version: str,
    max_concurrency: int,
    chunking: str = CHARACTER_CHUNKING,
) -> UUID:
    """Write the worker row as RUNNING; only after this may the worker claim. ``chunking``
    names the chunk set its chunker makes; its claims carry it."""
    with conn.transaction():
        row = conn.execute(
            """INSERT INTO indexing_workers
                   (hostname, pid, version, status, max_concurrency, chunking)
               VALUES (%s, %s, %s, 'RUNNING', %s, %s) RETURNING id""",
            (hostname, pid, version, max_concurrency, chunking),
        ).fetchone()
        assert row is not None
        worker_id: UUID = row["id"]
        record_event(
            conn,
            "WORKER_REGISTERED",
            worker_id=worker_id,
            detail={"hostname": hostname, "pid": pid, "max_concurrency": max_concurrency},
        )
    return worker_id


def heartbeat(conn: Connection, worker_id: UUID) -> bool:
    """Touch the heartbeat; False when the row is gone or already STOPPED."""
    row = conn.execute(
        """UPDATE indexing_workers SET last_heartbeat_at = now()
           WHERE id = %s AND status <> 'STOPPED' RETURNING id""",
        (worker_id,),
    ).fetchone()
    return row is not None


_WORKER_STATUS_SQL = {
    WorkerStatus.STOPPING: """UPDATE indexing_workers SET status = 'STOPPING'
                              WHERE id = %s AND status = 'RUNNING' RETURNING id""",
    WorkerStatus.STOPPED: """UPDATE indexing_workers SET status = 'STOPPED', stopped_at = now()
                             WHERE id = %s AND status <> 'STOPPED' RETURNING id""",
}


def set_worker_status(conn: Connection, worker_id: UUID, status: WorkerStatus) -> None:
    """Move the worker RUNNING → STOPPING, or to STOPPED (final)."""
    sql = _WORKER_STATUS_SQL.get(status)
    if sql is None:
        raise ValueError(f"a worker can only be moved to STOPPING or STOPPED, not {status}")
    with conn.transaction():
        row = conn.execute(sql, (worker_id,)).fetchone()
        if row is not None:
            record_event(conn, f"WORKER_{status.value}", worker_id=worker_id)


# ---------------------------------------------------------------------------------------------
# claim + attempt start

# The statement is its own transaction (autocommit), and its commit does not wait for the WAL
# to reach the disk (synchronous_commit off, local to this transaction: set while the statement
# runs, read when it commits). A claim lost in a crash leaves the job PENDING with no attempt,
# as if it had never been claimed, and the worker's later writes are refused by the fence; any
# later synchronous commit (a completion, a failure report) flushes the claim's WAL before its
# own, so nothing that follows a claim outlives it.
_CLAIM_SQL = """
WITH worker AS (
    SELECT id, chunking FROM indexing_workers
    WHERE id = %(worker)s AND status = 'RUNNING'
      AND set_config('synchronous_commit', 'off', true) IS NOT NULL
), picked AS (
    SELECT j.id
    FROM embedding_jobs j, worker
    WHERE j.status = 'PENDING' AND j.available_at <= now()
      AND (%(model)s::uuid IS NULL OR j.embedding_model_id = %(model)s::uuid)
    ORDER BY j.priority DESC, j.available_at, j.id
    LIMIT %(k)s
    FOR UPDATE OF j SKIP LOCKED
), claimed AS (
    UPDATE embedding_jobs j
    SET status = 'PROCESSING',
        worker_id = %(worker)s,
        claim_token = gen_random_uuid(),
        locked_at = now(),
        lease_expires_at = now() + make_interval(secs => %(lease)s),
        attempt_count = j.attempt_count + 1,
        chunking = worker.chunking,
        -- the attempt runs on the job row (its start is locked_at); its row is written when
        -- it ends, under this id. No event is written for the claim.
        attempt_id = gen_random_uuid(),
        attempt_parse_started_at = NULL, attempt_chunks_stored_at = NULL, attempt_chunks = NULL,
        attempt_characters = NULL, attempt_replaced_sequences = NULL,
        attempt_embedding_started_at = NULL, attempt_embeddings_stored_at = NULL,
        attempt_embeddings = NULL, attempt_embedding_slices = NULL
    FROM picked, worker
    WHERE j.id = picked.id
    RETURNING j.id, j.worker_id, j.claim_token, j.document_version_id, j.embedding_model_id,
              j.attempt_count, j.lease_expires_at, j.chunking, j.attempt_id
)
SELECT c.id AS job_id, c.worker_id, c.claim_token, c.document_version_id, c.embedding_model_id,
       c.lease_expires_at, c.attempt_id, c.attempt_count AS attempt_no,
       d.external_key AS document_key, c.chunking,
       -- what the parse reads (when the set is not stored): the claim begins the parse step
       v.document_id, v.storage_key, v.original_name, v.content_type, v.byte_size, v.sha256,
       now() AS parse_started_at,
       -- the set's first chunk by its key: an EXISTS is planned as a sequential scan when the
       -- statistics say a version holds many chunks (one large document), read to the end for
       -- a version without chunks; the first of an ordered set is an index probe whatever they say
       (SELECT ch.id FROM document_chunks ch
        WHERE ch.document_version_id = c.document_version_id
          AND ch.chunking = c.chunking
        ORDER BY ch.chunk_index LIMIT 1) IS NOT NULL AS chunks_ready
FROM claimed c
JOIN document_versions v ON v.id = c.document_version_id
JOIN documents d ON d.id = v.document_id
"""


def claim_jobs(
    conn: Connection,
    worker_id: UUID,
    k: int,
    lease_seconds: float,
    *,
    model_id: UUID | None = None,
) -> list[Claim]:
    """Claim up to ``k`` claimable PENDING jobs and start an attempt on each, in one statement
    (whose commit does not wait for the disk: see ``_CLAIM_SQL``).

    Highest priority first, then oldest ``available_at``; rows locked by another claimer are
    skipped. The claim starts the attempt on the job row (``attempt_id``, ``attempt_count``
    incremented under the row lock, its start ``locked_at``): a running attempt exists exactly
    when a claim does, and its row in ``embedding_job_attempts`` is written when it ends.
    A worker that is not RUNNING gets nothing; an empty queue is an empty list. With
    ``model_id``, only jobs pinned to that model are claimed (a worker embeds with one model);
    :class:`ModelRemoved` when that model no longer exists (it was removed, and perhaps
    registered again under a new id), so the worker can stop instead of idling forever.
    """
    if k <= 0:
        return []
    rows = conn.execute(
        _CLAIM_SQL, {"worker": worker_id, "k": k, "lease": lease_seconds, "model": model_id}
    ).fetchall()
    if not rows and model_id is not None:
        found = conn.execute(
            "SELECT name FROM embedding_models WHERE id = %s", (model_id,)
        ).fetchone()
        if found is None:
            raise ModelRemoved(
                f"the embedding model this worker was started for (id {model_id}) was removed;"
                " start the worker again to follow the model registered under its name"
            )
    return [Claim.from_row(row) for row in rows]


# ---------------------------------------------------------------------------------------------
# renew


def renew_leases(
    conn: Connection, claims: Sequence[Claim], lease_seconds: float
) -> list[datetime | Exception]:
    """Extend the leases of the claims that still own their jobs; one result per claim, in
    order: the new expiry, or the exception refusing that claim alone.

    One statement, ``trioindex_renew_leases``: the ownership check is the fence's
    (``trioindex_ownership_refusal``, as for every fenced write), the jobs still owned are
    locked in id order and extended from the database's fresh clock. Never changes the worker,
    the token or ``locked_at``. A refused claim's result is :class:`OwnershipLost`
    (:class:`~trioindex.errors.JobRemoved` when the job no longer exists); a database error
    propagates as itself.
    """
    if not claims:
        return []
    rows = conn.execute(
        """SELECT lease_expires_at, code, message
           FROM trioindex_renew_leases(%s, %s, %s, %s, %s) ORDER BY ord""",
        (*claim_arrays(claims), lease_seconds),
    ).fetchall()
    results: list[datetime | Exception] = []
    for row in rows:
        error = refusal_error(row["code"], row["message"])
        results.append(row["lease_expires_at"] if error is None else error)
    return results


# ---------------------------------------------------------------------------------------------
# complete


def complete_job(conn: Connection, claim: Claim) -> CompleteResult:
    """Finish the claim: attempt and job SUCCEEDED, and the version its model serves for the
    document moved forward unless the model already serves a newer one.

    One statement, one round trip: ``trioindex_complete_job`` takes the locks in the usual
    order, re-validates ownership and the embedding set, and writes everything.
    """
    with fenced_errors():
        row = conn.execute(
            "SELECT became_current FROM trioindex_complete_job(%s, %s, %s, %s)",
            (claim.job_id, claim.worker_id, claim.claim_token, claim.attempt_id),
        ).fetchone()
    assert row is not None
    return CompleteResult(became_current=bool(row["became_current"]))


def complete_many(conn: Connection, claims: Sequence[Claim]) -> list[CompleteResult | Exception]:
    """:func:`complete_job` for many claims in one statement; one result per claim, in order:
    its :class:`CompleteResult`, or the error that refused this job alone.

    ``trioindex_complete_many`` fences the group in one locking statement (jobs, then
    versions, in id order) and completes the jobs it kept: a refused job (ownership lost,
    removed, its vector set incomplete) changes nothing and the others commit. Any other error
    fails the whole call (the group committer then completes each job alone).
    """
    with conn.cursor(binary=True) as cursor:
        rows = cursor.execute(
            "SELECT refusal, message, became_current FROM trioindex_complete_many("
            "%b::uuid[], %b::uuid[], %b::uuid[], %b::uuid[])",
            claim_arrays(claims),
        ).fetchall()
    results: list[CompleteResult | Exception] = []
    for row in rows:
        refused = refusal_error(row["refusal"], row["message"])
        results.append(
            refused if refused is not None else CompleteResult(bool(row["became_current"]))
        )
    return results


# ---------------------------------------------------------------------------------------------
# hand back (shutdown)


def release_job(conn: Connection, claim: Claim) -> None:
    """Hand an unfinished claim back: the job is PENDING again at once, the attempt CANCELLED.

    Used at shutdown, after the grace period. The cancelled attempt keeps its number but does
    not spend the job's budget (``max_attempts`` grows by one); the next claim resumes from
    what is stored (its chunk set, if the parse committed). Fenced like every other write
    (``trioindex_release_job``): a claim that no longer owns the job raises
    :class:`OwnershipLost` and changes nothing.
    """
    with fenced_errors():
        conn.execute(
            "SELECT trioindex_release_job(%s, %s, %s, %s)",
            (claim.job_id, claim.worker_id, claim.claim_token, claim.attempt_id),
        )


# ---------------------------------------------------------------------------------------------
# drain


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


# ---------------------------------------------------------------------------------------------
# fail


def fail_job(
    conn: Connection,
    claim: Claim,
    failure_type: FailureType,
    message: str,
    backoff: BackoffPolicy,
    *,
    unit_random: float | None = None,
) -> FailResult:
    """Report a classified failure of the current attempt.

    Retryable with attempts left → PENDING with ``available_at = now() + backoff``; otherwise
    the job ends FAILED (its model's state of the version; no other model's job or served
    version changes). A report from a worker that no longer owns the job raises
    :class:`OwnershipLost` and changes nothing: lease recovery owns the job then.

    The delay is ``trioindex_retry_delay``, the definition recovery uses too;
    the jitter draw is made here (``unit_random``, else ``SystemRandom``) so a test can fix it.
    """
    safe_message = bounded(message)
    draw = _system_random.random() if unit_random is None else unit_random
    with conn.transaction():
        owned = lock_owned_job(conn, claim)
        conn.execute(
            """INSERT INTO embedding_job_attempts
               SELECT a.* FROM embedding_jobs j,
                    trioindex_ended_attempt(j, 'FAILED', %s, %s) AS a
               WHERE j.id = %s""",
            (failure_type.value, safe_message, claim.job_id),
        )
        retry = failure_type.retryable and owned.attempt_count < owned.max_attempts
        if retry:
            row = conn.execute(
                """UPDATE embedding_jobs
                   SET status = 'PENDING',
                       available_at = now() + make_interval(secs => trioindex_retry_delay(
                           attempt_count, %s, %s, %s, %s)),
                       worker_id = NULL, claim_token = NULL, locked_at = NULL,
                       lease_expires_at = NULL, attempt_id = NULL,
                       last_failure_type = %s, last_failure_message = %s
                   WHERE id = %s RETURNING available_at""",
                (
                    backoff.initial,
                    backoff.maximum,
                    backoff.jitter,
                    draw,
                    failure_type.value,
                    safe_message,
                    claim.job_id,
                ),
            ).fetchone()
            assert row is not None
            available_at: datetime | None = row["available_at"]
            event, outcome = "JOB_RETRY_SCHEDULED", FailOutcome.RETRY_SCHEDULED
        else:
            conn.execute(
                """UPDATE embedding_jobs
                   SET status = 'FAILED', finished_at = now(),
                       worker_id = NULL, claim_token = NULL, locked_at = NULL,
                       lease_expires_at = NULL, attempt_id = NULL,
                       last_failure_type = %s, last_failure_message = %s
                   WHERE id = %s""",
                (failure_type.value, safe_message, claim.job_id),
            )
            available_at = None
            event, outcome = "JOB_FAILED", FailOutcome.FAILED
        record_claim_event(
            conn,
            event,
            claim,
            owned.document_version_id,
            {"attempt_no": claim.attempt_no, "failure_type": failure_type.value},
        )
    return FailResult(outcome=outcome, available_at=available_at)


# ---------------------------------------------------------------------------------------------
# operator retry


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


# ---------------------------------------------------------------------------------------------
# recover

# One statement: one round trip, atomic without BEGIN/COMMIT.
_RECOVER_SQL = """
WITH expired AS (
    -- the locked row as it is now (a step committed after this statement began included):
    -- what the attempt's row records
    SELECT j.id, j AS job FROM embedding_jobs j
    WHERE j.status = 'PROCESSING' AND j.lease_expires_at <= clock_timestamp()
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
        attempt_id = NULL
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
"""


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
