"""The worker runtime on real PostgreSQL: several workers, real claims, leases and recovery.

Steps are stand-ins (the real steps have their own tests) so that these tests isolate the
runtime's contract with the database: claims, slots, renewal, fencing, retry and shutdown.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID

import attrs
import psycopg
import psycopg_pool
import pytest
import trio
from psycopg.conninfo import make_conninfo

from tests import helpers
from trioindex.config import WorkerSettings, default_settings
from trioindex.db import jobs as lifecycle
from trioindex.db.pool import Database
from trioindex.errors import ContentInvalid, FailureType, OwnershipLost, ProviderUnavailable
from trioindex.values import BackoffPolicy, Claim, CompleteResult, WorkerStatus
from trioindex.worker.job import JobOutcome, OutcomeKind
from trioindex.worker.queue import JobQueue
from trioindex.worker.runtime import Worker

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

    async def complete(self, claim: Claim) -> CompleteResult:
        return await self.db.run(lifecycle.complete_job, claim)

    def forget(self, claim: Claim) -> None:
        pass

    async def serve(self) -> None:
        await trio.sleep_forever()


def _fenced_stage(conn: Any, claim: Claim) -> None:
    """Store like a real step does: only under the fencing check, in one transaction."""
    with conn.transaction():
        lifecycle.lock_owned_job(conn, claim)
        helpers.stage_embedded(conn, claim)


def make_worker(db: Database, steps: StagedSteps, **changes: Any) -> Worker:
    lease = changes.pop("lease", 30.0)
    queue = JobQueue(db, lease_seconds=lease, backoff=FAST)
    return Worker(queue=queue, steps=steps, settings=settings(lease_duration=lease, **changes))


def enqueue(db: Database, n: int, **kwargs: Any) -> list[UUID]:
    with db.connection() as conn:
        model = helpers.model(conn)
        return [helpers.enqueue(conn, model.id, **kwargs).job_id for _ in range(n)]  # type: ignore[misc]


def done_event(worker: Worker, kind: OutcomeKind | None = None) -> trio.Event:
    """An event set when one of ``worker``'s jobs ends with an outcome of that kind (any)."""
    event = trio.Event()

    def on_done(claim: Claim, outcome: JobOutcome) -> None:
        if kind is None or outcome.kind is kind:
            event.set()

    worker.on_job_done = on_done
    return event


def statuses(db: Database) -> Counter[str]:
    with db.connection() as conn:
        rows = conn.execute("SELECT status FROM embedding_jobs").fetchall()
    return Counter(r["status"] for r in rows)


async def test_several_workers_draining_one_queue_run_each_job_once_within_their_slots(
    db: Database,
) -> None:
    """Outcome test: three workers drain 30 jobs. Their claims overlap but nothing forces two
    of them onto one row; that the claim skips a row another claimer holds is forced in
    ``test_jobs.py::test_claim_skips_a_row_another_transaction_holds_and_takes_the_next``."""
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
    # at most max-concurrency (2) jobs in their steps and twice as many in finishing places,
    # whose completions are being committed (architecture.md, Slots)
    assert max(peak.values()) <= 3 * 2
    assert statuses(db) == Counter({"SUCCEEDED": 30})
    with db.connection() as conn:
        claimed = conn.execute("SELECT count(*) AS n FROM trioindex_job_attempts").fetchone()
    assert claimed == {"n": 30}  # one claim (its attempt row) per job


async def test_a_retryable_failure_returns_to_the_queue_and_exhausted_retries_end_failed(
    db: Database,
) -> None:
    (job,) = enqueue(db, 1, max_attempts=3)

    async def unavailable(claim: Claim) -> None:
        raise ProviderUnavailable("HTTP 503")

    steps = StagedSteps(db, during=unavailable)
    worker = make_worker(db, steps)
    failed = done_event(worker, OutcomeKind.FAILED)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.serve)
            await failed.wait()
            worker.request_stop()
    assert statuses(db) == Counter({"FAILED": 1})
    assert steps.seen == [job, job, job]  # retried twice, then out of attempts
    with db.connection() as conn:
        events = helpers.events(conn, job)
    assert events.count("JOB_RETRY_SCHEDULED") == 2
    assert events[-1] == "JOB_FAILED"
    assert worker.counters.retried == 2
    assert worker.counters.failed == 1


async def test_a_job_that_fails_for_good_leaves_the_version_and_another_models_job_alone(
    db: Database,
) -> None:
    """Per-model state: model A's job on a version fails for good; that is A's job alone. The
    version row is unchanged, model B's job on the same version is still PENDING and untouched,
    and B's worker then indexes the version and serves it (A serves nothing)."""
    with db.connection() as conn:
        model_a = helpers.model(conn, "model-a")
        model_b = helpers.model(conn, "model-b")
        enqueued = helpers.enqueue(conn, model_a.id, max_attempts=3)
        job_a, version = enqueued.job_id, enqueued.version_id
        row = conn.execute(
            """INSERT INTO embedding_jobs (document_version_id, embedding_model_id, max_attempts)
               VALUES (%s, %s, 3) RETURNING id""",
            (version, model_b.id),
        ).fetchone()
        assert row is not None
        job_b = row["id"]
        version_before = conn.execute(
            "SELECT * FROM document_versions WHERE id = %s", (version,)
        ).fetchone()
        b_before = helpers.job_row(conn, job_b)

    async def invalid(claim: Claim) -> None:
        raise ContentInvalid("not a document")

    worker_a = make_worker(db, StagedSteps(db, during=invalid))
    worker_a.model_id = model_a.id
    with trio.fail_after(30):
        await worker_a.serve(drain=True)
    with db.connection() as conn:
        a = helpers.job_row(conn, job_a)
        assert (a["status"], a["last_failure_type"]) == ("FAILED", "DOCUMENT_CONTENT_INVALID")
        assert a["attempt_count"] == 1  # not retryable: failed for good at once
        assert (
            conn.execute("SELECT * FROM document_versions WHERE id = %s", (version,)).fetchone()
            == version_before
        )
        assert helpers.job_row(conn, job_b) == b_before
        assert helpers.count(conn, "SELECT count(*) FROM served_versions") == 0

    steps_b = StagedSteps(db)
    worker_b = make_worker(db, steps_b)
    worker_b.model_id = model_b.id
    with trio.fail_after(30):
        await worker_b.serve(drain=True)
    assert steps_b.seen == [job_b]
    with db.connection() as conn:
        b = helpers.job_row(conn, job_b)
        assert (b["status"], b["chunk_count"]) == ("SUCCEEDED", 2)
        assert helpers.job_row(conn, job_a)["status"] == "FAILED"
        served = conn.execute(
            "SELECT embedding_model_id, document_version_id FROM served_versions"
        ).fetchall()
    assert served == [{"embedding_model_id": model_b.id, "document_version_id": version}]


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
    a_done, b_done = done_event(worker_a), done_event(worker_b, OutcomeKind.SUCCEEDED)
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
    assert worker_a.counters.lost == 1
    assert worker_a.counters.succeeded == 0
    with db.connection() as conn:
        attempts = conn.execute(
            "SELECT attempt_no, status, worker_id FROM trioindex_job_attempts ORDER BY attempt_no"
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
    assert worker.counters.succeeded == 1
    assert worker.counters.renewals >= 10
    assert rescuer.counters.recovered == 0
    assert rescuer.counters.claimed == 0
    with db.connection() as conn:
        assert helpers.count(conn, "SELECT count(*) FROM trioindex_job_attempts") == 1


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


class BeatWatchingQueue(JobQueue):
    """The real queue. A heartbeat that begins while ``watch`` is set sets it when its write is
    done: the test's wake-up, for a beat that certainly started after the test's own write."""

    def __init__(self, db: Database) -> None:
        super().__init__(db, lease_seconds=30, backoff=FAST)
        self.watch: trio.Event | None = None

    async def heartbeat(self, worker_id: UUID) -> bool:
        watch = self.watch
        alive = await super().heartbeat(worker_id)
        if watch is not None:
            watch.set()
        return alive


async def test_a_running_worker_moves_its_heartbeat_forward(db: Database) -> None:
    """Registration sets last_heartbeat_at; the heartbeat loop must keep moving it."""
    queue = BeatWatchingQueue(db)
    worker = Worker(queue=queue, steps=StagedSteps(db), settings=settings(heartbeat_interval=0.2))
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            worker_id = await nursery.start(worker.serve)
            with db.connection() as conn:
                conn.execute(
                    "UPDATE indexing_workers SET last_heartbeat_at = now() - interval '1 hour' WHERE id = %s",
                    (worker_id,),
                )
            queue.watch = beat = trio.Event()
            await beat.wait()
            with db.connection() as conn:
                row = conn.execute(
                    "SELECT now() - last_heartbeat_at AS age FROM indexing_workers WHERE id = %s",
                    (worker_id,),
                ).fetchone()
            worker.request_stop()
    assert row is not None
    assert row["age"].total_seconds() < 30


async def test_heartbeat_and_recovery_loops_write_to_the_database(db: Database) -> None:
    (job,) = enqueue(db, 1)
    with db.connection() as conn:
        ghost = helpers.worker(conn)
        (claim,) = lifecycle.claim_jobs(conn, ghost, 1, 300)
        helpers.expire_lease(conn, claim.job_id)
    worker = make_worker(db, StagedSteps(db))
    done = done_event(worker, OutcomeKind.SUCCEEDED)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.serve)
            await done.wait()
            worker.request_stop()
    assert worker.counters.recovered == 1
    with db.connection() as conn:
        assert helpers.events(conn, job)[2] == "LEASE_EXPIRED_REQUEUED"


# --- shutdown hands claims back; cleanup writes are bounded (issue 11 §3) ----------------------


async def test_a_job_cancelled_at_shutdown_is_pending_at_once_without_spending_an_attempt(
    db: Database,
) -> None:
    (job,) = enqueue(db, 1, max_attempts=1)
    running = trio.Event()

    async def hang(claim: Claim) -> None:
        running.set()
        await trio.sleep_forever()

    worker = make_worker(db, StagedSteps(db, during=hang), shutdown_grace_period=0.2)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.serve)
            await running.wait()
            worker.request_stop()
    with db.connection() as conn:
        row = helpers.job_row(conn, job)
        attempts = conn.execute("SELECT status FROM trioindex_job_attempts").fetchall()
        status = conn.execute("SELECT status FROM indexing_workers").fetchone()
    # on its only attempt, yet PENDING (not FAILED after a lease expiry) and claimable now
    assert (row["status"], row["attempt_count"], row["max_attempts"]) == ("PENDING", 1, 2)
    assert attempts == [{"status": "CANCELLED"}]
    assert status == {"status": "STOPPED"}
    # the next worker picks it up at once and finishes it
    again = make_worker(db, StagedSteps(db))
    with trio.fail_after(30):
        await again.serve(drain=True)
    assert statuses(db) == Counter({"SUCCEEDED": 1})


@pytest.mark.parametrize("write", ["worker status", "hand-back", "failure report"])
async def test_a_cleanup_write_gives_up_on_a_row_lock_that_is_never_released(
    db: Database, write: str
) -> None:
    (job,) = enqueue(db, 1)
    with db.connection() as conn:
        worker_id = helpers.worker(conn)
        (claim,) = lifecycle.claim_jobs(conn, worker_id, 1, 300)
    queue = JobQueue(db, lease_seconds=30, backoff=FAST, cleanup_timeout=0.3)
    held, cleanup = {
        "worker status": (
            ("indexing_workers", worker_id),
            lambda: queue.set_worker_status(worker_id, WorkerStatus.STOPPING),
        ),
        "hand-back": (("embedding_jobs", job), lambda: queue.release(claim)),
        "failure report": (
            ("embedding_jobs", job),
            lambda: queue.fail(claim, FailureType.STORAGE_UNAVAILABLE, "down"),
        ),
    }[write]
    holder_ready, stop_holding = threading.Event(), threading.Event()

    def hold_row() -> None:
        table, row_id = held
        with db.connection() as conn, conn.transaction():
            conn.execute(f"SELECT 1 FROM {table} WHERE id = %s FOR UPDATE", (row_id,))
            holder_ready.set()
            stop_holding.wait(10)  # the test ends it; 10 s only if the write is not bounded

    holder = threading.Thread(target=hold_row)
    holder.start()
    try:
        assert holder_ready.wait(10)
        started = trio.current_time()
        with trio.fail_after(5), pytest.raises(psycopg.errors.QueryCanceled):
            await cleanup()
        assert trio.current_time() - started < 3
    finally:
        stop_holding.set()
        holder.join()


async def test_a_cleanup_write_gives_up_when_no_connection_can_be_had(
    database_url: str,
) -> None:
    db = Database(database_url, pool_size=1)
    db.open()
    try:
        with db.connection() as conn:
            worker_id = helpers.worker(conn)
            queue = JobQueue(db, lease_seconds=30, backoff=FAST, cleanup_timeout=0.3)
            # the pool's only connection is taken (as by a stuck statement)
            started = trio.current_time()
            with trio.fail_after(5), pytest.raises(psycopg_pool.PoolTimeout):
                await queue.set_worker_status(worker_id, WorkerStatus.STOPPED)
            # not the pool's default 30 s wait
            assert trio.current_time() - started < 3
    finally:
        db.close()


# --- drain returns only when the work is done (issue 11 §2) ------------------------------------


async def test_drain_waits_for_retries_and_for_a_stopped_workers_lease(db: Database) -> None:
    retry, orphan, ready = enqueue(db, 3)
    with db.connection() as conn:
        ghost = helpers.worker(conn)
        claims = {c.job_id: c for c in lifecycle.claim_jobs(conn, ghost, 3, 300)}
        # one retry due in about a second
        lifecycle.fail_job(
            conn, claims[retry], FailureType.EMBEDDING_PROVIDER_UNAVAILABLE, "503", FAST
        )
        conn.execute(
            "UPDATE embedding_jobs SET available_at = now() + interval '1 second' WHERE id = %s",
            (retry,),
        )
        lifecycle.release_job(conn, claims[ready])
        # one held by a worker that stopped without handing it back; its lease ends soon
        conn.execute(
            "UPDATE embedding_jobs SET lease_expires_at = clock_timestamp() + interval '1.5 seconds' WHERE id = %s",
            (orphan,),
        )
        lifecycle.set_worker_status(conn, ghost, WorkerStatus.STOPPED)
    # recovery's own tick is far away: drain must recover the orphan itself
    worker = make_worker(db, StagedSteps(db), recovery_interval=3600.0)
    with trio.fail_after(30):
        await worker.serve(drain=True)
    assert statuses(db) == Counter({"SUCCEEDED": 3})
    assert worker.counters.recovered == 1


async def test_the_outcome_line_names_the_claimed_documents_key_and_its_failure(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """The claim statement reads the document's key: no query per job to log it."""
    with db.connection() as conn:
        model = helpers.model(conn)
        job = helpers.enqueue(conn, model.id, "handbook/intro.md", max_attempts=1).job_id

    claims: list[Claim] = []

    async def unavailable(claim: Claim) -> None:
        claims.append(claim)
        raise ProviderUnavailable("embedding server answered HTTP 503")

    worker = make_worker(db, StagedSteps(db, during=unavailable))
    failed = done_event(worker, OutcomeKind.FAILED)
    with caplog.at_level(logging.INFO, logger="trioindex.worker"):
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(worker.serve)
                await failed.wait()
                worker.request_stop()
    (claim,) = claims
    assert claim.job_id == job and claim.document_key == "handbook/intro.md"
    (line,) = [r.getMessage() for r in caplog.records if f"job {job} attempt" in r.getMessage()]
    assert line.startswith(f"worker {worker.worker_id} job {job} attempt {claim.attempt_id}")
    assert "key 'handbook/intro.md': failed:EMBEDDING_PROVIDER_UNAVAILABLE" in line
    assert line.endswith("(step embed): embedding server answered HTTP 503")
    assert str(claim.claim_token) not in caplog.text
    assert len([r for r in caplog.records if "ready: waiting for jobs" in r.getMessage()]) == 1


async def test_completions_that_arrive_together_commit_as_one_group(db: Database) -> None:
    with db.connection() as conn:
        model = helpers.model(conn)
        for _ in range(5):
            helpers.enqueue(conn, model.id)
        group = lifecycle.claim_jobs(conn, helpers.worker(conn), 5, 30)
        for claim in group:
            helpers.stage_embedded(conn, claim)
    stolen = attrs.evolve(group[2], claim_token=uuid.uuid4())
    queue = JobQueue(db, lease_seconds=30, backoff=FAST)
    results: dict[int, CompleteResult | Exception] = {}

    async def complete(position: int, claim: Claim) -> None:
        try:
            results[position] = await queue.complete(claim)
        except Exception as exc:
            results[position] = exc

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(queue.serve)
            async with trio.open_nursery() as callers:
                for position, claim in enumerate([*group[:2], stolen, *group[3:]]):
                    callers.start_soon(complete, position, claim)
            nursery.cancel_scope.cancel()
    assert queue.completions.groups == 1
    assert isinstance(results.pop(2), OwnershipLost)
    assert set(results.values()) == {CompleteResult(became_current=True)}
    assert statuses(db) == Counter({"SUCCEEDED": 4, "PROCESSING": 1})


# --- an idle worker's connections -------------------------------------------------------------


def _backends_named(admin_url: str, name: str) -> int:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,)
        ).fetchone()
    assert row is not None
    return int(row[0])


class ClaimCountingQueue(JobQueue):
    """The real queue; ``enough`` is set once ``target`` claims have returned."""

    def __init__(self, db: Database, target: int) -> None:
        super().__init__(db, lease_seconds=30, backoff=FAST)
        self.target, self.claims, self.enough = target, 0, trio.Event()

    async def claim(self, worker_id: UUID, k: int, model_id: UUID | None = None) -> list[Claim]:
        claims = await super().claim(worker_id, k, model_id)
        self.claims += 1
        if self.claims >= self.target:
            self.enough.set()
        return claims


async def test_an_idle_worker_keeps_to_its_pools_one_connection(
    database_url: str, pg_server_url: str, autojump_clock: trio.abc.Clock
) -> None:
    """Claims, heartbeats and lease recovery come from separate timers that often fire at
    once; they take turns, so an idle worker never makes its pool open a second connection
    (one it would keep for ``database.pool-max-idle``). The virtual clock jumps while each
    statement runs in its thread, so the timers coincide far more often than in real time."""
    name = f"ti-idle-{uuid.uuid4().hex[:8]}"
    db = Database(make_conninfo(database_url, application_name=name), pool_size=8, max_idle=3600)
    db.open()
    try:
        queue = ClaimCountingQueue(db, target=60)
        timers = settings(polling_interval=1.0, heartbeat_interval=2.0, recovery_interval=3.0)
        worker = Worker(queue=queue, steps=StagedSteps(db), settings=timers)
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.serve)
            await queue.enough.wait()
            opened = db._pool.get_stats()["connections_num"]
            held = await trio.to_thread.run_sync(_backends_named, pg_server_url, name)
            worker.request_stop()
    finally:
        db.close()
    assert worker.counters.empty_polls >= 60
    assert (opened, held) == (1, 1)
