"""Job lifecycle contracts on real PostgreSQL, raced with real connections in real threads.

An interleaving that matters is forced, never hoped for with a sleep: a transaction is held
open and the other side is either seen waiting on its lock (``pg_stat_activity``) before it
commits, or runs with ``lock_timeout`` set and must not wait at all (``SKIP LOCKED``). A lease
that must run out mid-write is a one-second lease, polled until the database clock passes it.
Tests that only start calls together say so: they check an outcome, not an order. Each fence
condition and completion guard has a case that changes that one fact and nothing else.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar
from uuid import uuid4

import attrs
import pytest

from tests import helpers
from trioindex.db import jobs as lifecycle
from trioindex.db.models import EmbeddingModel
from trioindex.db.operations.job_timeline import job_events
from trioindex.db.pool import Connection, Database
from trioindex.db.steps import begin_embedding
from trioindex.errors import FailureType, ModelRemoved, OwnershipLost, StateInconsistent
from trioindex.values import BackoffPolicy, Claim, FailOutcome, WorkerStatus

T = TypeVar("T")


def _outcome(fn: Callable[[], T]) -> T | Exception:
    try:
        return fn()
    except Exception as exc:
        return exc


def _race(db: Database, *calls: Callable[[Any], object]) -> list[object]:
    """Start each call on its own connection at the same instant; return results or errors.

    This makes the calls overlap; it does not choose their order. A test that needs one order
    holds a lock and waits until the other side is seen waiting (:func:`_blocked_then_released`).
    """
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


def test_an_empty_claim_is_one_statement_and_says_when_its_model_is_gone(
    db: Database, worker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing to claim, and a model that no longer exists: one round trip each (the claim
    statement itself answers whether the model is there)."""
    with db.connection() as conn:
        model = helpers.model(conn)
        sent: list[object] = []
        execute = conn.execute

        def counting(*args: Any, **kwargs: Any) -> Any:
            sent.append(args[0])
            return execute(*args, **kwargs)

        monkeypatch.setattr(conn, "execute", counting)
        assert lifecycle.claim_jobs(conn, worker, 4, 300, model_id=model.id) == []
        assert len(sent) == 1
        with pytest.raises(ModelRemoved, match="was removed"):
            lifecycle.claim_jobs(conn, worker, 4, 300, model_id=uuid4())
        assert len(sent) == 2


def _backlog(conn: Connection, jobs: int) -> EmbeddingModel:
    """A model with ``jobs`` jobs waiting, the tables analysed (the planner sees them)."""
    model = helpers.model(conn)
    with conn.transaction():
        for _ in range(jobs):
            helpers.enqueue(conn, model.id)
    conn.execute("ANALYZE")
    return model


@pytest.mark.parametrize("prepared", [True, False], ids=["prepared", "behind a pooler"])
def test_a_claim_is_not_planned_again_on_every_call(
    db: Database, worker: Any, prepared: bool
) -> None:
    """Past a connection's first claims, a claim plans nothing of its own again, also with
    hundreds of jobs waiting (where a batch size the generic plan cannot see is guessed at a
    tenth of them, and a new custom plan always looks cheaper) and when the client prepares
    nothing (a transaction pooler in front): only the call's own one-line statement is then
    planned. The statement sent as text was planned whole on every call behind a pooler."""
    with db.connection() as conn:
        model = _backlog(conn, 400)
        if not prepared:
            conn.prepare_threshold = None

        def claim() -> None:
            assert len(lifecycle.claim_jobs(conn, worker, 2, 300, model_id=model.id)) == 2

        made = [helpers.plans_made(conn, claim) for _ in range(12)]
    assert [len(plans) for plans in made[7:]] == [0 if prepared else 1] * 5
    # what is planned is the call alone: no plan locks rows (the claim's SKIP LOCKED)
    assert not [plan for plans in made[7:] for plan in plans if "{LOCKROWS" in plan]
    assert [plan for plans in made[:1] for plan in plans if "{LOCKROWS" in plan]  # it would show


def test_a_claim_of_one_job_reads_a_few_pages_whatever_the_backlog(
    db: Database, worker: Any
) -> None:
    """The claim's generic plan guesses its batch size at a tenth of the claimable rows: it
    must still look each job picked up by key, not join them to a read of the whole job table
    (a hash join read every key of a 20,000-job backlog for each claim)."""
    with db.connection() as conn:
        model = _backlog(conn, 2000)
        for _ in range(6):  # past the first calls of the connection
            assert len(lifecycle.claim_jobs(conn, worker, 1, 300, model_id=model.id)) == 1
        plan = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT * FROM trioindex_claim(%s, 1, 300, %s)",
            (worker, model.id),
        ).fetchone()
    assert plan is not None
    top = plan["QUERY PLAN"][0]["Plan"]
    assert top["Actual Rows"] == 1
    # a function's statements count their pages in its scan's
    assert top["Shared Hit Blocks"] + top["Shared Read Blocks"] < 200, top


def test_claim_sets_every_claim_column_and_starts_attempt_one(db: Database, worker: Any) -> None:
    claim = _claim_one(db, worker)
    with db.connection() as conn:
        row = helpers.job_row(conn, claim.job_id)
        attempts = conn.execute(
            "SELECT attempt_no, status, worker_id FROM trioindex_job_attempts WHERE embedding_job_id = %s",
            (claim.job_id,),
        ).fetchall()
    assert row["status"] == "PROCESSING"
    assert row["worker_id"] == worker
    assert row["claim_token"] == claim.claim_token
    assert row["locked_at"] is not None
    assert row["lease_expires_at"] == claim.lease_expires_at
    assert row["attempt_count"] == 1
    assert attempts == [{"attempt_no": 1, "status": "STARTED", "worker_id": worker}]
    assert claim.attempt_no == 1
    assert "claim_token" not in repr(claim)


def test_claim_order_is_priority_then_age(db: Database, worker: Any) -> None:
    with db.connection() as conn:
        model = helpers.model(conn)
        a = helpers.enqueue(conn, model.id, "a")
        b = helpers.enqueue(conn, model.id, "b")
        urgent = helpers.enqueue(conn, model.id, "urgent", priority=5)
        # age decides, not insertion order or id: the job with the greater id is the older one,
        # so an order by id alone would claim them the other way round
        old, new = sorted([a, b], key=lambda job: job.job_id, reverse=True)
        for job, minutes in ((old, 2), (new, 1)):
            conn.execute(
                "UPDATE embedding_jobs SET available_at = now() - make_interval(mins => %s) WHERE id = %s",
                (minutes, job.job_id),
            )
        # one job per claim, so the order is the claim's own, not the order of rows it returns
        claimed = [lifecycle.claim_jobs(conn, worker, 1, 300)[0].job_id for _ in range(3)]
    assert claimed == [urgent.job_id, old.job_id, new.job_id]


def test_claim_skips_a_row_another_transaction_holds_and_takes_the_next(
    db: Database, worker: Any
) -> None:
    """SKIP LOCKED, forced: the first job in claim order is locked by another transaction; the
    claim (which may wait at most ``lock_timeout`` for a lock) must take the second at once."""
    with db.connection() as conn:
        model = helpers.model(conn)
        first = helpers.enqueue(conn, model.id, "first", priority=1)
        second = helpers.enqueue(conn, model.id, "second")
    with db.connection() as holder, db.connection() as claimer:
        claimer.execute("SET lock_timeout = '2s'")
        with holder.transaction():
            holder.execute("SELECT 1 FROM embedding_jobs WHERE id = %s FOR UPDATE", (first.job_id,))
            claims = lifecycle.claim_jobs(claimer, worker, 1, 300)
        assert [c.job_id for c in claims] == [second.job_id]
        # the holder is gone: the skipped job was left PENDING, untouched, and is claimable
        assert [c.job_id for c in lifecycle.claim_jobs(claimer, worker, 1, 300)] == [first.job_id]


def test_worker_that_is_not_running_cannot_claim(db: Database, worker: Any) -> None:
    with db.connection() as conn:
        model = helpers.model(conn)
        helpers.enqueue(conn, model.id)
        lifecycle.set_worker_status(conn, worker, WorkerStatus.STOPPING)
        assert lifecycle.claim_jobs(conn, worker, 1, 300) == []
        lifecycle.set_worker_status(conn, worker, WorkerStatus.STOPPED)
        assert lifecycle.claim_jobs(conn, worker, 1, 300) == []
        assert not lifecycle.heartbeat(conn, worker)
        # an id without a worker row, while another worker runs (no foreign key refuses it:
        # the claim's own read of the claimer's RUNNING row does)
        helpers.worker(conn)
        assert lifecycle.claim_jobs(conn, uuid4(), 1, 300) == []
        assert (
            helpers.count(conn, "SELECT count(*) FROM embedding_jobs WHERE worker_id IS NOT NULL")
            == 0
        )


def test_stopped_is_final(db: Database, worker: Any) -> None:
    with db.connection() as conn:
        lifecycle.set_worker_status(conn, worker, WorkerStatus.STOPPED)
        lifecycle.set_worker_status(conn, worker, WorkerStatus.STOPPING)  # a late, stale write
        row = conn.execute(
            "SELECT status, stopped_at IS NOT NULL AS stopped FROM indexing_workers WHERE id = %s",
            (worker,),
        ).fetchone()
        events = conn.execute(
            "SELECT event_type FROM indexing_events WHERE worker_id = %s ORDER BY id", (worker,)
        ).fetchall()
    assert row == {"status": "STOPPED", "stopped": True}
    assert [e["event_type"] for e in events] == ["WORKER_REGISTERED", "WORKER_STOPPED"]


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


def test_attempt_numbers_stay_consecutive_over_rounds_of_claims_and_recoveries(
    db: Database,
) -> None:
    """Outcome test: four claimers started together, then every lease expired and recovered,
    eight rounds over. The numbers are taken under the claim's row lock (forced in
    ``test_claim_skips_a_row_another_transaction_holds_and_takes_the_next``)."""
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
                    "SELECT attempt_no FROM trioindex_job_attempts WHERE embedding_job_id = %s ORDER BY attempt_no",
                    (job,),
                ).fetchall()
            ]
            assert numbers == list(range(1, len(numbers) + 1))
            assert numbers[-1] == helpers.job_row(conn, job)["attempt_count"]


# --- fencing ---------------------------------------------------------------------------------


def _writes(claim: Claim) -> dict[str, Callable[[Any], object]]:
    return {
        "renew": lambda conn: helpers.renew_one(conn, claim, 300),
        "complete": lambda conn: lifecycle.complete_job(conn, claim),
        "fail": lambda conn: lifecycle.fail_job(
            conn, claim, FailureType.WORKER_INTERNAL_ERROR, "boom", helpers.BACKOFF
        ),
        "fence": lambda conn: _fence_in_transaction(conn, claim),
        "release": lambda conn: lifecycle.release_job(conn, claim),
    }


WRITES = ("renew", "complete", "fail", "fence", "release")


def _fence_in_transaction(conn: Any, claim: Claim) -> object:
    with conn.transaction():
        return lifecycle.lock_owned_job(conn, claim)


def _snapshot(conn: Any, claim: Claim) -> tuple[object, ...]:
    job = helpers.job_row(conn, claim.job_id)
    attempts = conn.execute(
        "SELECT id, status, finished_at, embeddings FROM trioindex_job_attempts WHERE embedding_job_id = %s ORDER BY attempt_no",
        (claim.job_id,),
    ).fetchall()
    version = conn.execute(
        "SELECT updated_at FROM document_versions WHERE id = %s",
        (claim.document_version_id,),
    ).fetchone()
    served = conn.execute(
        "SELECT * FROM served_versions WHERE document_version_id = %s",
        (claim.document_version_id,),
    ).fetchall()
    return (job, attempts, version, served, helpers.events(conn, claim.job_id))


@pytest.mark.parametrize("write", WRITES)
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
        new_expiry = helpers.renew_one(conn, claim, 600)
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


# --- fencing: one ownership fact at a time (issue 18) ------------------------------------------
#
# The forgery matrix above hands in a claim that differs from the real one. The cases below keep
# the real claim and change exactly one fact in the database, so that each condition of
# trioindex_ownership_refusal (through trioindex_lock_owned_job, and the group renewal) is the only one that can refuse the write. The
# "job is PROCESSING" conditions are not tested on their own: the schema's CHECK makes a job
# that is not PROCESSING have no worker and no claim token, so the worker and token conditions
# refuse it too.


def _job_held_by_another_worker(conn: Any, claim: Claim) -> Claim:
    # same claim token, same attempt: only the job row's worker differs
    conn.execute(
        "UPDATE embedding_jobs SET worker_id = %s WHERE id = %s",
        (helpers.worker(conn), claim.job_id),
    )
    return claim


def _job_runs_another_attempt(conn: Any, claim: Claim) -> Claim:
    # same worker, same claim token, same lease: only the attempt the job row runs differs
    conn.execute(
        "UPDATE embedding_jobs SET attempt_id = gen_random_uuid() WHERE id = %s",
        (claim.job_id,),
    )
    return claim


def _attempt_of_another_job(conn: Any, claim: Claim) -> Claim:
    # the other job's attempt runs, by the same worker, with the same number
    helpers.enqueue(conn, claim.embedding_model_id)
    (other,) = lifecycle.claim_jobs(conn, claim.worker_id, 1, 300)
    return attrs.evolve(claim, attempt_id=other.attempt_id)


ONE_FACT: dict[str, Callable[[Any, Claim], Claim]] = {
    "job held by another worker": _job_held_by_another_worker,
    "job runs another attempt": _job_runs_another_attempt,
    "attempt of another job": _attempt_of_another_job,
}


@pytest.mark.parametrize("fact", ONE_FACT)
def test_one_changed_ownership_fact_alone_refuses_every_write_and_changes_nothing(
    db: Database, worker: Any, fact: str
) -> None:
    seen: dict[str, tuple[str, bool]] = {}
    for write in WRITES:
        claim = _claim_one(db, worker)
        with db.connection() as conn:
            helpers.stage_embedded(conn, claim)
            held = ONE_FACT[fact](conn, claim)
            before = _snapshot(conn, claim)
            result = _outcome(lambda conn=conn, held=held, write=write: _writes(held)[write](conn))
            seen[write] = (type(result).__name__, _snapshot(conn, claim) == before)
    assert seen == dict.fromkeys(WRITES, ("OwnershipLost", True))


# --- renew vs recover ---------------------------------------------------------------------------


def _wait_until_lease_expired(conn: Any, job_id: Any, within: float = 30.0) -> None:
    """Poll the committed row until the database clock has passed its lease."""
    deadline = time.monotonic() + within
    while not conn.execute(
        "SELECT lease_expires_at <= clock_timestamp() AS expired FROM embedding_jobs WHERE id = %s",
        (job_id,),
    ).fetchone()["expired"]:
        assert time.monotonic() < deadline, "the lease did not expire"


def test_recovery_skips_an_expired_row_another_transaction_holds_and_takes_the_next(
    db: Database, worker: Any
) -> None:
    """SKIP LOCKED, forced: recovery (which may wait at most ``lock_timeout`` for a lock) must
    pass over the locked expired job at once and recover the other one."""
    held, free = _claim_one(db, worker), _claim_one(db, worker)
    with db.connection() as conn:
        helpers.expire_lease(conn, held.job_id)  # expired first: first in recovery's order
        helpers.expire_lease(conn, free.job_id)
    with db.connection() as holder, db.connection() as recoverer:
        recoverer.execute("SET lock_timeout = '2s'")
        with holder.transaction():
            holder.execute("SELECT 1 FROM embedding_jobs WHERE id = %s FOR UPDATE", (held.job_id,))
            recovered = lifecycle.recover_expired(recoverer, helpers.BACKOFF)
        assert [r.job_id for r in recovered] == [free.job_id]
        assert helpers.job_row(recoverer, held.job_id)["status"] == "PROCESSING"
        again = lifecycle.recover_expired(recoverer, helpers.BACKOFF)
        assert [r.job_id for r in again] == [held.job_id]


@pytest.mark.parametrize("write", ["fenced write", "group fence", "renewal"])
def test_recovery_skips_a_job_whose_owner_is_mid_write_as_its_lease_runs_out(
    db: Database, worker: Any, write: str
) -> None:
    """The owner passed the fence (or sent a renewal) while its lease was valid; the lease then
    runs out before it commits. Recovery must skip the row, not take it from under the owner
    and not wait for it; the owner's write lands."""
    with db.connection() as conn:
        model = helpers.model(conn)
        helpers.enqueue(conn, model.id)
        (claim,) = lifecycle.claim_jobs(conn, worker, 1, 1.0)  # a one-second lease
    with db.connection() as owner, db.connection() as recoverer:
        recoverer.execute("SET lock_timeout = '2s'")
        with owner.transaction():
            if write == "renewal":
                renewed = helpers.renew_one(owner, claim, 300)
            elif write == "group fence":
                # the fence a group's store and completion functions run first
                (codes,) = (
                    owner.execute(
                        """SELECT codes FROM trioindex_fence_many(
                           ARRAY[%s]::uuid[], ARRAY[%s]::uuid[], ARRAY[%s]::uuid[],
                           ARRAY[%s]::uuid[])""",
                        (claim.job_id, claim.worker_id, claim.claim_token, claim.attempt_id),
                    )
                    .fetchone()
                    .values()
                )
                assert codes == [None]
            else:
                lifecycle.lock_owned_job(owner, claim)  # only the fence holds the row so far
            _wait_until_lease_expired(recoverer, claim.job_id)
            assert lifecycle.recover_expired(recoverer, helpers.BACKOFF) == []
            if write != "renewal":
                owner.execute(
                    "UPDATE embedding_jobs SET progress = 50 WHERE id = %s", (claim.job_id,)
                )
        row = helpers.job_row(recoverer, claim.job_id)
        assert row["status"] == "PROCESSING"
        if write == "renewal":
            assert row["lease_expires_at"] == renewed
            assert lifecycle.recover_expired(recoverer, helpers.BACKOFF) == []
        else:
            assert row["progress"] == 50
            # the write did not extend the lease: the next pass recovers the job
            recovered = lifecycle.recover_expired(recoverer, helpers.BACKOFF)
            assert [r.job_id for r in recovered] == [claim.job_id]


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
            "SELECT status FROM trioindex_job_attempts WHERE id = %s", (claim.attempt_id,)
        ).fetchone()
        assert attempt is not None
        assert attempt["status"] == "EXPIRED"
        row = helpers.job_row(conn, claim.job_id)
        assert row["available_at"] > row["updated_at"]  # requeued with a backoff delay


def test_renewers_and_recoverers_on_valid_and_expired_leases_leave_one_owner_per_job(
    db: Database,
) -> None:
    """Outcome test: one renewer and three recoverers at once over 40 jobs, half of whose leases
    have run out. Which side wins each job is fixed by its lease before they start; what is
    checked is the end state — one owner per job, and the loser can write nothing. The forced
    interleavings are the two ``test_recovery_skips_*`` tests above."""
    with db.connection() as conn:
        model = helpers.model(conn)
        for _ in range(40):
            helpers.enqueue(conn, model.id)
        worker_id = helpers.worker(conn)
        claims = lifecycle.claim_jobs(conn, worker_id, 40, 300)
        # half the leases have already run out, the other half are valid for 300 s
        for claim in claims[::2]:
            helpers.expire_lease(conn, claim.job_id)
    renewed: dict[Any, Any] = {}

    def renewer(conn: Any) -> None:
        for claim in claims:
            result = _outcome(lambda c=claim: helpers.renew_one(conn, c, 300))
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
                    helpers.renew_one(conn, claim, 300)
            else:
                assert claim.job_id in renewed
                assert (
                    row["status"] == "PROCESSING"
                    and row["lease_expires_at"] == renewed[claim.job_id]
                )
    assert recovered == {c.job_id for c in claims[::2]}


# --- complete vs fail vs recover ---------------------------------------------------------------


@pytest.mark.parametrize("lease", ["valid-race", "expired-outcome"])
def test_complete_fail_and_recover_on_one_claim_commit_exactly_one_transition(
    db: Database, worker: Any, lease: str
) -> None:
    """Started together on one claim. With a valid lease the three really compete (any of
    them may win a round); with an expired one it is an outcome test: the lease decides before
    they start. The forced interleaving is the next test."""
    lease = lease.split("-", maxsplit=1)[0]
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


def _blocked_then_released(
    db: Database, hold: Callable[[Any], object], then: Callable[[Any], object]
) -> tuple[object, object]:
    """Run ``hold`` in a transaction left open; start ``then`` on another connection; wait until
    PostgreSQL shows ``then`` waiting on a lock (not merely started); only then commit ``hold``.
    Returns both results (``then``'s error as a value)."""
    holding, release = threading.Event(), threading.Event()
    waiter: list[int] = []

    def first() -> object:
        with db.connection() as conn, conn.transaction():
            result = hold(conn)
            holding.set()
            assert release.wait(30)
            return result

    def second() -> object:
        assert holding.wait(30)
        with db.connection() as conn:
            waiter.append(conn.info.backend_pid)
            return _outcome(lambda: then(conn))

    with ThreadPoolExecutor(2) as pool:
        held, waiting = pool.submit(first), pool.submit(second)
        with db.connection() as conn:
            while not (waiter and helpers.waits_on_a_lock(conn, waiter[0])):
                assert not waiting.done(), f"did not wait for the lock: {waiting.result()!r}"
                assert not held.done(), held.result()
        release.set()
        return held.result(), waiting.result()


@pytest.mark.parametrize("write", WRITES)
def test_a_write_waiting_on_the_job_lock_is_refused_once_a_completion_commits(
    db: Database, worker: Any, write: str
) -> None:
    """Forced: the completion holds the job row; the other write waits for it, then finds the
    job SUCCEEDED and must change nothing (it read the job under the lock, not before it)."""
    claim = _claim_one(db, worker)
    with db.connection() as conn:
        helpers.stage_embedded(conn, claim)
    completed, late = _blocked_then_released(
        db, lambda conn: lifecycle.complete_job(conn, claim), _writes(claim)[write]
    )
    assert not isinstance(completed, Exception), completed
    assert isinstance(late, OwnershipLost), late
    with db.connection() as conn:
        assert helpers.events(conn, claim.job_id) == [
            "JOB_ENQUEUED",
            "JOB_CLAIMED",
            "JOB_SUCCEEDED",
        ]
        assert helpers.job_row(conn, claim.job_id)["status"] == "SUCCEEDED"
        attempt = conn.execute(
            "SELECT status FROM trioindex_job_attempts WHERE id = %s", (claim.attempt_id,)
        ).fetchone()
        assert attempt == {"status": "SUCCEEDED"}


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
        assert row["status"] == "PENDING"
        assert row["claim_token"] is None
        assert row["last_failure_type"] == "EMBEDDING_PROVIDER_UNAVAILABLE"
        assert result.available_at is not None
        assert result.available_at > row["updated_at"]
        assert lifecycle.claim_jobs(conn, worker, 1, 300) == []
        helpers.make_available(conn, claim.job_id)
        again = lifecycle.claim_jobs(conn, worker, 1, 300)
        assert [c.attempt_no for c in again] == [2]


def test_retries_spent_end_the_job_failed_and_touch_no_other_state(
    db: Database, worker: Any
) -> None:
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
        served = helpers.count(conn, "SELECT count(*) FROM served_versions")
    assert row["status"] == "FAILED"
    assert row["finished_at"] is not None
    assert served == 0


def test_non_retryable_failure_ends_failed_at_once(db: Database, worker: Any) -> None:
    claim = _claim_one(db, worker, max_attempts=5)
    with db.connection() as conn:
        result = lifecycle.fail_job(
            conn, claim, FailureType.DOCUMENT_CONTENT_INVALID, "empty document", helpers.BACKOFF
        )
        assert result.outcome is FailOutcome.FAILED
        attempt = conn.execute(
            "SELECT status, failure_type, failure_message FROM trioindex_job_attempts WHERE id = %s",
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


@pytest.mark.parametrize(
    ("attempt_no", "unit_random", "seconds"),
    [
        (1, 0.5, 10.0),  # the first retry waits ``initial``
        (0, 0.5, 10.0),  # no attempt yet counts as the first
        (3, 0.5, 40.0),  # doubled per attempt
        (7, 0.5, 600.0),  # 640 capped at ``maximum``
        (60, 0.5, 600.0),
        (1, 0.0, 8.0),  # the lowest draw: -20 %
        (3, 0.75, 44.0),  # +10 %
    ],
)
def test_the_retry_delay_is_exponential_capped_and_jittered(
    db: Database, attempt_no: int, unit_random: float, seconds: float
) -> None:
    """``trioindex_retry_delay`` (migration 0004) is the one backoff definition; a failure
    report and lease recovery both call it (next two tests)."""
    with db.connection() as conn:
        row = conn.execute(
            "SELECT trioindex_retry_delay(%s, 10, 600, 0.2, %s) AS delay",
            (attempt_no, unit_random),
        ).fetchone()
    assert row["delay"] == pytest.approx(seconds)


def test_a_retryable_failure_waits_the_retry_delay_of_its_draw(db: Database, worker: Any) -> None:
    claim = _claim_one(db, worker)
    backoff = BackoffPolicy(initial=10.0, maximum=600.0, jitter=0.2)
    with db.connection() as conn:
        result = lifecycle.fail_job(
            conn, claim, FailureType.STORAGE_UNAVAILABLE, "down", backoff, unit_random=0.0
        )
        row = helpers.job_row(conn, claim.job_id)
    assert result.available_at == row["available_at"]
    # the trigger stamps updated_at with the same transaction clock the delay starts from
    assert (row["available_at"] - row["updated_at"]).total_seconds() == pytest.approx(8.0)


def test_recovery_requeues_with_the_retry_delay(db: Database, worker: Any) -> None:
    claim = _claim_one(db, worker)
    with db.connection() as conn:
        helpers.expire_lease(conn, claim.job_id)
        (recovered,) = lifecycle.recover_expired(conn, helpers.BACKOFF)
        assert recovered.outcome is FailOutcome.RETRY_SCHEDULED
        row = helpers.job_row(conn, claim.job_id)
    assert (row["available_at"] - row["updated_at"]).total_seconds() == pytest.approx(10.0)


def test_expired_lease_on_the_last_attempt_ends_failed(db: Database, worker: Any) -> None:
    claim = _claim_one(db, worker, max_attempts=1)
    with db.connection() as conn:
        helpers.expire_lease(conn, claim.job_id)
        (recovered,) = lifecycle.recover_expired(conn, helpers.BACKOFF)
        assert recovered.outcome is FailOutcome.FAILED
        row = helpers.job_row(conn, claim.job_id)
    assert row["status"] == "FAILED"
    assert row["last_failure_type"] == "WORKER_INTERNAL_ERROR"


def test_expired_lease_on_the_last_attempt_fails_the_job_alone(db: Database, worker: Any) -> None:
    claim = _claim_one(db, worker, max_attempts=1)
    with db.connection() as conn:
        version_before = conn.execute(
            "SELECT * FROM document_versions WHERE id = %s", (claim.document_version_id,)
        ).fetchone()
        helpers.expire_lease(conn, claim.job_id)
        lifecycle.recover_expired(conn, helpers.BACKOFF)
        version_after = conn.execute(
            "SELECT * FROM document_versions WHERE id = %s", (claim.document_version_id,)
        ).fetchone()
        job = helpers.job_row(conn, claim.job_id)
    assert job["status"] == "FAILED"
    assert version_after == version_before


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
        served = helpers.served(conn, v1.document_id, model.id)
    assert served == v2.version_id


def _no_chunks(conn: Any, claim: Claim) -> None:
    # nothing stored: zero chunks and zero vectors agree, yet nothing is indexed
    pass


def _one_vector_missing(conn: Any, claim: Claim) -> None:
    helpers.stage_embedded(conn, claim)
    conn.execute(
        "DELETE FROM embeddings WHERE id IN (SELECT id FROM embeddings WHERE document_version_id = %s LIMIT 1)",
        (claim.document_version_id,),
    )


def _one_vector_of_another_model(conn: Any, claim: Claim) -> None:
    # the count matches only if vectors of another model are (wrongly) counted
    helpers.stage_embedded(conn, claim)
    other = helpers.model(conn, "other-model")
    conn.execute(
        """UPDATE embeddings SET embedding_model_id = %s
           WHERE id IN (SELECT id FROM embeddings WHERE document_version_id = %s LIMIT 1)""",
        (other.id, claim.document_version_id),
    )


def _another_chunk_set(conn: Any, claim: Claim) -> None:
    # a full embedding set, but on a chunk set the job does not make (another chunking)
    helpers.stage_embedded(conn, claim)
    conn.execute(
        "UPDATE document_chunks SET chunking = 'tokens:other' WHERE document_version_id = %s",
        (claim.document_version_id,),
    )


NOT_COMPLETABLE: dict[str, Callable[[Any, Claim], None]] = {
    "no chunks": _no_chunks,
    "one vector missing": _one_vector_missing,
    "one vector of another model": _one_vector_of_another_model,
    "vectors on another chunk set": _another_chunk_set,
}


@pytest.mark.parametrize("state", NOT_COMPLETABLE)
def test_complete_refuses_a_version_that_is_not_fully_embedded_and_changes_nothing(
    db: Database, worker: Any, state: str
) -> None:
    claim = _claim_one(db, worker)
    with db.connection() as conn:
        NOT_COMPLETABLE[state](conn, claim)
        before = _snapshot(conn, claim)
        with pytest.raises(StateInconsistent):
            lifecycle.complete_job(conn, claim)
        assert _snapshot(conn, claim) == before


def test_events_never_carry_the_claim_token(db: Database, worker: Any) -> None:
    claim = _claim_one(db, worker)
    with db.connection() as conn:
        helpers.renew_one(conn, claim, 300)
        lifecycle.fail_job(conn, claim, FailureType.WORKER_INTERNAL_ERROR, "x", helpers.BACKOFF)
        dump = conn.execute(
            "SELECT string_agg(to_jsonb(e)::text, ' ') AS all FROM indexing_events e"
        ).fetchone()
    assert dump is not None
    assert str(claim.claim_token) not in dump["all"]


@pytest.mark.parametrize("earlier_v1", [False, True])
def test_an_older_version_completing_while_a_newer_one_commits_does_not_replace_it(
    db: Database, worker: Any, earlier_v1: bool
) -> None:
    """v3's completion holds the document row; v2's completion waits on it and, once v3 has
    committed, must see v3 as current (issue 11 §1: it used to keep its stale join and win)."""
    with db.connection() as conn:
        model = helpers.model(conn)
        if earlier_v1:
            helpers.enqueue(conn, model.id, "doc", content=b"one")
            (c1,) = lifecycle.claim_jobs(conn, worker, 1, 300)
            helpers.stage_embedded(conn, c1)
            assert lifecycle.complete_job(conn, c1).became_current
        v2 = helpers.enqueue(conn, model.id, "doc", content=b"two")
        v3 = helpers.enqueue(conn, model.id, "doc", content=b"three")
        claims = {c.document_version_id: c for c in lifecycle.claim_jobs(conn, worker, 2, 300)}
        for claim in claims.values():
            helpers.stage_embedded(conn, claim)

    v3_holds_document = threading.Event()
    release_v3 = threading.Event()
    v2_backend: list[int] = []

    def complete_v3() -> object:
        with db.connection() as conn, conn.transaction():
            result = lifecycle.complete_job(conn, claims[v3.version_id])
            v3_holds_document.set()
            assert release_v3.wait(30)
            return result

    def complete_v2() -> object:
        assert v3_holds_document.wait(30)
        with db.connection() as conn:
            v2_backend.append(conn.info.backend_pid)
            return _outcome(lambda: lifecycle.complete_job(conn, claims[v2.version_id]))

    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(complete_v3)
        second = pool.submit(complete_v2)
        # v2 must be blocked on a lock (the document row) before v3 commits
        with db.connection() as conn:
            while not (v2_backend and helpers.waits_on_a_lock(conn, v2_backend[0])):
                assert not second.done(), second.result()
        release_v3.set()
        assert first.result().became_current  # type: ignore[attr-defined]
        late = second.result()
    assert not isinstance(late, Exception), late
    assert not late.became_current  # type: ignore[attr-defined]
    with db.connection() as conn:
        assert helpers.served(conn, v3.document_id, claims[v3.version_id].embedding_model_id) == (
            v3.version_id
        )
        (event,) = [e for e in job_events(conn, v2.job_id) if e.event_type == "JOB_SUCCEEDED"]
        assert event.detail["became_current"] is False
        assert helpers.attempt_row(conn, v2.job_id)["became_current"] is False


# --- hand back at shutdown ------------------------------------------------------


def test_a_released_claim_is_pending_at_once_and_costs_no_attempt(
    db: Database, worker: Any
) -> None:
    claim = _claim_one(db, worker, max_attempts=1)
    with db.connection() as conn:
        helpers.stage_chunked(conn, claim, ["a", "b"])
        lifecycle.release_job(conn, claim)
        row = helpers.job_row(conn, claim.job_id)
        assert row["status"] == "PENDING"
        assert row["worker_id"] is None
        assert row["claim_token"] is None
        assert (row["attempt_count"], row["max_attempts"]) == (1, 2)
        attempt = conn.execute(
            "SELECT status, finished_at FROM trioindex_job_attempts WHERE id = %s",
            (claim.attempt_id,),
        ).fetchone()
        assert attempt["status"] == "CANCELLED"
        assert attempt["finished_at"] is not None
        assert helpers.events(conn, claim.job_id)[-1] == "JOB_RELEASED"
        # claimable again at once, as the next consecutive attempt, resuming at embed
        (again,) = lifecycle.claim_jobs(conn, worker, 1, 300)
        assert (again.job_id, again.attempt_no) == (claim.job_id, 2)
        assert again.chunks_ready  # its chunk set is kept: the job resumes at embed
        # the one real attempt left still counts: a lapsed lease on it ends the job FAILED
        helpers.expire_lease(conn, again.job_id)
        (recovered,) = lifecycle.recover_expired(conn, helpers.BACKOFF)
        assert recovered.outcome is FailOutcome.FAILED


def test_a_released_job_wakes_listening_workers(db: Database, worker: Any) -> None:
    claim = _claim_one(db, worker)
    with db.connection() as listener, db.connection() as conn:
        listener.execute("LISTEN trioindex_jobs")
        lifecycle.release_job(conn, claim)
        woken = [n.channel for n in listener.notifies(timeout=5, stop_after=1)]
    assert woken == ["trioindex_jobs"]


def test_recovery_expires_only_the_current_attempt(db: Database, worker: Any) -> None:
    """Attempt 1 failed, attempt 2 was handed back, attempt 3's lease runs out: only attempt
    3 becomes EXPIRED; the history of the others stays as it was."""
    claim = _claim_one(db, worker, max_attempts=3)
    with db.connection() as conn:
        lifecycle.fail_job(conn, claim, FailureType.STORAGE_UNAVAILABLE, "down", helpers.BACKOFF)
        helpers.make_available(conn, claim.job_id)
        (second,) = lifecycle.claim_jobs(conn, worker, 1, 300)
        lifecycle.release_job(conn, second)
        (third,) = lifecycle.claim_jobs(conn, worker, 1, 300)
        helpers.expire_lease(conn, third.job_id)
        (recovered,) = lifecycle.recover_expired(conn, helpers.BACKOFF)
        attempts = conn.execute(
            "SELECT attempt_no, status FROM trioindex_job_attempts WHERE embedding_job_id = %s ORDER BY attempt_no",
            (claim.job_id,),
        ).fetchall()
    assert recovered.outcome is FailOutcome.RETRY_SCHEDULED  # the hand-back gave one back
    assert [(a["attempt_no"], a["status"]) for a in attempts] == [
        (1, "FAILED"),
        (2, "CANCELLED"),
        (3, "EXPIRED"),
    ]


def test_a_claim_already_recovered_cannot_be_released(db: Database, worker: Any) -> None:
    claim = _claim_one(db, worker)
    with db.connection() as conn:
        helpers.expire_lease(conn, claim.job_id)
        lifecycle.recover_expired(conn, helpers.BACKOFF)
        before = _snapshot(conn, claim)
        with pytest.raises(OwnershipLost):
            lifecycle.release_job(conn, claim)
        assert _snapshot(conn, claim) == before


# --- drain (issue 11 §2) -----------------------------------------------------------------------


def test_drain_state_counts_scheduled_retries_and_orphans_of_stopped_or_silent_workers(
    db: Database, worker: Any
) -> None:
    with db.connection() as conn:
        model = helpers.model(conn)
        other_model = helpers.model(conn, "other-model")
        me = helpers.worker(conn)
        assert lifecycle.drain_state(conn, model.id, heartbeat_timeout=30, exclude=me).drained
        # a scheduled retry (PENDING, due later)
        helpers.enqueue(conn, model.id)
        (retry,) = lifecycle.claim_jobs(conn, worker, 1, 300)
        lifecycle.fail_job(
            conn, retry, FailureType.EMBEDDING_PROVIDER_UNAVAILABLE, "503", helpers.BACKOFF
        )
        state = lifecycle.drain_state(conn, model.id, heartbeat_timeout=30, exclude=me)
        assert (state.scheduled, state.orphaned) == (1, 0)
        assert 5 < (state.next_due_in or 0) <= 10  # BACKOFF.initial
        helpers.make_available(conn, retry.job_id)
        # held by a live worker (RUNNING, fresh heartbeat): not owed by the drain
        (live,) = lifecycle.claim_jobs(conn, worker, 1, 300)
        assert lifecycle.drain_state(conn, model.id, heartbeat_timeout=30, exclude=me).drained
        # the same job under a stopped worker is an orphan until recovery takes it
        lifecycle.set_worker_status(conn, worker, WorkerStatus.STOPPED)
        state = lifecycle.drain_state(conn, model.id, heartbeat_timeout=30, exclude=me)
        assert (state.scheduled, state.orphaned, state.expired_orphans) == (0, 1, 0)
        assert 290 < (state.next_due_in or 0) <= 300  # its lease
        helpers.expire_lease(conn, live.job_id)
        assert (
            lifecycle.drain_state(conn, model.id, heartbeat_timeout=30, exclude=me).expired_orphans
            == 1
        )
        # other models' jobs are not this drain's business
        assert lifecycle.drain_state(conn, other_model.id, heartbeat_timeout=30, exclude=me).drained


def test_drain_state_treats_a_silent_running_worker_as_gone(db: Database, worker: Any) -> None:
    claim = _claim_one(db, worker)
    with db.connection() as conn:
        me = helpers.worker(conn)
        assert lifecycle.drain_state(conn, None, heartbeat_timeout=30, exclude=me).drained
        conn.execute(
            "UPDATE indexing_workers SET last_heartbeat_at = now() - interval '31 seconds' WHERE id = %s",
            (claim.worker_id,),
        )
        assert lifecycle.drain_state(conn, None, heartbeat_timeout=30, exclude=me).orphaned == 1
        # its own jobs never count: the draining worker waits for them anyway
        assert lifecycle.drain_state(
            conn, None, heartbeat_timeout=30, exclude=claim.worker_id
        ).drained


def test_a_worker_claims_only_the_jobs_of_its_own_model(db: Database) -> None:
    # During a model switch both models have PENDING jobs; a worker embeds with one model, so
    # a job of the other one in its hands would store vectors of the wrong model. (Migration
    # 0006 also gives the serving model a job for every version enqueued for another model.)
    with db.connection() as conn:
        mine, other = helpers.model(conn, "mine", 4), helpers.model(conn, "other", 8)
        for i in range(3):
            helpers.enqueue(conn, mine.id, f"mine-{i}.txt")
            helpers.enqueue(conn, other.id, f"other-{i}.txt")
        claims = lifecycle.claim_jobs(conn, helpers.worker(conn), 20, 300, model_id=mine.id)
        left = conn.execute(
            "SELECT status, count(*) AS n FROM embedding_jobs WHERE embedding_model_id = %s"
            " GROUP BY status",
            (other.id,),
        ).fetchall()
    assert claims and {c.embedding_model_id for c in claims} == {mine.id}
    assert [(r["status"], r["n"]) for r in left] == [("PENDING", 3)]


def test_a_rescued_attempt_is_recorded_with_the_steps_it_ran(db: Database, worker: Any) -> None:
    """A dead worker's attempt ran on the job row (its embed step began); lease recovery
    writes its row once, EXPIRED, under the claim's attempt id, with the claim's start, its
    worker and its step, and frees the job row of it."""
    claim = _claim_one(db, worker)
    with db.connection() as conn:
        helpers.stage_chunked(conn, claim, ["one", "two"])
        begin_embedding(conn, claim)
        claimed_at = helpers.job_row(conn, claim.job_id)["locked_at"]
        assert helpers.count(conn, "SELECT count(*) FROM embedding_job_attempts") == 0
        helpers.expire_lease(conn, claim.job_id)
        lifecycle.recover_expired(conn, helpers.BACKOFF)
        rows = conn.execute(
            """SELECT id, attempt_no, worker_id, status, started_at,
                      embedding_started_at IS NOT NULL AS began_embedding
               FROM embedding_job_attempts WHERE embedding_job_id = %s""",
            (claim.job_id,),
        ).fetchall()
        job = helpers.job_row(conn, claim.job_id)
    assert rows == [
        {
            "id": claim.attempt_id,
            "attempt_no": 1,
            "worker_id": worker,
            "status": "EXPIRED",
            "started_at": claimed_at,
            "began_embedding": True,
        }
    ]
    assert (job["status"], job["attempt_id"]) == ("PENDING", None)


# --- updated_at ------------------------------------------------------------------------------


def test_every_write_of_a_job_row_moves_its_updated_at(db: Database, worker: Any) -> None:
    """The claim and the completion set updated_at themselves (the touch trigger is then not
    called); every other writer leaves it to the trigger. Each write is its own transaction,
    so each must leave a later updated_at than the one before."""
    claim = _claim_one(db, worker, max_attempts=5)
    with db.connection() as conn:
        stamps = [helpers.job_row(conn, claim.job_id)["updated_at"]]

        def write(fn: Callable[[], object]) -> None:
            fn()
            stamps.append(helpers.job_row(conn, claim.job_id)["updated_at"])

        write(lambda: helpers.renew_one(conn, claim, 600))
        write(
            lambda: lifecycle.fail_job(
                conn, claim, FailureType.STORAGE_UNAVAILABLE, "down", helpers.BACKOFF
            )
        )
        write(lambda: helpers.make_available(conn, claim.job_id))
        (again,) = lifecycle.claim_jobs(conn, worker, 1, 300)
        stamps.append(helpers.job_row(conn, claim.job_id)["updated_at"])
        write(lambda: lifecycle.release_job(conn, again))
        (third,) = lifecycle.claim_jobs(conn, worker, 1, 300)
        stamps.append(helpers.job_row(conn, claim.job_id)["updated_at"])
        write(lambda: helpers.expire_lease(conn, third.job_id))
        write(lambda: lifecycle.recover_expired(conn, helpers.BACKOFF))
        write(lambda: helpers.make_available(conn, claim.job_id))
        (last,) = lifecycle.claim_jobs(conn, worker, 1, 300)
        stamps.append(helpers.job_row(conn, claim.job_id)["updated_at"])
        helpers.stage_embedded(conn, last)
        write(lambda: lifecycle.complete_many(conn, [last]))
        assert helpers.job_row(conn, claim.job_id)["status"] == "SUCCEEDED"
    assert all(b > a for a, b in itertools.pairwise(stamps)), stamps


# --- the running attempt's steps after it ends -------------------------------------------------

_STEP_COLUMNS = (
    "attempt_parse_started_at",
    "attempt_chunks_stored_at",
    "attempt_chunks",
    "attempt_characters",
    "attempt_replaced_sequences",
    "attempt_embedding_started_at",
    "attempt_embeddings_stored_at",
    "attempt_embeddings",
    "attempt_embedding_slices",
)


def _end_by_retry(conn: Any, claim: Claim) -> None:
    lifecycle.fail_job(conn, claim, FailureType.STORAGE_UNAVAILABLE, "down", helpers.BACKOFF)


def _end_by_failure(conn: Any, claim: Claim) -> None:
    lifecycle.fail_job(conn, claim, FailureType.DOCUMENT_CONTENT_INVALID, "bad", helpers.BACKOFF)


def _end_by_recovery(conn: Any, claim: Claim) -> None:
    helpers.expire_lease(conn, claim.job_id)
    lifecycle.recover_expired(conn, helpers.BACKOFF)


def _end_by_completion(conn: Any, claim: Claim) -> None:
    lifecycle.complete_job(conn, claim)


def _end_by_group_completion(conn: Any, claim: Claim) -> None:
    [result] = lifecycle.complete_many(conn, [claim])
    assert not isinstance(result, Exception), result


@pytest.mark.parametrize(
    "end",
    [
        _end_by_retry,
        _end_by_failure,
        lifecycle.release_job,
        _end_by_recovery,
        _end_by_completion,
        _end_by_group_completion,
    ],
    ids=["retry", "failed", "hand-back", "recovery", "completion", "group-completion"],
)
def test_an_ended_attempt_leaves_its_steps_in_its_row_and_none_on_the_job_row(
    db: Database, worker: Any, end: Callable[[Any, Claim], object]
) -> None:
    """Every end of an attempt (failure with a retry, failure, hand-back, lease recovery,
    completion alone and in a group) writes the steps the attempt ran into its row and empties
    them on the job row in the same update: a job that runs no attempt carries none."""
    claim = _claim_one(db, worker, max_attempts=3)
    with db.connection() as conn:
        helpers.stage_embedded(conn, claim)
        begin_embedding(conn, claim)
        running = helpers.job_row(conn, claim.job_id)
        assert running["attempt_embedding_started_at"] is not None
        end(conn, claim)
        job = helpers.job_row(conn, claim.job_id)
        ended = conn.execute(
            "SELECT embedding_started_at FROM embedding_job_attempts WHERE id = %s",
            (claim.attempt_id,),
        ).fetchone()
    assert job["status"] != "PROCESSING"
    assert ended == {"embedding_started_at": running["attempt_embedding_started_at"]}
    assert {column: job[column] for column in _STEP_COLUMNS} == dict.fromkeys(_STEP_COLUMNS)
