"""Queue benchmark: how fast no-op jobs go through claim → attempt → complete, and how soon an
idle worker picks up a new job (each scenario on a fresh database of one embedded PostgreSQL, with
default durability and ``pg_stat_statements``, after ``VACUUM ANALYZE`` and ``CHECKPOINT``).

1. **Throughput.** ``--jobs`` versions pre-staged with their chunk set and vectors (one chunk,
   one embedding) go through the real :class:`~trioindex.worker.runtime.Worker` and
   :class:`~trioindex.worker.queue.JobQueue` with no-op steps, in N worker processes
   (``drain=True``, ``max-concurrency`` c, pool c + 2, warmed, started together); next to it a
   raw ``SKIP LOCKED`` loop on a minimal table (one claim and one ``UPDATE`` per job, one thread
   per connection), run right before the trioindex rows of the same total concurrency.
   jobs/s = jobs / (last ``finished_at`` − start); xact/job and WAL B/job from
   ``pg_stat_database`` and ``pg_current_wal_lsn()``; stmts/job and server ms/job from
   ``pg_stat_statements``; CPU = worker processes / PostgreSQL backends; wait = attempt
   ``started_at`` − start; batch = jobs per non-empty claim; load = 1-minute load average before.
2. **Idle pickup latency.** One idle worker (``max-concurrency`` 8, polling-interval 1s) with
   and without the NOTIFY listener; a thread enqueues jobs one at a time 20-200 ms apart.
   Latency = attempt ``started_at`` − job ``created_at``; "after commit" = ``started_at`` − the
   moment the enqueuer's COMMIT returned (slightly negative when the NOTIFY arrives first).

Run ``.venv/bin/python -m bench.queue`` (``just bench-queue``); ``--quick`` is a smoke run that
writes its files to a temporary folder unless ``--out`` says otherwise; ``--only LABEL``
(repeatable) runs the named scenarios alone and ``--no-latency`` skips the idle latency.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import multiprocessing
import os
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from multiprocessing.context import SpawnContext
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event as ProcessEvent
from pathlib import Path
from typing import Any
from uuid import UUID

import attrs
import psycopg
import trio

from bench.common import (
    BenchPostgres,
    DbCounters,
    Panel,
    Session,
    StatementStat,
    add_out,
    bench_parser,
    column_table,
    cpu_seconds,
    format_machine,
    machine_info,
    markdown_table,
    page_head,
    peak_rss_mb,
    percentiles,
    plot_panels,
    verdict,
    warm_pool,
)
from testkit.jobs import enqueue_text, stage_embedded
from trioindex.config import WorkerSettings, default_settings
from trioindex.db.models import ensure_model
from trioindex.db.pool import Database, connect
from trioindex.values import BackoffPolicy, Claim, CompleteResult
from trioindex.worker.job import JobOutcome
from trioindex.worker.listen import listen_for_jobs
from trioindex.worker.queue import JobQueue
from trioindex.worker.runtime import Worker

DEFAULT_JOBS = 2000
DEFAULT_LATENCY_JOBS = 50
QUICK_JOBS = 200
QUICK_LATENCY_JOBS = 10
MODEL_NAME = "bench-noop"
DIMENSION = 4
POOL_CAP = 40
TOP_STATEMENTS = 16
TARGET_RATIO = 0.8
TARGET_CONCURRENCY = 8
IDLE_CONCURRENCY = 8
IDLE_POLLING_INTERVAL = 1.0
IDLE_GAP = (0.020, 0.200)

# (worker processes, max-concurrency per process). The first three sweep concurrency in one
# process; 2x4 and 4x2 keep the total at 8 to compare processes against the raw loop at 8;
# 2x8 and 4x8 scale the 8-slot worker out.
TRIOINDEX_SHAPES: tuple[tuple[int, int], ...] = (
    (1, 1),
    (1, 8),
    (1, 32),
    (2, 4),
    (4, 2),
    (2, 8),
    (4, 8),
)
RAW_CONCURRENCY: tuple[int, ...] = (1, 8, 16, 32)


# ---------------------------------------------------------------------------------------------
# values


@attrs.frozen
class Scenario:
    kind: str  # "trioindex" or "raw"
    processes: int
    concurrency: int  # per process (raw: threads)

    @property
    def total_concurrency(self) -> int:
        return self.processes * self.concurrency

    @property
    def label(self) -> str:
        if self.kind == "raw":
            return f"raw x{self.concurrency}"
        return f"trioindex {self.processes}x{self.concurrency}"


@attrs.frozen
class ThroughputResult:
    scenario: Scenario
    jobs: int
    succeeded: int
    wall_s: float
    xact_per_job: float
    wal_bytes_per_job: float
    statements_per_job: float
    server_ms_per_job: float
    client_cpu_ms_per_job: float
    server_cpu_ms_per_job: float
    wait_ms: dict[str, float]
    # The brief's created_at-based figure; in a backlog run it includes the benchmark's own
    # setup between staging and the start (setup_gap_s), so the tables show wait_ms instead.
    created_to_claim_ms: dict[str, float]
    setup_gap_s: float
    peak_rss_mb: float
    claim_batch: float | None  # mean jobs per non-empty claim (trioindex only)
    top_statements: tuple[StatementStat, ...]
    load_average_1m: float

    @property
    def jobs_per_s(self) -> float:
        return self.succeeded / self.wall_s if self.wall_s > 0 else float("nan")

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.scenario.kind,
            "label": self.scenario.label,
            "processes": self.scenario.processes,
            "concurrency_per_process": self.scenario.concurrency,
            "total_concurrency": self.scenario.total_concurrency,
            "jobs": self.jobs,
            "succeeded": self.succeeded,
            "wall_s": round(self.wall_s, 4),
            "jobs_per_s": round(self.jobs_per_s, 1),
            "xact_per_job": round(self.xact_per_job, 3),
            "wal_bytes_per_job": round(self.wal_bytes_per_job, 1),
            "statements_per_job": round(self.statements_per_job, 2),
            "server_ms_per_job": round(self.server_ms_per_job, 3),
            "client_cpu_ms_per_job": round(self.client_cpu_ms_per_job, 3),
            "server_cpu_ms_per_job": round(self.server_cpu_ms_per_job, 3),
            "load_average_1m_before": round(self.load_average_1m, 2),
            "queue_wait_ms": {k: round(v, 1) for k, v in self.wait_ms.items()},
            "created_to_claim_ms": {k: round(v, 1) for k, v in self.created_to_claim_ms.items()},
            "setup_gap_s": round(self.setup_gap_s, 3),
            "peak_rss_mb": round(self.peak_rss_mb, 1),
            "claim_batch": None if self.claim_batch is None else round(self.claim_batch, 2),
            "top_statements": [
                {
                    "query": _short_sql(s.query),
                    "calls_per_job": round(s.calls / self.jobs, 3),
                    "ms_per_job": round(s.total_ms / self.jobs, 4),
                }
                for s in self.top_statements
            ],
        }


@attrs.frozen
class LatencyResult:
    mode: str  # "notify" or "polling"
    jobs: int
    succeeded: int
    latencies_ms: tuple[float, ...]
    enqueue_tx_ms_median: float
    after_commit_ms: tuple[float, ...]  # claim start − the enqueuer seeing its COMMIT return

    def as_json(self) -> dict[str, Any]:
        stats = percentiles(self.latencies_ms)
        after = percentiles(self.after_commit_ms)
        return {
            "mode": self.mode,
            "jobs": self.jobs,
            "succeeded": self.succeeded,
            "polling_interval_s": IDLE_POLLING_INTERVAL,
            "max_concurrency": IDLE_CONCURRENCY,
            **{f"{k}_ms": round(v, 1) for k, v in stats.items()},
            "mean_ms": round(sum(self.latencies_ms) / len(self.latencies_ms), 1)
            if self.latencies_ms
            else None,
            "max_ms": round(max(self.latencies_ms), 1) if self.latencies_ms else None,
            "enqueue_tx_ms_median": round(self.enqueue_tx_ms_median, 2),
            **{f"after_commit_{k}_ms": round(v, 1) for k, v in after.items()},
            "latencies_ms": [round(v, 2) for v in self.latencies_ms],
        }


def _ms(value: float) -> str:
    """One decimal, without the "-0.0" that rounding a tiny negative value gives."""
    return f"{round(value, 1) + 0.0:.1f}"


def _short_sql(query: str, width: int = 90) -> str:
    text = re.sub(r"\s+", " ", query).strip()
    return text if len(text) <= width else text[: width - 1] + "…"


# ---------------------------------------------------------------------------------------------
# the trioindex side: no-op steps and worker processes


@attrs.frozen
class NoopSteps:
    """Parse and embed that return at once: the job is only the queue's own work."""

    queue: JobQueue

    async def parse(self, claim: Claim) -> int:
        return 0

    async def embed(self, claim: Claim) -> int:
        return 1

    async def complete(self, claim: Claim) -> CompleteResult:
        return await self.queue.complete(claim)

    def forget(self, claim: Claim) -> None:
        pass

    async def serve(self) -> None:
        await trio.sleep_forever()


def worker_settings(concurrency: int, polling_interval: float = 1.0) -> WorkerSettings:
    return attrs.evolve(
        default_settings().worker, max_concurrency=concurrency, polling_interval=polling_interval
    )


def pool_size_for(concurrency: int) -> int:
    return min(concurrency + 2, POOL_CAP)


def job_queue(db: Database, settings: WorkerSettings) -> JobQueue:
    return JobQueue(
        db,
        lease_seconds=settings.lease_duration,
        backoff=BackoffPolicy(
            initial=settings.retry_backoff_initial,
            maximum=settings.retry_backoff_max,
            jitter=settings.retry_jitter,
        ),
    )


_STAGE_SQL = """
WITH docs AS (
    INSERT INTO documents (external_key)
    SELECT 'bench-' || g FROM generate_series(1, %(n)s) AS g
    RETURNING id, external_key
), versions AS (
    INSERT INTO document_versions
        (document_id, version_no, storage_key, original_name, content_type, byte_size, sha256)
    SELECT id, 1, 'sha256/bench/' || external_key, external_key || '.txt', 'text/plain', 1,
           repeat('a', 64)
    FROM docs
    RETURNING id, document_id
), chunks AS (
    INSERT INTO document_chunks (document_id, document_version_id, chunk_index, content,
                                 char_start, char_end, token_count, content_sha256)
    SELECT document_id, id, 0, 'x', 0, 1, 1, repeat('b', 64) FROM versions
    RETURNING id, document_id, document_version_id
), vectors AS (
    INSERT INTO embeddings (chunk_id, document_id, document_version_id, embedding_model_id,
                            vector, dimension, vector_sha256)
    SELECT id, document_id, document_version_id, %(model)s, '[0.5,0.5,0.5,0.5]'::vector, 4,
           repeat('c', 64)
    FROM chunks
)
INSERT INTO embedding_jobs (document_version_id, embedding_model_id, max_attempts)
SELECT id, %(model)s, 3 FROM versions
"""


def stage_trioindex_jobs(url: str, jobs: int) -> UUID:
    """``jobs`` versions with one chunk + one embedding stored, each with a PENDING job."""
    with contextlib.closing(connect(url)) as conn:
        model = ensure_model(conn, MODEL_NAME, DIMENSION)
        with conn.transaction():
            conn.execute(_STAGE_SQL, {"n": jobs, "model": model.id})
    return model.id


async def _serve_worker(
    url: str, concurrency: int, ready: Queue[Any], start: ProcessEvent
) -> dict[str, Any]:
    settings = worker_settings(concurrency)
    db = Database(url, pool_size=pool_size_for(concurrency))
    await trio.to_thread.run_sync(db.open)
    try:
        await trio.to_thread.run_sync(warm_pool, db.connection, pool_size_for(concurrency))
        ready.put(os.getpid())
        await trio.to_thread.run_sync(start.wait)
        queue = job_queue(db, settings)
        worker = Worker(queue=queue, steps=NoopSteps(queue), settings=settings)
        began, cpu_before = time.perf_counter(), cpu_seconds()
        await worker.serve(drain=True)
        return {
            "pid": os.getpid(),
            "serve_s": time.perf_counter() - began,
            "cpu_s": cpu_seconds() - cpu_before,
            "counters": worker.counters.snapshot(),
        }
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(db.close)


def worker_process(
    url: str, concurrency: int, ready: Queue[Any], start: ProcessEvent, results: Queue[Any]
) -> None:
    """Entry point of one spawned worker process: warm up, wait for the start, drain, report."""
    logging.basicConfig(level=logging.WARNING)
    try:
        outcome = trio.run(_serve_worker, url, concurrency, ready, start)
    except BaseException as exc:
        results.put({"pid": os.getpid(), "error": f"{type(exc).__name__}: {exc}"})
        raise
    outcome["peak_rss_mb"] = peak_rss_mb()
    results.put(outcome)


def _collect(
    results: Queue[Any], processes: Sequence[BaseProcess], count: int, limit_s: float
) -> list[dict[str, Any]]:
    """``count`` messages from the children, failing early if one dies without reporting."""
    import queue as queue_module

    deadline = time.monotonic() + limit_s
    got: list[dict[str, Any]] = []
    while len(got) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"worker processes reported {len(got)} of {count} in {limit_s}s")
        try:
            got.append(results.get(timeout=0.5))
        except queue_module.Empty:
            dead = [p for p in processes if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"worker process exited with {dead[0].exitcode}") from None
    return got


def run_trioindex(pg: BenchPostgres, scenario: Scenario, jobs: int) -> ThroughputResult:
    ctx: SpawnContext = multiprocessing.get_context("spawn")
    with pg.fresh_database("queue") as url:
        stage_trioindex_jobs(url, jobs)
        pg.quiesce(url)
        load = os.getloadavg()[0]
        before = pg.counters(url)
        pg.reset_statements()
        ready: Queue[Any] = ctx.Queue()
        results: Queue[Any] = ctx.Queue()
        start = ctx.Event()
        processes = [
            ctx.Process(
                target=worker_process,
                args=(url, scenario.concurrency, ready, start, results),
                name=f"bench-worker-{i}",
            )
            for i in range(scenario.processes)
        ]
        for process in processes:
            process.start()
        try:
            _collect(ready, processes, scenario.processes, limit_s=120)
            t0 = time.time()
            start.set()
            reports = _collect(results, processes, scenario.processes, limit_s=600)
        finally:
            for process in processes:
                process.join(timeout=30)
                if process.is_alive():  # only our own children, by handle
                    process.kill()
                    process.join()
        errors = [r["error"] for r in reports if "error" in r]
        if errors:
            raise RuntimeError(f"{scenario.label}: worker failed: {errors[0]}")
        after = pg.counters(url)
        statements = pg.statements(url)
        with psycopg.connect(url, autocommit=True) as conn:
            summary = conn.execute(
                """SELECT count(*) FILTER (WHERE status = 'SUCCEEDED'),
                          extract(epoch FROM max(finished_at))::float8
                   FROM embedding_jobs"""
            ).fetchone()
            started = conn.execute(
                """SELECT extract(epoch FROM a.started_at)::float8,
                          extract(epoch FROM j.created_at)::float8
                   FROM embedding_job_attempts a
                   JOIN embedding_jobs j ON j.id = a.embedding_job_id"""
            ).fetchall()
        assert summary is not None
        succeeded, last_finished = int(summary[0]), summary[1]
        counters = Counter[str]()
        for report in reports:
            counters.update(report["counters"])
        claiming_polls = counters["polls"] - counters["empty_polls"]
        return _result(
            pg,
            scenario,
            jobs,
            succeeded=succeeded,
            wall_s=(last_finished - t0) if last_finished is not None else float("nan"),
            counters=(before, after),
            statements=statements,
            client_cpu_s=sum(float(r["cpu_s"]) for r in reports),
            started=[(row[0], row[1]) for row in started],
            t0=t0,
            peak_rss=max(float(r["peak_rss_mb"]) for r in reports),
            claim_batch=counters["claimed"] / claiming_polls if claiming_polls else None,
            load=load,
        )


def _result(
    pg: BenchPostgres,
    scenario: Scenario,
    jobs: int,
    *,
    succeeded: int,
    wall_s: float,
    counters: tuple[DbCounters, DbCounters],
    statements: Sequence[StatementStat],
    client_cpu_s: float,
    started: Sequence[tuple[float, float]],
    t0: float,
    peak_rss: float,
    claim_batch: float | None,
    load: float,
) -> ThroughputResult:
    before, after = counters
    return ThroughputResult(
        scenario=scenario,
        jobs=jobs,
        succeeded=succeeded,
        wall_s=wall_s,
        xact_per_job=(after.xact_commit - before.xact_commit) / jobs,
        wal_bytes_per_job=pg.wal_bytes(before, after) / jobs,
        statements_per_job=sum(s.calls for s in statements) / jobs,
        server_ms_per_job=sum(s.total_ms for s in statements) / jobs,
        client_cpu_ms_per_job=client_cpu_s * 1000 / jobs,
        server_cpu_ms_per_job=(after.server_cpu_s - before.server_cpu_s) * 1000 / jobs,
        wait_ms=percentiles([(began - t0) * 1000 for began, _ in started]),
        created_to_claim_ms=percentiles([(began - created) * 1000 for began, created in started]),
        setup_gap_s=t0 - max((created for _, created in started), default=t0),
        peak_rss_mb=peak_rss,
        claim_batch=claim_batch,
        top_statements=tuple(statements[:TOP_STATEMENTS]),
        load_average_1m=load,
    )


# ---------------------------------------------------------------------------------------------
# the raw loop

_RAW_SCHEMA = """
CREATE TABLE raw_jobs (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    status       text NOT NULL DEFAULT 'PENDING',
    created_at   timestamptz NOT NULL DEFAULT now(),
    started_at   timestamptz,
    finished_at  timestamptz
);
CREATE INDEX raw_jobs_pending ON raw_jobs (id) WHERE status = 'PENDING'
"""
_RAW_CLAIM = """
UPDATE raw_jobs SET status = 'RUNNING', started_at = now()
WHERE id = (SELECT id FROM raw_jobs WHERE status = 'PENDING' ORDER BY id
            LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id
"""
_RAW_COMPLETE = "UPDATE raw_jobs SET status = 'DONE', finished_at = now() WHERE id = %s"


def _raw_loop(url: str, barrier: threading.Barrier, errors: list[BaseException]) -> None:
    """One thread, one connection: claim one job, complete it, until nothing is left."""
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            barrier.wait()
            while True:
                row = conn.execute(_RAW_CLAIM).fetchone()
                if row is None:
                    return
                conn.execute(_RAW_COMPLETE, (row[0],))
    except Exception as exc:
        errors.append(exc)
        barrier.abort()


def run_raw(pg: BenchPostgres, scenario: Scenario, jobs: int) -> ThroughputResult:
    with pg.fresh_database("raw") as url:
        with psycopg.connect(url, autocommit=True) as conn:
            for statement in _RAW_SCHEMA.split(";"):
                conn.execute(statement)
            conn.execute(
                "INSERT INTO raw_jobs (status) SELECT 'PENDING' FROM generate_series(1, %s)",
                (jobs,),
            )
        pg.quiesce(url)
        load = os.getloadavg()[0]
        before = pg.counters(url)
        pg.reset_statements()
        barrier = threading.Barrier(scenario.concurrency + 1)
        errors: list[BaseException] = []
        threads = [
            threading.Thread(target=_raw_loop, args=(url, barrier, errors), name=f"raw-{i}")
            for i in range(scenario.concurrency)
        ]
        for thread in threads:
            thread.start()
        t0, cpu_before = time.time(), cpu_seconds()
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait(timeout=60)
        for thread in threads:
            thread.join()
        client_cpu_s = cpu_seconds() - cpu_before
        if errors:
            raise RuntimeError(f"{scenario.label}: {type(errors[0]).__name__}: {errors[0]}")
        after = pg.counters(url)
        statements = pg.statements(url)
        with psycopg.connect(url, autocommit=True) as conn:
            summary = conn.execute(
                """SELECT count(*) FILTER (WHERE status = 'DONE'),
                          extract(epoch FROM max(finished_at))::float8 FROM raw_jobs"""
            ).fetchone()
            started = conn.execute(
                """SELECT extract(epoch FROM started_at)::float8,
                          extract(epoch FROM created_at)::float8
                   FROM raw_jobs WHERE started_at IS NOT NULL"""
            ).fetchall()
        assert summary is not None
        return _result(
            pg,
            scenario,
            jobs,
            succeeded=int(summary[0]),
            wall_s=summary[1] - t0 if summary[1] is not None else float("nan"),
            counters=(before, after),
            statements=statements,
            client_cpu_s=client_cpu_s,
            started=[(row[0], row[1]) for row in started],
            t0=t0,
            peak_rss=peak_rss_mb(),
            claim_batch=None,
            load=load,
        )


# ---------------------------------------------------------------------------------------------
# idle pickup latency


@attrs.frozen
class Enqueued:
    transaction_ms: float
    committed_at: float  # time.time() when COMMIT returned to the enqueuer


def _enqueue_with_gaps(url: str, model_id: UUID, count: int, seed: int) -> dict[str, Enqueued]:
    """Enqueue ``count`` jobs one at a time with random gaps; return timings by document key.

    Each job is enqueued by :func:`enqueue_version` (via ``enqueue_text``, which NOTIFYs) inside an outer transaction
    that also stages its embedding, so the NOTIFY and the job become visible at one commit.
    """
    rng = random.Random(seed)
    timings: dict[str, Enqueued] = {}
    with contextlib.closing(connect(url)) as conn:
        for i in range(count):
            time.sleep(rng.uniform(*IDLE_GAP))  # sync-ok: a benchmark thread pacing enqueues
            began = time.perf_counter()
            with conn.transaction():
                result = enqueue_text(conn, model_id, f"idle-{i}", f"idle-{seed}-{i}".encode())
                stage_embedded(conn, result.version_id, result.document_id, model_id)
            timings[f"idle-{i}"] = Enqueued((time.perf_counter() - began) * 1000, time.time())
    return timings


async def _idle_worker_run(
    url: str, model_id: UUID, count: int, notify: bool, seed: int
) -> dict[str, Enqueued]:
    settings = worker_settings(IDLE_CONCURRENCY, polling_interval=IDLE_POLLING_INTERVAL)
    db = Database(url, pool_size=pool_size_for(IDLE_CONCURRENCY))
    await trio.to_thread.run_sync(db.open)
    try:
        all_done = trio.Event()
        outcomes = Counter[str]()

        def on_job_done(claim: Claim, outcome: JobOutcome) -> None:
            outcomes[str(outcome)] += 1
            if sum(outcomes.values()) >= count:
                all_done.set()

        listening = trio.Event()

        async def listener(wake: Callable[[], None]) -> None:
            # functools.partial(listen_for_jobs, url), started so we know LISTEN is in place
            async with trio.open_nursery() as nursery:
                await nursery.start(functools.partial(listen_for_jobs, url, wake))
                listening.set()

        chosen: Callable[[Callable[[], None]], Awaitable[None]] | None = (
            listener if notify else None
        )
        queue = job_queue(db, settings)
        worker = Worker(
            queue=queue,
            steps=NoopSteps(queue),
            settings=settings,
            listener=chosen,
            on_job_done=on_job_done,
        )
        with trio.fail_after(60 + count * 2):
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.serve)
                if notify:
                    await listening.wait()
                timings = await trio.to_thread.run_sync(
                    _enqueue_with_gaps, url, model_id, count, seed
                )
                await all_done.wait()
                worker.request_stop()
        if outcomes["succeeded"] != count:
            raise RuntimeError(f"idle worker outcomes: {dict(outcomes)}")
        return timings
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(db.close)


def run_idle_latency(pg: BenchPostgres, count: int, *, notify: bool, seed: int) -> LatencyResult:
    with pg.fresh_database("idle") as url:
        with contextlib.closing(connect(url)) as conn:
            model_id = ensure_model(conn, MODEL_NAME, DIMENSION).id
        pg.quiesce(url)
        timings = trio.run(_idle_worker_run, url, model_id, count, notify, seed)
        with psycopg.connect(url, autocommit=True) as conn:
            rows = conn.execute(
                """SELECT extract(epoch FROM a.started_at - j.created_at)::float8 * 1000,
                          extract(epoch FROM a.started_at)::float8, d.external_key, j.status
                   FROM embedding_jobs j
                   JOIN trioindex_job_attempts a ON a.embedding_job_id = j.id AND a.attempt_no = 1
                   JOIN document_versions v ON v.id = j.document_version_id
                   JOIN documents d ON d.id = v.document_id
                   ORDER BY j.created_at"""
            ).fetchall()
        durations = sorted(t.transaction_ms for t in timings.values())
        return LatencyResult(
            mode="notify" if notify else "polling",
            jobs=count,
            succeeded=sum(1 for *_, status in rows if status == "SUCCEEDED"),
            latencies_ms=tuple(float(row[0]) for row in rows),
            enqueue_tx_ms_median=durations[len(durations) // 2] if durations else float("nan"),
            after_commit_ms=tuple(
                (float(started) - timings[key].committed_at) * 1000 for _, started, key, _ in rows
            ),
        )


# ---------------------------------------------------------------------------------------------
# reporting


def _matching_raw(
    result: ThroughputResult, raws: Sequence[ThroughputResult]
) -> ThroughputResult | None:
    total = result.scenario.total_concurrency
    return next((r for r in raws if r.scenario.total_concurrency == total), None)


def _by_label(throughput: Sequence[ThroughputResult], label: str) -> ThroughputResult | None:
    return next((r for r in throughput if r.scenario.label == label), None)


def _throughput_columns(
    raws: Sequence[ThroughputResult],
) -> list[tuple[str, Callable[[ThroughputResult], str]]]:
    def times_raw(r: ThroughputResult) -> str:
        raw = _matching_raw(r, raws)
        return f"{r.jobs_per_s / raw.jobs_per_s:.2f}" if raw and r.scenario.kind != "raw" else "—"

    return [
        ("scenario", lambda r: r.scenario.label),
        ("total conc.", lambda r: str(r.scenario.total_concurrency)),
        ("jobs/s", lambda r: f"{r.jobs_per_s:,.0f}"),
        ("× raw at same conc.", times_raw),
        ("xact/job", lambda r: f"{r.xact_per_job:.2f}"),
        ("WAL B/job", lambda r: f"{r.wal_bytes_per_job:,.0f}"),
        ("stmts/job", lambda r: f"{r.statements_per_job:.1f}"),
        ("server exec ms/job", lambda r: f"{r.server_ms_per_job:.2f}"),
        (
            "CPU ms/job client / server",
            lambda r: f"{r.client_cpu_ms_per_job:.2f} / {r.server_cpu_ms_per_job:.2f}",
        ),
        ("wait p50 / p95 / p99 ms", lambda r: " / ".join(f"{v:,.0f}" for v in r.wait_ms.values())),
        ("batch", lambda r: "—" if r.claim_batch is None else f"{r.claim_batch:.2f}"),
        ("peak RSS MiB", lambda r: f"{r.peak_rss_mb:.0f}"),
        ("load", lambda r: f"{r.load_average_1m:.1f}"),
    ]


_LATENCY_COLUMNS: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
    ("mode", lambda d: d["mode"]),
    ("jobs", lambda d: str(d["jobs"])),
    *((f"{k} ms", lambda d, k=k: f"{d[f'{k}_ms']:.1f}") for k in ("p50", "p95", "p99", "max")),
    ("enqueue tx median ms", lambda d: f"{d['enqueue_tx_ms_median']:.1f}"),
    (
        "after commit p50 / p95 ms",
        lambda d: f"{_ms(d['after_commit_p50_ms'])} / {_ms(d['after_commit_p95_ms'])}",
    ),
]


def _tables(
    throughput: Sequence[ThroughputResult], latency: Sequence[LatencyResult]
) -> tuple[list[str], list[str]]:
    raws = [r for r in throughput if r.scenario.kind == "raw"]
    return (
        column_table(_throughput_columns(raws), throughput),
        column_table(_LATENCY_COLUMNS, [r.as_json() for r in latency]),
    )


def plot(
    throughput: Sequence[ThroughputResult], latency: Sequence[LatencyResult], path: Path
) -> Path:
    labels = [r.scenario.label for r in throughput]
    raw8 = _by_label(throughput, f"raw x{TARGET_CONCURRENCY}")
    points = ("p50", "p95", "p99")
    panels = [
        Panel(
            "Throughput (trioindex processes x concurrency; raw SKIP LOCKED loop)",
            "jobs/s",
            groups=labels,
            bars={"jobs/s": [r.jobs_per_s for r in throughput]},
            notes=[f"{r.jobs_per_s:.0f}" for r in throughput],
            hline=None
            if raw8 is None
            else (TARGET_RATIO * raw8.jobs_per_s, f"target: {TARGET_RATIO} x raw x8"),
        ),
        Panel(
            "Round trips and commits per job",
            "per job",
            groups=labels,
            bars={
                "statements (round trips) / job": [r.statements_per_job for r in throughput],
                "commits / job": [r.xact_per_job for r in throughput],
            },
        ),
        Panel(
            "CPU per job (client + server)",
            "CPU ms per job",
            groups=labels,
            bars={
                "client process(es)": [r.client_cpu_ms_per_job for r in throughput],
                "PostgreSQL backends": [r.server_cpu_ms_per_job for r in throughput],
            },
        ),
        Panel(
            f"Idle worker pickup latency (polling-interval {IDLE_POLLING_INTERVAL:.0f}s)",
            "enqueue → claim, ms (log)",
            groups=points,
            bars={r.mode: [percentiles(r.latencies_ms)[p] for p in points] for r in latency},
            log=True,
        ),
    ]
    return plot_panels(path, panels, (26, 6))


def _markdown(
    *,
    machine: dict[str, Any],
    command: str,
    date: str,
    elapsed: float,
    jobs: int,
    latency_jobs: int,
    throughput: Sequence[ThroughputResult],
    latency: Sequence[LatencyResult],
    target: dict[str, Any],
    png_name: str,
) -> str:
    table, latency_table = _tables(throughput, latency)
    lines = [
        *page_head("Queue benchmark", date, command, elapsed, machine, about=__doc__ or ""),
        f"{jobs} no-op jobs per throughput scenario, {latency_jobs} jobs per latency mode.",
        "",
        "## Throughput: claim → attempt → complete",
        "",
        *table,
        "",
        "## Idle worker: enqueue → claim latency",
        "",
        *latency_table,
        "",
        f"![queue benchmark]({png_name})",
        "",
        "## Reading",
        "",
        *_reading(machine, throughput, latency, target),
        "",
        f"## Where the statements go (concurrency {TARGET_CONCURRENCY})",
        "",
    ]
    for label in (f"trioindex 1x{TARGET_CONCURRENCY}", f"raw x{TARGET_CONCURRENCY}"):
        if (result := _by_label(throughput, label)) is not None:
            rows = [
                [
                    f"{s.calls / result.jobs:.2f}",
                    f"{s.total_ms / result.jobs:.3f}",
                    f"`{_short_sql(s.query, 110).replace('|', chr(92) + '|')}`",
                ]
                for s in result.top_statements
            ]
            heading = f"{label}: top-level statements from `pg_stat_statements`, per job."
            columns = ("calls/job", "exec ms/job", "statement")
            lines += [heading, "", *markdown_table(columns, rows, "rrl"), ""]
    return "\n".join(lines).rstrip() + "\n"


def _reading(
    machine: dict[str, Any],
    throughput: Sequence[ThroughputResult],
    latency: Sequence[LatencyResult],
    target: dict[str, Any],
) -> list[str]:
    """A few facts computed from the figures, so a re-run cannot leave a stale explanation."""
    out: list[str] = []
    tri = _by_label(throughput, f"trioindex 1x{TARGET_CONCURRENCY}")
    raw = _by_label(throughput, f"raw x{TARGET_CONCURRENCY}")
    cores = machine.get("usable_cores") or machine.get("logical_cores") or 1
    if tri is not None and raw is not None and target:
        out.append(
            f"- **Target ({TARGET_RATIO} × raw at concurrency {TARGET_CONCURRENCY}):** "
            f"{verdict(target['met'])}: "
            f"{tri.jobs_per_s:,.0f} against {raw.jobs_per_s:,.0f} jobs/s (ratio "
            f"{target['ratio']:.2f}). Per job: {tri.xact_per_job:.2f} against "
            f"{raw.xact_per_job:.2f} commits, {tri.statements_per_job:.1f} against "
            f"{raw.statements_per_job:.1f} round trips, "
            f"{tri.client_cpu_ms_per_job + tri.server_cpu_ms_per_job:.2f} against "
            f"{raw.client_cpu_ms_per_job + raw.server_cpu_ms_per_job:.2f} ms of CPU on "
            f"{cores} cores."
        )
    by_mode = {result.mode: result for result in latency}
    if "notify" in by_mode and "polling" in by_mode:
        n = percentiles(by_mode["notify"].latencies_ms)
        p = percentiles(by_mode["polling"].latencies_ms)
        out.append(
            f"- Idle pickup p50 / p95: {n['p50']:.1f} / {n['p95']:.1f} ms with NOTIFY, "
            f"{p['p50']:.0f} / {p['p95']:.0f} ms polling every {IDLE_POLLING_INTERVAL:.0f}s."
        )
    if loads := [r.load_average_1m for r in throughput]:
        out.append(
            f"- Noise: the load average before the scenarios ranged from {min(loads):.1f} to "
            f"{max(loads):.1f} on {cores} cores; per-job counts are steadier than rates."
        )
    return out


# ---------------------------------------------------------------------------------------------
# main


def run_order(scenarios: Sequence[Scenario]) -> list[Scenario]:
    """Each raw loop right before the trioindex runs of the same total concurrency.

    Other work on the machine comes and goes; running the two sides of each comparison back to
    back keeps them under similar load.
    """
    order: list[Scenario] = []
    for raw in (s for s in scenarios if s.kind == "raw"):
        order.append(raw)
        order += [
            s for s in scenarios if s.kind != "raw" and s.total_concurrency == raw.total_concurrency
        ]
    order += [s for s in scenarios if s not in order]
    return order


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = bench_parser(
        "queue",
        "Queue benchmark: no-op job throughput against a raw SKIP LOCKED loop, and "
        "idle-worker pickup latency with NOTIFY and with polling.",
        "small counts, for a smoke run",
    )
    parser.add_argument("--jobs", type=int, default=None, help="jobs per throughput scenario")
    parser.add_argument("--latency-jobs", type=int, default=None, help="jobs per latency mode")
    parser.add_argument("--seed", type=int, default=20240601, help="seed of the enqueue gaps")
    parser.add_argument(
        "--only",
        action="append",
        metavar="LABEL",
        help='run only this scenario ("trioindex 1x8", "raw x8"; repeatable)',
    )
    parser.add_argument(
        "--no-latency", action="store_true", help="skip the idle pickup latency scenarios"
    )
    add_out(parser, "queue")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    session = Session.start("queue", args)
    jobs = args.jobs or (QUICK_JOBS if args.quick else DEFAULT_JOBS)
    latency_jobs = args.latency_jobs or (QUICK_LATENCY_JOBS if args.quick else DEFAULT_LATENCY_JOBS)

    shown = [Scenario("trioindex", p, c) for p, c in TRIOINDEX_SHAPES]
    shown += [Scenario("raw", 1, c) for c in RAW_CONCURRENCY]
    if args.only:
        shown = [s for s in shown if s.label in args.only]
    scenarios = run_order(shown)
    throughput: list[ThroughputResult] = []
    latency: list[LatencyResult] = []
    with BenchPostgres() as pg:
        machine = machine_info(pg.admin_url)
        for scenario in scenarios:
            runner = run_raw if scenario.kind == "raw" else run_trioindex
            result = runner(pg, scenario, jobs)
            if result.succeeded != jobs:
                raise RuntimeError(f"{scenario.label}: {result.succeeded} of {jobs} jobs finished")
            print(
                f"{scenario.label:<16} {result.jobs_per_s:8,.0f} jobs/s  "
                f"{result.xact_per_job:5.2f} xact/job  {result.statements_per_job:5.1f} stmts/job",
                flush=True,
            )
            throughput.append(result)
        throughput.sort(key=lambda r: shown.index(r.scenario))
        for notify in () if args.no_latency else (True, False):
            result_l = run_idle_latency(pg, latency_jobs, notify=notify, seed=args.seed)
            print(
                f"idle {result_l.mode:<8} p50 {percentiles(result_l.latencies_ms)['p50']:.1f} ms",
                flush=True,
            )
            latency.append(result_l)

    raws = [r for r in throughput if r.scenario.kind == "raw"]
    tri8 = _by_label(throughput, f"trioindex 1x{TARGET_CONCURRENCY}")
    raw8 = None if tri8 is None else _matching_raw(tri8, raws)
    target: dict[str, Any] = {}
    if tri8 is not None and raw8 is not None:
        ratio = tri8.jobs_per_s / raw8.jobs_per_s
        target = {
            "concurrency": TARGET_CONCURRENCY,
            "ratio": round(ratio, 3),
            "required": TARGET_RATIO,
            "met": ratio >= TARGET_RATIO,
        }
    table, latency_table = _tables(throughput, latency)
    print("\n".join([*format_machine(machine), *table, *latency_table]))
    if target:
        print(f"target {TARGET_RATIO} x raw x{TARGET_CONCURRENCY}: ratio {target['ratio']:.2f}")
    figures = {
        "options": {
            "jobs": jobs,
            "latency_jobs": latency_jobs,
            "seed": args.seed,
            "quick": args.quick,
            "pool_cap": POOL_CAP,
        },
        "target": target,
        "throughput": [r.as_json() for r in throughput],
        "idle_latency": [r.as_json() for r in latency],
    }
    return session.publish(
        machine,
        figures,
        lambda path: plot(throughput, latency, path),
        lambda date, elapsed, png_name: _markdown(
            machine=machine,
            command=session.command,
            date=date,
            elapsed=elapsed,
            jobs=jobs,
            latency_jobs=latency_jobs,
            throughput=throughput,
            latency=latency,
            target=target,
            png_name=png_name,
        ),
    )


if __name__ == "__main__":
    raise SystemExit(main())
