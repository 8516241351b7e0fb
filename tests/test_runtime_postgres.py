"""The worker runtime on real PostgreSQL: several workers, real claims, leases and recovery.

Steps are stand-ins (the real steps have their own tests) so that these tests isolate the
runtime's contract with the database: claims, slots, renewal, fencing, retry and shutdown.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID

import attrs
import trio

from tests import helpers
from trioindex import lifecycle
from trioindex.config import WorkerSettings, default_settings
from trioindex.database import Database
from trioindex.errors import ProviderUnavailable
from trioindex.runtime import Worker
from trioindex.store import JobStore
from trioindex.values import BackoffPolicy, Claim

FAST = BackoffPolicy(initial=0.05, maximum=0.2, jitter=0.0)


def settings(**changes: Any) -> WorkerSettings:
    values: dict[str, Any] = {
        "polling_interval": 0.05,
        "max_concurrency": 2,
        "lease_duration": 30.0,
        "lease_renewal_interval": 0.2,
        "recovery_interval": 0.1,
        "heartbeat_interval": 1.0,
        "shutdown_grace_period": 5.0,
    }
    return attrs.evolve(default_settings().worker, **{**values, **changes})


@attrs.define(eq=False)
class StagedSteps:
    """Parse and embed leave the version as the real steps would (EMBEDDING, full set)."""

    db: Database
    during: Callable[[Claim], Awaitable[None]] | None = None
    seen: list[UUID] = attrs.field(factory=list)

    async def parse(self, claim: Claim) -> int:
        return 1

    async def embed(self, claim: Claim) -> int:
        self.seen.append(claim.job_id)
        if self.during is not None:
            await self.during(claim)
        await self.db.run(_fenced_stage, claim)
        return 2


def _fenced_stage(conn: Any, claim: Claim) -> None:
    """Store like a real step does: only under the fencing check, in one transaction."""
    with conn.transaction():
        lifecycle.lock_owned_job(conn, claim)
        helpers.stage_embedded(conn, claim)


def make_worker(db: Database, steps: StagedSteps, **changes: Any) -> Worker:
    lease = changes.pop("lease", 30.0)
    store = JobStore(db, lease_seconds=lease, backoff=FAST)
    return Worker(store=store, steps=steps, settings=settings(lease_duration=lease, **changes))


def enqueue(db: Database, n: int, **kwargs: Any) -> list[UUID]:
    with db.connection() as conn:
        model = helpers.model(conn)
        return [helpers.enqueue(conn, model.id, **kwargs).job_id for _ in range(n)]  # type: ignore[misc]


def done_event(worker: Worker, outcome_prefix: str = "") -> trio.Event:
    """An event set when one of ``worker``'s jobs ends with an outcome starting so."""
    event = trio.Event()

    def on_done(claim: Claim, outcome: str) -> None:
        if outcome.startswith(outcome_prefix):
            event.set()

    worker.on_job_done = on_done
    return event


def statuses(db: Database) -> Counter[str]:
    with db.connection() as conn:
        rows = conn.execute("SELECT status FROM embedding_jobs").fetchall()
    return Counter(r["status"] for r in rows)


async def test_several_workers_never_claim_one_job_twice_nor_exceed_their_slots(
    db: Database,
) -> None:
    jobs = enqueue(db, 30)
    peak: Counter[UUID] = Counter()

    async def check_slots(claim: Claim) -> None:
        def processing(conn: Any) -> int:
            row = conn.execute(
                "SELECT count(*) AS n FROM embedding_jobs WHERE status = 'PROCESSING' AND worker_id = %s",
                (claim.worker_id,),
            ).fetchone()
            return int(row["n"])

        peak[claim.worker_id] = max(peak[claim.worker_id], await db.run(processing))
        await trio.sleep(0.01)

    steps = [StagedSteps(db, during=check_slots) for _ in range(3)]
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for s in steps:
                nursery.start_soon(lambda s=s: make_worker(db, s).serve(drain=True))
    everything = [job for s in steps for job in s.seen]
    assert sorted(map(str, everything)) == sorted(map(str, jobs))  # each exactly once
    assert sum(1 for s in steps if s.seen) >= 2
    assert max(peak.values()) <= 2
    assert statuses(db) == Counter({"SUCCEEDED": 30})
    with db.connection() as conn:
        claimed = conn.execute(
            "SELECT count(*) AS n FROM indexing_events WHERE event_type = 'JOB_CLAIMED'"
        ).fetchone()
    assert claimed == {"n": 30}


async def test_a_retryable_failure_returns_to_the_queue_and_exhausted_retries_end_failed(
    db: Database,
) -> None:
    (job,) = enqueue(db, 1, max_attempts=3)

    async def unavailable(claim: Claim) -> None:
        raise ProviderUnavailable("HTTP 503")

    steps = StagedSteps(db, during=unavailable)
    worker = make_worker(db, steps)
    failed = done_event(worker, "failed:")
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.serve)
            await failed.wait()
            worker.request_stop()
    assert statuses(db) == Counter({"FAILED": 1})
    assert steps.seen == [job, job, job]  # retried twice, then out of attempts
    with db.connection() as conn:
        events = helpers.events(conn, job)
    assert events.count("JOB_RETRY_SCHEDULED") == 2 and events[-1] == "JOB_FAILED"
    assert worker.counters.retried == 2 and worker.counters.failed == 1


async def test_a_worker_that_lost_its_lease_cannot_store_its_late_result(db: Database) -> None:
    """Worker A is stuck; its lease runs out; worker B recovers and finishes the job; A's late
    completion is refused and A writes nothing more."""
    (job,) = enqueue(db, 1)
    a_is_stuck, release_a = trio.Event(), trio.Event()

    async def stuck_then_expire(claim: Claim) -> None:
        with db.connection() as conn:
            helpers.expire_lease(conn, claim.job_id)  # as if A had paused past its lease
        a_is_stuck.set()
        await release_a.wait()

    steps_a = StagedSteps(db, during=stuck_then_expire)
    # one slot: while stuck, A cannot claim the job again after a recovery
    worker_a = make_worker(db, steps_a, lease_renewal_interval=60.0, max_concurrency=1)
    worker_b = make_worker(db, StagedSteps(db))
    a_done, b_done = done_event(worker_a), done_event(worker_b, "succeeded")
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker_a.serve)
            await a_is_stuck.wait()
            nursery.start_soon(worker_b.serve)
            await b_done.wait()
            release_a.set()  # A wakes up with its stale claim and tries to store + complete
            await a_done.wait()
            worker_a.request_stop()
            worker_b.request_stop()
    assert worker_a.counters.lost == 1 and worker_a.counters.succeeded == 0
    with db.connection() as conn:
        attempts = conn.execute(
            "SELECT attempt_no, status, worker_id FROM embedding_job_attempts ORDER BY attempt_no"
        ).fetchall()
        assert helpers.count(conn, "SELECT count(*) FROM embeddings") == 2  # one set, B's
        assert helpers.events(conn, job).count("JOB_SUCCEEDED") == 1
    assert [(a["attempt_no"], a["status"]) for a in attempts] == [(1, "EXPIRED"), (2, "SUCCEEDED")]
    assert attempts[0]["worker_id"] == worker_a.worker_id != attempts[1]["worker_id"]


async def test_renewal_keeps_a_long_job_owned_while_recovery_runs(db: Database) -> None:
    """A job outliving several lease durations stays with its worker: renewal wins every time."""
    enqueue(db, 1)

    async def long_step(claim: Claim) -> None:
        await trio.sleep(2.5)  # five lease durations of 0.5 s

    worker = make_worker(
        db, StagedSteps(db, during=long_step), lease=0.5, lease_renewal_interval=0.1
    )
    rescuer = make_worker(db, StagedSteps(db))
    rescuer.model_id = uuid.uuid4()  # claims nothing: only its recovery loop touches the job
    done = done_event(worker)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.serve)
            nursery.start_soon(rescuer.serve)
            await done.wait()
            worker.request_stop()
            rescuer.request_stop()
    assert worker.counters.succeeded == 1 and worker.counters.renewals >= 10
    assert rescuer.counters.recovered == 0 and rescuer.counters.claimed == 0
    with db.connection() as conn:
        assert helpers.count(conn, "SELECT count(*) FROM embedding_job_attempts") == 1


async def test_shutdown_stops_new_claims_on_real_postgres(db: Database) -> None:
    enqueue(db, 6)
    gate, both_running = trio.Event(), trio.Event()
    entered: list[Claim] = []

    async def wait_for_gate(claim: Claim) -> None:
        entered.append(claim)
        if len(entered) == 2:
            both_running.set()
        await gate.wait()

    worker = make_worker(db, StagedSteps(db, during=wait_for_gate), max_concurrency=2)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.serve)
            await both_running.wait()
            worker.request_stop()
            gate.set()
    assert statuses(db) == Counter({"SUCCEEDED": 2, "PENDING": 4})
    with db.connection() as conn:
        row = conn.execute("SELECT status FROM indexing_workers").fetchone()
    assert row == {"status": "STOPPED"}


async def test_heartbeat_and_recovery_loops_write_to_the_database(db: Database) -> None:
    (job,) = enqueue(db, 1)
    with db.connection() as conn:
        ghost = helpers.worker(conn)
        (claim,) = lifecycle.claim_jobs(conn, ghost, 1, 300)
        helpers.expire_lease(conn, claim.job_id)
    worker = make_worker(db, StagedSteps(db))
    done = done_event(worker, "succeeded")
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.serve)
            await done.wait()
            worker.request_stop()
    assert worker.counters.recovered == 1
    with db.connection() as conn:
        assert helpers.events(conn, job)[2] == "LEASE_EXPIRED_REQUEUED"
