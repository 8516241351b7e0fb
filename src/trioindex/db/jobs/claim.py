"""The claim (which starts the attempt on the job row) and the lease renewal of a worker's
claims."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from uuid import UUID

from trioindex.db.fence import claim_arrays, refusal_error
from trioindex.db.pool import Connection
from trioindex.errors import ModelRemoved
from trioindex.values import Claim

# One call of trioindex_claim (functions.sql says what it does and why it is a function).
_CLAIM_SQL = "SELECT * FROM trioindex_claim(%s, %s, %s, %s)"


def claim_jobs(
    conn: Connection,
    worker_id: UUID,
    k: int,
    lease_seconds: float,
    *,
    model_id: UUID | None = None,
) -> list[Claim]:
    """Claim up to ``k`` claimable PENDING jobs and start an attempt on each, in one statement
    of its own transaction (``trioindex_claim``), whose commit does not wait for the disk.

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
        _CLAIM_SQL, (worker_id, k, lease_seconds, model_id), prepare=True
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
