"""The fence: the Python side of "this claim still owns its job".

The checks themselves live in one place, the SQL function ``trioindex_ownership_refusal``
(``functions.sql``): under the job row lock, the job is PROCESSING, held by this worker with this
claim token, its lease has not expired by a fresh database clock, and the attempt is the one the
job row runs (``attempt_id``). Every write after the claim is fenced first. One job's writes go
through ``trioindex_lock_owned_job`` — the steps' commits through :func:`lock_owned_job`, and
the SQL functions for renew, complete and release by calling it themselves. A refusal is SQLSTATE
``TI001``, which :func:`fenced_errors` turns into :class:`OwnershipLost`; the refused transaction
changes nothing.

The group-commit functions fence a whole group in one locking statement
(``trioindex_fence_many``: the checks in its ``WHERE``, so only the jobs still owned are locked)
and report each refused job in its own result row instead of raising: :func:`refusal_error`
turns it into the same exceptions, so a job refused in a group ends exactly as a job refused
alone, and the other jobs of the group commit.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from uuid import UUID

import attrs
import psycopg

from trioindex.db.pool import Connection
from trioindex.errors import JobRemoved, OwnershipLost, StateInconsistent
from trioindex.values import Claim


@attrs.frozen
class OwnedJob:
    """The job row as seen under its lock by a writer that still owns it."""

    job_id: UUID
    document_version_id: UUID
    embedding_model_id: UUID
    attempt_count: int
    max_attempts: int
    chunking: str  # the chunk set the claim makes and embeds


# SQLSTATEs raised by the fenced SQL functions.
OWNERSHIP_LOST = "TI001"
STATE_INCONSISTENT = "TI002"
JOB_REMOVED = "TI003"  # the job row is gone (document deleted, model removed)


@contextmanager
def fenced_errors() -> Iterator[None]:
    """Turn the fenced functions' SQLSTATEs into :class:`OwnershipLost` (:class:`JobRemoved`
    for a job that no longer exists) / :class:`StateInconsistent`; any other database error
    propagates as itself."""
    try:
        yield
    except psycopg.Error as exc:
        message = exc.diag.message_primary or "refused"
        if exc.sqlstate == JOB_REMOVED:
            raise JobRemoved(message) from None
        if exc.sqlstate == OWNERSHIP_LOST:
            raise OwnershipLost(message) from None
        if exc.sqlstate == STATE_INCONSISTENT:
            raise StateInconsistent(message) from None
        raise


def lock_owned_job(conn: Connection, claim: Claim) -> OwnedJob:
    """Lock the job row and prove ``claim`` still owns it; raise :class:`OwnershipLost` if not.

    Must run inside the caller's transaction; it is the first lock that transaction takes. The
    SQL function ``trioindex_lock_owned_job`` locks the row and asks
    ``trioindex_ownership_refusal`` (status PROCESSING, worker, claim token, lease unexpired by
    a fresh clock, the attempt the job row runs).
    """
    with fenced_errors():
        row = conn.execute(
            """SELECT document_version_id, embedding_model_id, attempt_count, max_attempts,
                      chunking
               FROM trioindex_lock_owned_job(%s, %s, %s, %s)""",
            (claim.job_id, claim.worker_id, claim.claim_token, claim.attempt_id),
        ).fetchone()
    assert row is not None
    return OwnedJob(
        job_id=claim.job_id,
        document_version_id=row["document_version_id"],
        embedding_model_id=row["embedding_model_id"],
        attempt_count=row["attempt_count"],
        max_attempts=row["max_attempts"],
        chunking=row["chunking"],
    )


def refusal_error(code: str | None, message: str | None) -> Exception | None:
    """The error one job's result row of a fenced array function stands for (a refused job
    is reported in its row, not raised).

    ``TI001`` → :class:`OwnershipLost`, ``TI003`` → :class:`JobRemoved`, ``TI002`` →
    :class:`StateInconsistent`, no code → None.
    """
    if code is None:
        return None
    if code == JOB_REMOVED:
        return JobRemoved(message or "refused")
    if code == OWNERSHIP_LOST:
        return OwnershipLost(message or "refused")
    if code == STATE_INCONSISTENT:
        return StateInconsistent(message or "refused")
    raise ValueError(f"unknown refusal code {code!r}")


def claim_arrays(claims: Sequence[Claim]) -> tuple[list[UUID], list[UUID], list[UUID], list[UUID]]:
    """The fence's four columns for a group of claims, as the array functions take them."""
    return (
        [c.job_id for c in claims],
        [c.worker_id for c in claims],
        [c.claim_token for c in claims],
        [c.attempt_id for c in claims],
    )
