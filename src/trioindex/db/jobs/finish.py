"""The ends of an attempt its claim reports: completion (one job or a group), a classified
failure (retry scheduled or FAILED) and the hand-back at shutdown; every one fenced."""

from __future__ import annotations

import random
from collections.abc import Sequence
from datetime import datetime

from trioindex.db.events import record_claim_event
from trioindex.db.fence import claim_arrays, fenced_errors, lock_owned_job, refusal_error
from trioindex.db.jobs.attempt_steps import ATTEMPT_STEPS_CLEARED
from trioindex.db.pool import Connection
from trioindex.errors import FailureType, bounded
from trioindex.values import BackoffPolicy, Claim, CompleteResult, FailOutcome, FailResult

_system_random = random.SystemRandom()


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
                f"""UPDATE embedding_jobs
                   SET status = 'PENDING',
                       available_at = now() + make_interval(secs => trioindex_retry_delay(
                           attempt_count, %s, %s, %s, %s)),
                       worker_id = NULL, claim_token = NULL, locked_at = NULL,
                       lease_expires_at = NULL, attempt_id = NULL, {ATTEMPT_STEPS_CLEARED},
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
                f"""UPDATE embedding_jobs
                   SET status = 'FAILED', finished_at = now(),
                       worker_id = NULL, claim_token = NULL, locked_at = NULL,
                       lease_expires_at = NULL, attempt_id = NULL, {ATTEMPT_STEPS_CLEARED},
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
