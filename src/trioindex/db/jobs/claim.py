"""The claim (which starts the attempt on the job row) and the lease renewal of a worker's
claims."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime
from uuid import UUID

from trioindex.db.fence import claim_arrays, refusal_error
from trioindex.db.jobs.attempt_steps import ATTEMPT_STEPS_CLEARED
from trioindex.db.pool import Connection
from trioindex.errors import ModelRemoved
from trioindex.values import Claim

# The statement is its own transaction (autocommit), and its commit does not wait for the WAL
# to reach the disk (synchronous_commit off, local to this transaction: set while the statement
# runs, read when it commits). A claim lost in a crash leaves the job PENDING with no attempt,
# as if it had never been claimed, and the worker's later writes are refused by the fence; any
# later synchronous commit (a completion, a failure report) flushes the claim's WAL before its
# own, so nothing that follows a claim outlives it.
#
# The statement answers in one round trip whether the worker's model still exists: its one row
# with no job (job_id NULL) when nothing was claimed, model_found false when the model is gone.
# Its LIMIT is written into the text (``claim_statement``): PostgreSQL plans a LIMIT it cannot
# see as a tenth of the table, so with a parameter the generic plan always looked dearer than a
# new one and the statement was planned again on every call; with the number in the text the
# prepared statement's generic plan is used.
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
    LIMIT {limit}
    FOR UPDATE OF j SKIP LOCKED
), claimed AS (
    UPDATE embedding_jobs j
    SET status = 'PROCESSING',
        worker_id = %(worker)s,
        claim_token = gen_random_uuid(),
        locked_at = now(),
        -- set here, so the touch trigger is not called (its WHEN)
        updated_at = now(),
        lease_expires_at = now() + make_interval(secs => %(lease)s),
        attempt_count = j.attempt_count + 1,
        chunking = worker.chunking,
        -- the attempt runs on the job row (its start is locked_at); its row is written when
        -- it ends, under this id. No event is written for the claim.
        attempt_id = gen_random_uuid(),
        {attempt_steps_cleared}
    FROM picked, worker
    WHERE j.id = picked.id
    RETURNING j.id, j.worker_id, j.claim_token, j.document_version_id, j.embedding_model_id,
              j.attempt_count, j.lease_expires_at, j.chunking, j.attempt_id
)
SELECT model.found AS model_found,
       c.id AS job_id, c.worker_id, c.claim_token, c.document_version_id, c.embedding_model_id,
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
FROM (SELECT %(model)s::uuid IS NULL
             OR EXISTS (SELECT FROM embedding_models m WHERE m.id = %(model)s::uuid) AS found
     ) AS model
LEFT JOIN (claimed c
           JOIN document_versions v ON v.id = c.document_version_id
           JOIN documents d ON d.id = v.document_id) ON true
""".replace("{attempt_steps_cleared}", ATTEMPT_STEPS_CLEARED)


@functools.lru_cache(maxsize=64)
def claim_statement(template: str, k: int) -> str:
    """The claim statement ``template`` claiming at most ``k`` jobs (a whole number written
    into its text: one prepared statement per batch size)."""
    return template.replace("{limit}", str(int(k)))


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
    # prepared at its first execution, not psycopg's sixth: a connection plans it five times
    # fewer before the generic plan (each a plan of the whole statement)
    rows = conn.execute(
        claim_statement(_CLAIM_SQL, k),
        {"worker": worker_id, "lease": lease_seconds, "model": model_id},
        prepare=True,
    ).fetchall()
    if rows[0]["job_id"] is None:
        if not rows[0]["model_found"]:
            raise ModelRemoved(
                f"the embedding model this worker was started for (id {model_id}) was removed;"
                " start the worker again to follow the model registered under its name"
            )
        return []
    return [Claim.from_row(row) for row in rows]


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
