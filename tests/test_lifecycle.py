"""Job lifecycle contracts on real PostgreSQL, raced with real connections in real threads.

Races are created with barriers and row locks held by a third connection, never with sleeps.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pytest

from tests import helpers
from trioindex import lifecycle
from trioindex.database import Database
from trioindex.errors import FailureType, OwnershipLost, StateInconsistent
from trioindex.values import Claim, FailOutcome, WorkerStatus

T = TypeVar("T")


def _outcome(fn: Callable[[], T]) -> T | Exception:
    try:
        return fn()
    except Exception as exc:
        return exc


def _race(db: Database, *calls: Callable[[Any], object], rounds: int = 1) -> list[object]:
    """Run each call on its own connection at the same instant; return results or errors."""
    barrier = threading.Barrier(len(calls))

    def run(call: Callable[[Any], object]) -> object:
        with db.connection() as conn:
            barrier.wait()
            return _outcome(lambda: call(conn))

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))


def _claim_one(db: Database, worker: Any, **enqueue: Any) -> Claim:
    with db.connection() as conn:
        model = helpers.model(conn)
        helpers.enqueue(conn, model.id, **enqueue)
        claims = lifecycle.claim_jobs(conn, worker, 1, 300)
    assert len(claims) == 1
    return claims[0]


@pytest.fixture
def worker(db: Database) -> Any:
    with db.connection() as conn:
        return helpers.worker(conn)


# --- claim ---------------------------------------------------------------------------------


def test_empty_queue_is_an_empty_result(db: Database, worker: Any) -> None:
    with db.connection() as conn:
        assert lifecycle.claim_jobs(conn, worker, 5, 300) == []


def test_claim_sets_every_claim_column_and_starts_attempt_one(db: Database, worker: Any) -> None:
    claim = _claim_one(db, worker)
    with db.connection() as conn:
        row = helpers.job_row(conn, claim.job_id)
        attempts = conn.execute(
            "SELECT attempt_no, status, worker_id FROM embedding_job_attempts WHERE embedding_job_id = %s",
            (claim.job_id,),
        ).fetchall()
    assert row["status"] == "PROCESSING"
    assert row["worker_id"] == worker
    assert row["claim_token"] == claim.claim_token
    assert row["locked_at"] is not None and row["lease_expires_at"] == claim.lease_expires_at
    assert row["attempt_count"] == 1
    assert attempts == [{"attempt_no": 1, "status": "STARTED", "worker_id": worker}]
    assert claim.attempt_no == 1
    assert "claim_token" not in repr(claim)


def test_claim_order_is_priority_then_age(db: Database, worker: Any) -> None:
    with db.connection() as conn:
        model = helpers.model(conn)
        old = helpers.enqueue(conn, model.id, "old")
        new = helpers.enqueue(conn, model.id, "new")
        urgent = helpers.enqueue(conn, model.id, "urgent", priority=5)
        claimed = [c.job_id for c in lifecycle.claim_jobs(conn, worker, 3, 300)]
    assert set(claimed) == {old.job_id, new.job_id, urgent.job_id}
    with db.connection() as conn:
        order = conn.execute(
            "SELECT embedding_job_id FROM indexing_events WHERE event_type = 'JOB_CLAIMED' ORDER BY id"
        ).fetchall()
    # one statement claims all three; the priority job must be first in claim order
    assert order[0]["embedding_job_id"] == urgent.job_id


def test_worker_that_is_not_running_cannot_claim(db: Database, worker: Any) -> None:
    with db.connection() as conn:
        model = helpers.model(conn)
        helpers.enqueue(conn, model.id)
        lifecycle.set_worker_status(conn, worker, WorkerStatus.STOPPING)
        assert lifecycle.claim_jobs(conn, worker, 1, 300) == []
        lifecycle.set_worker_status(conn, worker, WorkerStatus.STOPPED)
        assert lifecycle.claim_jobs(conn, worker, 1, 300) == []
        assert not lifecycle.heartbeat(conn, worker)


def test_many_claimers_claim_every_job_exactly_once(db: Database) -> None:
    jobs, claimers, k = 120, 6, 4
    with db.connection() as conn:
        model = helpers.model(conn)
        expected = {helpers.enqueue(conn, model.id).job_id for _ in range(jobs)}
        workers = [helpers.worker(conn) for _ in range(claimers)]
    barrier = threading.Barrier(claimers)
    batch_sizes: list[int] = []

    def claim_until_empty(worker_id: Any) -> list[Any]:
        got: list[Any] = []
        with db.connection() as conn:
            barrier.wait()
            while batch := lifecycle.claim_jobs(conn, worker_id, k, 300):
                batch_sizes.append(len(batch))
                got.extend(c.job_id for c in batch)
        return got

    with ThreadPoolExecutor(claimers) as pool:
        results = list(pool.map(claim_until_empty, workers))
    everything = [job for result in results for job in result]
    assert Counter(everything).most_common(1)[0][1] == 1
    assert set(everything) == expected
    assert max(batch_sizes) <= k
    assert sum(1 for r in results if r) > 1  # the claimers really did compete


def test_attempt_numbers_are_consecutive_under_concurrent_claims(db: Database) -> None:
    rounds, claimers = 8, 4
    with db.connection() as conn:
        model = helpers.model(conn)
        jobs = [helpers.enqueue(conn, model.id, max_attempts=rounds + 1).job_id for _ in range(6)]
        workers = [helpers.worker(conn) for _ in range(claimers)]
    for _ in range(rounds):
        results = _race(
            db, *[lambda conn, w=w: lifecycle.claim_jobs(conn, w, 2, 300) for w in workers]
        )
        with db.connection() as conn:
            for result in results:
                assert not isinstance(result, Exception)
                for claim in result:  # type: ignore[attr-defined]
                    helpers.expire_lease(conn, claim.job_id)
            lifecycle.recover_expired(conn, helpers.BACKOFF)
            for job in jobs:
                helpers.make_available(conn, job)
    with db.connection() as conn:
        for job in jobs:
            numbers = [
                r["attempt_no"]
                for r in conn.execute(
                    "SELECT attempt_no FROM embedding_job_attempts WHERE embedding_job_id = %s ORDER BY attempt_no",
                    (job,),
                ).fetchall()
            ]
            assert numbers == list(range(1, len(numbers) + 1))
            assert numbers[-1] == helpers.job_row(conn, job)["attempt_count"]


# --- fencing ---------------------------------------------------------------------------------


def _writes(claim: Claim) -> dict[str, Callable[[Any], object]]:
    return {
        "renew": lambda conn: lifecycle.renew_lease(conn, claim, 300),
        "complete": lambda conn: lifecycle.complete_job(conn, claim),
        "fail": lambda conn: lifecycle.fail_job(
            conn, claim, FailureType.WORKER_INTERNAL_ERROR, "boom", helpers.BACKOFF
        ),
        "fence": lambda conn: _fence_in_transaction(conn, claim),
    }


def _fence_in_transaction(conn: Any, claim: Claim) -> object:
    with conn.transaction():
        return lifecycle.lock_owned_job(conn, claim)


def _snapshot(conn: Any, claim: Claim) -> tuple[object, ...]:
    job = helpers.job_row(conn, claim.job_id)
    attempts = conn.execute(
        "SELECT id, status, updated_at FROM embedding_job_attempts WHERE embedding_job_id = %s ORDER BY attempt_no",
        (claim.job_id,),
    ).fetchall()
    version = conn.execute(
        "SELECT status, updated_at FROM document_versions WHERE id = %s",
        (claim.document_version_id,),
    ).fetchone()
    return (job, attempts, version, helpers.events(conn, claim.job_id))


@pytest.mark.parametrize("write", ["renew", "complete", "fail", "fence"])
@pytest.mark.parametrize("forgery", helpers.FORGERIES)
def test_every_write_with_a_forged_or_lapsed_claim_is_refused_and_changes_nothing(
    db: Database, worker: Any, write: str, forgery: str
) -> None:
    claim = _claim_one(db, worker)
    with db.connection() as conn:
        helpers.stage_embedded(conn, claim)
        forged = helpers.forge(conn, claim, forgery)
        before = _snapshot(conn, claim)
        with pytest.raises(OwnershipLost):
            _writes(forged)[write](conn)
        assert _snapshot(conn, claim) == before


def test_the_real_claim_passes_every_fenced_write(db: Database, worker: Any) -> None:
    claim = _claim_one(db, worker)
    with db.connection() as conn:
        helpers.stage_embedded(conn, claim)
        new_expiry = lifecycle.renew_lease(conn, claim, 600)
        row = helpers.job_row(conn, claim.job_id)
        assert new_expiry > claim.lease_expires_at
        # renewal changes the lease only
        assert (row["worker_id"], row["claim_token"]) == (claim.worker_id, claim.claim_token)
        assert lifecycle.complete_job(conn, claim).became_current
        assert helpers.events(conn, claim.job_id) == [
            "JOB_ENQUEUED",
            "JOB_CLAIMED",
            "JOB_SUCCEEDED",
        ]


# --- renew vs recover ---------------------------------------------------------------------------


def test_recovery_waits_out_a_renewal_in_flight(db: Database, worker: Any) -> None:
    """A renewal holding the row lock is skipped by recovery (SKIP LOCKED): one owner."""
    claim = _claim_one(db, worker)
    with db.connection() as holder, db.connection() as recoverer:
        with holder.transaction():
            lifecycle.lock_owned_job(holder, claim)  # the owner is mid-write
            assert lifecycle.recover_expired(recoverer, helpers.BACKOFF) == []
        assert helpers.job_row(recoverer, claim.job_id)["status"] == "PROCESSING"


def test_recovered_job_refuses_the_old_token(db: Database, worker: Any) -> None:
    claim = _claim_one(db, worker)
    with db.connection() as conn:
        helpers.stage_embedded(conn, claim)
        helpers.expire_lease(conn, claim.job_id)
        recovered = lifecycle.recover_expired(conn, helpers.BACKOFF)
        assert [r.job_id for r in recovered] == [claim.job_id]
        assert recovered[0].outcome is FailOutcome.RETRY_SCHEDULED
        for write in _writes(claim).values():
            with pytest.raises(OwnershipLost):
                write(conn)
        attempt = conn.execute(
            "SELECT status FROM embedding_job_attempts WHERE id = %s", (claim.attempt_id,)
        ).fetchone()
        assert attempt is not None and attempt["status"] == "EXPIRED"
        row = helpers.job_row(conn, claim.job_id)
        assert row["available_at"] > row["updated_at"]  # requeued with a backoff delay


def test_renew_and_recover_racing_on_an_expiring_lease_have_one_winner(db: Database) -> None:
    """Many jobs whose leases run out while renewers and recoverers race: for each job exactly
    one side's view holds at the end, and the loser can write nothing."""
    with db.connection() as conn:
        model = helpers.model(conn)
        for _ in range(40):
            helpers.enqueue(conn, model.id)
        worker_id = helpers.worker(conn)
        claims = lifecycle.claim_jobs(conn, worker_id, 40, 300)
        # half the leases have already run out, the other half are valid
        for claim in claims[::2]:
            helpers.expire_lease(conn, claim.job_id)
    renewed: dict[Any, Any] = {}

    def renewer(conn: Any) -> None:
        for claim in claims:
            result = _outcome(lambda c=claim: lifecycle.renew_lease(conn, c, 300))
            if not isinstance(result, Exception):
                renewed[claim.job_id] = result

    def recoverer(conn: Any) -> list[Any]:
        return lifecycle.recover_expired(conn, helpers.BACKOFF, batch=3)

    results = _race(db, renewer, recoverer, recoverer, recoverer)
    recovered = {r.job_id for result in results[1:] for r in result}  # type: ignore[union-attr]
    assert not recovered & set(renewed), "a job was both renewed and recovered"
    with db.connection() as conn:
        recovered |= {r.job_id for r in lifecycle.recover_expired(conn, helpers.BACKOFF)}
        for claim in claims:
            row = helpers.job_row(conn, claim.job_id)
            if claim.job_id in recovered:
                assert claim.job_id not in renewed
                assert row["status"] == "PENDING"
                with pytest.raises(OwnershipLost):
                    lifecycle.renew_lease(conn, claim, 300)
            else:
                assert claim.job_id in renewed
                assert (
                    row["status"] == "PROCESSING"
                    and row["lease_expires_at"] == renewed[claim.job_id]
                )
    assert recovered == {c.job_id for c in claims[::2]}


# --- complete vs fail vs recover ---------------------------------------------------------------


@pytest.mark.parametrize("lease", ["valid", "expired"])
def test_complete_fail_and_recover_on_one_claim_commit_exactly_one_transition(
    db: Database, worker: Any, lease: str
) -> None:
    for _ in range(5):
        claim = _claim_one(db, worker)
        with db.connection() as conn:
            helpers.stage_embedded(conn, claim)
            if lease == "expired":
                helpers.expire_lease(conn, claim.job_id)
        complete, fail, recover = _race(
            db,
            lambda conn, claim=claim: lifecycle.complete_job(conn, claim),
            lambda conn, claim=claim: lifecycle.fail_job(
                conn, claim, FailureType.EMBEDDING_RESULT_INVALID, "bad", helpers.BACKOFF
            ),
            lambda conn: lifecycle.recover_expired(conn, helpers.BACKOFF),
        )
        if lease == "expired" and recover == []:
            # recovery skipped the row while a refused writer held its lock; the next pass wins
            with db.connection() as conn:
                recover = lifecycle.recover_expired(conn, helpers.BACKOFF)
        winners = [
            not isinstance(complete, Exception),
            not isinstance(fail, Exception),
            bool(recover) and not isinstance(recover, Exception),
        ]
        assert winners.count(True) == 1, (complete, fail, recover)
        for result in (complete, fail):
            assert not isinstance(result, Exception) or isinstance(result, OwnershipLost)
        with db.connection() as conn:
            transitions = [
                e
                for e in helpers.events(conn, claim.job_id)
                if e not in ("JOB_ENQUEUED", "JOB_CLAIMED")
            ]
        assert len(transitions) == 1, transitions
        if lease == "expired":
            assert winners == [False, False, True]


# --- fail and retry -------------------------------------------------------------------------------


def test_retryable_failure_is_scheduled_and_not_claimable_before_its_time(
    db: Database, worker: Any
) -> None:
    claim = _claim_one(db, worker)
    with db.connection() as conn:
        result = lifecycle.fail_job(
            conn, claim, FailureType.EMBEDDING_PROVIDER_UNAVAILABLE, "HTTP 503", helpers.BACKOFF
        )
        assert result.outcome is FailOutcome.RETRY_SCHEDULED
        row = helpers.job_row(conn, claim.job_id)
        assert row["status"] == "PENDING" and row["claim_token"] is None
        assert row["last_failure_type"] == "EMBEDDING_PROVIDER_UNAVAILABLE"
        assert result.available_at is not None and result.available_at > row["updated_at"]
        assert lifecycle.claim_jobs(conn, worker, 1, 300) == []
        helpers.make_available(conn, claim.job_id)
        again = lifecycle.claim_jobs(conn, worker, 1, 300)
        assert [c.attempt_no for c in again] == [2]


def test_retries_spent_end_failed_with_the_version(db: Database, worker: Any) -> None:
    claim = _claim_one(db, worker, max_attempts=2)
    with db.connection() as conn:
        first = lifecycle.fail_job(
            conn, claim, FailureType.STORAGE_UNAVAILABLE, "down", helpers.BACKOFF
        )
        assert first.outcome is FailOutcome.RETRY_SCHEDULED
        helpers.make_available(conn, claim.job_id)
        (second_claim,) = lifecycle.claim_jobs(conn, worker, 1, 300)
        second = lifecycle.fail_job(
            conn, second_claim, FailureType.STORAGE_UNAVAILABLE, "down", helpers.BACKOFF
        )
        assert second.outcome is FailOutcome.FAILED
        row = helpers.job_row(conn, claim.job_id)
        version = conn.execute(
            "SELECT status FROM document_versions WHERE id = %s", (claim.document_version_id,)
        ).fetchone()
    assert row["status"] == "FAILED" and row["finished_at"] is not None
    assert version is not None and version["status"] == "FAILED"


def test_non_retryable_failure_ends_failed_at_once(db: Database, worker: Any) -> None:
    claim = _claim_one(db, worker, max_attempts=5)
    with db.connection() as conn:
        result = lifecycle.fail_job(
            conn, claim, FailureType.DOCUMENT_CONTENT_INVALID, "empty document", helpers.BACKOFF
        )
        assert result.outcome is FailOutcome.FAILED
        attempt = conn.execute(
            "SELECT status, failure_type, failure_message FROM embedding_job_attempts WHERE id = %s",
            (claim.attempt_id,),
        ).fetchone()
    assert attempt == {
        "status": "FAILED",
        "failure_type": "DOCUMENT_CONTENT_INVALID",
        "failure_message": "empty document",
    }


def test_failure_message_is_bounded_to_one_line(db: Database, worker: Any) -> None:
    claim = _claim_one(db, worker)
    with db.connection() as conn:
        lifecycle.fail_job(
            conn, claim, FailureType.WORKER_INTERNAL_ERROR, "line\n" * 400, helpers.BACKOFF
        )
        message = helpers.job_row(conn, claim.job_id)["last_failure_message"]
    assert isinstance(message, str) and len(message) <= 500 and "\n" not in message


def test_expired_lease_on_the_last_attempt_ends_failed(db: Database, worker: Any) -> None:
    claim = _claim_one(db, worker, max_attempts=1)
    with db.connection() as conn:
        helpers.expire_lease(conn, claim.job_id)
        (recovered,) = lifecycle.recover_expired(conn, helpers.BACKOFF)
        assert recovered.outcome is FailOutcome.FAILED
        row = helpers.job_row(conn, claim.job_id)
    assert row["status"] == "FAILED" and row["last_failure_type"] == "WORKER_INTERNAL_ERROR"


# --- complete ---------------------------------------------------------------------------------


def test_an_older_version_completing_late_does_not_replace_the_current_one(
    db: Database, worker: Any
) -> None:
    with db.connection() as conn:
        model = helpers.model(conn)
        v1 = helpers.enqueue(conn, model.id, "doc", content=b"one")
        v2 = helpers.enqueue(conn, model.id, "doc", content=b"two")
        assert (v1.version_no, v2.version_no) == (1, 2)
        claims = {c.document_version_id: c for c in lifecycle.claim_jobs(conn, worker, 2, 300)}
        for claim in claims.values():
            helpers.stage_embedded(conn, claim)
        assert lifecycle.complete_job(conn, claims[v2.version_id]).became_current
        assert not lifecycle.complete_job(conn, claims[v1.version_id]).became_current
        current = conn.execute(
            "SELECT current_version_id FROM documents WHERE id = %s", (v1.document_id,)
        ).fetchone()
    assert current == {"current_version_id": v2.version_id}


def test_complete_refuses_an_incomplete_embedding_set(db: Database, worker: Any) -> None:
    claim = _claim_one(db, worker)
    with db.connection() as conn:
        helpers.stage_embedded(conn, claim)
        conn.execute(
            "DELETE FROM embeddings WHERE id IN (SELECT id FROM embeddings WHERE document_version_id = %s LIMIT 1)",
            (claim.document_version_id,),
        )
        with pytest.raises(StateInconsistent):
            lifecycle.complete_job(conn, claim)
        assert helpers.job_row(conn, claim.job_id)["status"] == "PROCESSING"


def test_events_never_carry_the_claim_token(db: Database, worker: Any) -> None:
    claim = _claim_one(db, worker)
    with db.connection() as conn:
        lifecycle.renew_lease(conn, claim, 300)
        lifecycle.fail_job(conn, claim, FailureType.WORKER_INTERNAL_ERROR, "x", helpers.BACKOFF)
        dump = conn.execute(
            "SELECT string_agg(to_jsonb(e)::text, ' ') AS all FROM indexing_events e"
        ).fetchone()
    assert dump is not None and str(claim.claim_token) not in dump["all"]
