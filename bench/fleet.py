"""Fleet benchmark: 1, 4, 16 and 64 real ``trioindex worker`` processes on one PostgreSQL.

One embedded PostgreSQL with its default ``max_connections`` (100) and the fake TEI embedder
(``testkit.embed_server``, no latency, 1024 dimensions). ``--docs`` small text documents are
ingested once into a source database, their jobs held back (``available_at`` an hour ahead),
and every fleet size gets a copy of it (``CREATE DATABASE ... TEMPLATE``). Per size:

1. N worker processes start with default settings (and the benchmark's URLs); **all start**
   means N rows RUNNING in ``indexing_workers`` with every process alive (waited for up to
   ``--start-timeout``; the time it took is reported);
2. idle: client backends of the database divided by N, 3 s after the last start and once the
   start-up's extra pooled connections have closed (at most two a worker; waited up to 40 s);
3. the jobs are released at once (``available_at = now()`` and a NOTIFY); throughput = jobs /
   (last ``finished_at`` − release), and its ratio to the best size;
4. while they run, ``pg_stat_activity`` is sampled every 250 ms: client backends (busy
   connections per worker = mean and peak / N) and the wait events of active backends;
5. PostgreSQL CPU per job: the postmaster's CPU with its reaped children plus every live
   server process, across release → last job; the workers' own CPU per job the same way
   (their processes' CPU, release → last job), and an idle worker's CPU (ms a second, over
   :data:`IDLE_WINDOW` seconds before the release); of that, the workers' main threads (the
   Trio thread, where a worker's Python work runs: one core at most, whatever its threads do);
   and the fake embedder's CPU per job, on the same cores, with the embedding requests it took a
   job and the texts each held; and the machine's context switches per job (``/proc/stat``);
6. the claims in that window (``pg_stat_statements``, reset at the release): claim statements
   per job, jobs per claim, buffer pages a claim touched (a claim that skips many locked rows
   touches many), the claim's execution time per job, every statement's calls per job, the
   jobs a group store carried (``trioindex_store_documents_many``: parse, chunks, vectors and
   completion of a group of small documents), and the statements costing the most execution
   time per job;
7. how the jobs spread: the jobs each worker ran (its succeeded attempts), the seconds from the
   release until 10 %, 50 % and 90 % of them had finished, and the rate between those marks.

``--raw`` also runs ``bench.queue``'s raw ``SKIP LOCKED`` loop (one claim and one update per
job, no worker) with as many connections as each size has workers, on the same server: how
PostgreSQL alone scales with that many claimers on this machine.

``--trickle RATE`` releases the jobs one at a time instead, ``RATE`` a second, each with its
own NOTIFY, as documents uploaded one by one are enqueued: the CPU, claims and statements a job
are then those of documents arriving alone (a NOTIFY wakes every idle worker, and groups hold
one job), and the last table's job latency (due → finished) is what a user waits. The rates are
the trickle's own. PostgreSQL's CPU and the statements a job include the release's own statement
(an ``UPDATE`` with its ``pg_notify``).

``--baseline SRC`` runs every size a second time with ``PYTHONPATH=SRC`` (another checkout's
``src``, e.g. ``/work/main/src``), interleaved with this checkout's (same database copy, same
load), so the ratios compare the two codes in one run; "× best" is within each code.

``--pgbouncer`` puts PgBouncer (transaction mode) between the workers and PostgreSQL, LISTEN
on PostgreSQL itself; its ``default_pool_size`` (server connections a database) is
``--pgbouncer-pool``, 20 (PgBouncer's own default) unless given; ``--pgbouncer-pool 5,20`` runs
every size once through each, interleaved like ``--baseline``.

``--series K`` runs all the sizes K times, series k in the order of ``--sizes`` rotated by
k − 1 (1, 4, 16, 64, then 4, 16, 64, 1, ...), so no size always runs first or always after
64 workers; "× best" is then within each code and series. The last table gives each size's
share of its series' best, series by series, and in how many series every size reached 0.9
(the fleet goal); and each size's median rate over the series against the best of those
medians: one series' ratios carry the noise of two runs, its best the largest of several
noisy rates.

Every size starts alike: its database copy is checkpointed (the copy's pages are not written
out during the run), and its workers start once the machine was at least ``--quiet-idle``
idle over :data:`IDLE_PROBE` seconds (waited for at most :data:`QUIET_LIMIT` s; the share
found is reported), so a size does not start on the last size's tail.

Before the first size, one worker runs the same jobs unreported (``--no-warm-up`` skips it):
the fake embedder caches each text's vector, so without it the first size run alone pays for
building them, on the cores every process here shares.

Run ``.venv/bin/python -m bench.fleet`` (``just bench-fleet``); ``--quick`` runs sizes 1 and 4.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import psutil
import psycopg
from psycopg.conninfo import conninfo_to_dict

from bench.common import BenchPostgres, format_machine, machine_info, verdict
from bench.harness import ingest_folder, machine_context_switches, tei_settings, worker_env
from bench.queue import Scenario, ThroughputResult, run_raw
from testkit.embed_process import EmbedServerProcess
from testkit.pgbouncer import running_pgbouncer
from testkit.postgres import admin
from trioindex.db.pool import with_dbname

DIMENSION = 1024
SAMPLE_EVERY = 0.25
#: Longest wait for an idle fleet to be down to two connections a worker
SETTLE_LIMIT = 40.0
#: Seconds over which an idle fleet's CPU is measured, before the release
IDLE_WINDOW = 5.0
#: Seconds over which the machine's idle share is measured before a size starts
IDLE_PROBE = 5.0
#: Longest wait for the machine to be quiet before a size starts
QUIET_LIMIT = 60.0


@attrs.define
class ClaimStats:
    """The claim statement's ``pg_stat_statements`` entry over one size's run."""

    calls: int = 0
    rows: int = 0
    buffers: int = 0  # shared blocks hit + read
    total_ms: float = 0.0
    top: dict[str, float] = attrs.field(factory=dict)  # statement head -> exec ms per job
    statements: int = 0  # every statement's calls, the claims' included
    stores: int = 0  # calls of the group store function: one a group of jobs


@attrs.define
class SizeResult:
    code: str
    workers: int
    series: int
    started: int
    start_seconds: float
    refused_logs: int
    jobs: int
    seconds: float
    idle_at_start_per_worker: float
    idle_per_worker: float
    settled_after: float
    busy_mean_per_worker: float
    busy_peak: int
    server_cpu_ms_per_job: float
    waits: dict[str, int]
    load_before: float
    load_after: float
    worker_cpu_ms_per_job: float
    idle_cpu_ms_per_s_per_worker: float
    claims: ClaimStats
    main_thread_cpu_ms_per_job: float = 0.0
    embedder_cpu_ms_per_job: float = 0.0
    # the embedding requests the workers sent, release to last job, and the texts they held
    embed_requests: int = 0
    embed_texts: int = 0
    # of the wall time from the release to the last job seen done, per worker: its main
    # thread on a CPU, and runnable waiting for one
    main_thread_running: float = 0.0
    main_thread_runnable: float = 0.0
    # jobs each worker ran (its attempts that succeeded), most first; workers that ran none
    # are not in it
    jobs_per_worker: list[int] = attrs.field(factory=list)
    # seconds from the release until 10 %, 50 % and 90 % of the jobs had finished
    finished_by: tuple[float, float, float] = (0.0, 0.0, 0.0)
    # the machine's idle CPU share over IDLE_PROBE s before the workers started
    idle_before: float = 0.0
    # context switches on the whole machine, release to last job, per job
    switches_per_job: float = 0.0
    # a job's seconds from due (available_at) to finished: median and 95th percentile
    latency: tuple[float, float] = (0.0, 0.0)

    @property
    def label(self) -> str:
        """The code, and the series after the first: a table's first column."""
        return self.code if self.series == 1 else f"{self.code} #{self.series}"

    @property
    def jobs_per_s(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else 0.0

    @property
    def steady_jobs_per_s(self) -> float:
        """The rate between 10 % and 90 % of the jobs finished: the release's ramp and the
        last jobs' tail left out."""
        span = self.finished_by[2] - self.finished_by[0]
        return 0.8 * self.jobs / span if span > 0 else 0.0


def write_documents(folder: Path, count: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        (folder / f"doc-{i:05d}.txt").write_text(
            f"Document {i} of the fleet benchmark. It is short: one chunk, one vector.\n"
        )


def server_cpu_now(pg: BenchPostgres) -> float:
    """The postmaster with its reaped children, plus every live server process."""
    total = pg.server_cpu_seconds()
    pid = int((pg.home.resolve() / "pgdata" / "postmaster.pid").read_text().splitlines()[0])
    for child in psutil.Process(pid).children():
        try:
            times = child.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def processes_cpu(processes: Sequence[subprocess.Popen[bytes]]) -> float:
    """CPU seconds used so far by the live ``processes``."""
    total = 0.0
    for process in processes:
        try:
            times = psutil.Process(process.pid).cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def main_threads_sched(processes: Sequence[subprocess.Popen[bytes]]) -> tuple[float, float]:
    """Seconds the main threads (thread id = process id) of the live ``processes`` have run
    on a CPU, and waited runnable for one (Linux's ``schedstat``; zeros elsewhere): what is
    left of the wall time the thread slept, waiting for work. A worker's main thread is its
    Trio thread, which runs all of its Python work but the database calls."""
    ran = waited = 0.0
    for process in processes:
        try:
            fields = Path(f"/proc/{process.pid}/task/{process.pid}/schedstat").read_text().split()
        except OSError:
            continue
        ran += int(fields[0]) / 1e9
        waited += int(fields[1]) / 1e9
    return ran, waited


#: how the claim starts in ``pg_stat_statements``: the call of ``trioindex_claim``, or (code
#: run with ``--baseline`` from before it) the statement sent as text (see trioindex.db.jobs)
CLAIM_HEADS = ("SELECT * FROM trioindex_claim(", "WITH worker AS (")
#: how the group store's call starts (see trioindex.db.steps)
STORE_HEAD = "SELECT * FROM trioindex_store_documents_many("


def claim_stats(admin_url: str, dbname: str, jobs: int) -> ClaimStats:
    """The claim statement's counters in ``dbname`` since the last reset, and the five
    statements with the most execution time (ms per job)."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        rows = conn.execute(
            """SELECT s.query, s.calls, s.rows, s.shared_blks_hit + s.shared_blks_read,
                      s.total_exec_time
               FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
               WHERE d.datname = %s ORDER BY s.total_exec_time DESC""",
            (dbname,),
        ).fetchall()
    stats = ClaimStats()
    for query, calls, nrows, buffers, total_ms in rows:
        head = " ".join(str(query).split())
        stats.statements += int(calls)
        if head.startswith(STORE_HEAD):
            stats.stores += int(calls)
        if head.startswith(CLAIM_HEADS):
            stats.calls += int(calls)
            stats.rows += int(nrows)
            stats.buffers += int(buffers)
            stats.total_ms += float(total_ms)
            head = "claim"
        if len(stats.top) < 5:
            stats.top[head[:40]] = float(total_ms) / max(1, jobs)
    return stats


def _one(target: str | psycopg.Connection[Any], sql: str) -> Any:
    """The first column of ``sql``'s first row, on ``target`` (a URL or an open connection)."""
    if isinstance(target, str):
        with psycopg.connect(target, autocommit=True) as conn:
            return _one(conn, sql)
    row = target.execute(sql).fetchone()
    return row[0] if row else None


class ActivitySampler:
    """``pg_stat_activity`` of one database every :data:`SAMPLE_EVERY` seconds, in a thread."""

    def __init__(self, admin_url: str, dbname: str) -> None:
        self.admin_url, self.dbname = admin_url, dbname
        self.backends: list[int] = []
        self.waits: Counter[str] = Counter()
        self._stop = threading.Event()
        self._conn = psycopg.connect(admin_url, autocommit=True)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ActivitySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        with self._conn as conn:
            while not self._stop.wait(SAMPLE_EVERY):
                rows = conn.execute(
                    """SELECT state, coalesce(wait_event_type || ':' || wait_event, 'CPU')
                       FROM pg_stat_activity
                       WHERE datname = %s AND backend_type = 'client backend'""",
                    (self.dbname,),
                ).fetchall()
                self.backends.append(len(rows))
                self.waits.update(wait for state, wait in rows if state == "active")


def spread_of(
    watch: psycopg.Connection[Any], released: Any
) -> tuple[list[int], tuple[float, float, float], tuple[float, float]]:
    """How the jobs spread: the jobs each worker ran (most first), the seconds from
    ``released`` until 10 %, 50 % and 90 % of them had finished, and a job's seconds from due
    to finished (median, 95th percentile)."""
    per_worker = [
        int(row[0])
        for row in watch.execute(
            "SELECT count(*) FROM embedding_job_attempts WHERE status = 'SUCCEEDED'"
            " GROUP BY worker_id ORDER BY 1 DESC"
        ).fetchall()
    ]
    row = watch.execute(
        "SELECT percentile_cont(ARRAY[0.1, 0.5, 0.9]) WITHIN GROUP"
        " (ORDER BY extract(epoch FROM finished_at - %s))"
        " FROM embedding_jobs WHERE status = 'SUCCEEDED'",
        (released,),
    ).fetchone()
    quantiles = [float(q) for q in (row[0] if row and row[0] else [0.0, 0.0, 0.0])]
    row = watch.execute(
        "SELECT percentile_cont(ARRAY[0.5, 0.95]) WITHIN GROUP"
        " (ORDER BY extract(epoch FROM finished_at - available_at))"
        " FROM embedding_jobs WHERE status = 'SUCCEEDED'"
    ).fetchone()
    latency = [float(q) for q in (row[0] if row and row[0] else [0.0, 0.0])]
    return per_worker, (quantiles[0], quantiles[1], quantiles[2]), (latency[0], latency[1])


def release_jobs(watch: psycopg.Connection[Any], trickle: float | None) -> Any:
    """Make the held-back jobs due, with a NOTIFY: all in one transaction, or with
    ``trickle`` one at a time, that many a second, each in its own; the first one's time."""
    if trickle is None:
        with watch.transaction():
            row = watch.execute(
                "UPDATE embedding_jobs SET available_at = now() WHERE status = 'PENDING'"
                " RETURNING now()"
            ).fetchone()
            watch.execute("NOTIFY trioindex_jobs")
        assert row is not None
        return row[0]
    held = watch.execute(
        "SELECT id FROM embedding_jobs WHERE status = 'PENDING' ORDER BY id"
    ).fetchall()
    began, first = time.monotonic(), None
    for i, (job,) in enumerate(held):
        time.sleep(max(0.0, began + i / trickle - time.monotonic()))
        row = watch.execute(  # one statement a job, its own transaction (``watch`` autocommits)
            """WITH due AS (UPDATE embedding_jobs SET available_at = now() WHERE id = %s
                            RETURNING now() AS at)
               SELECT at, pg_notify('trioindex_jobs', '') FROM due""",
            (job,),
        ).fetchone()
        assert row is not None
        first = row[0] if first is None else first
    return first


def backends_of(watch: psycopg.Connection[Any]) -> int:
    """Client backends of ``watch``'s database, ``watch`` itself left out."""
    return int(
        _one(
            watch,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND backend_type = 'client backend' AND pid <> pg_backend_pid()",
        )
    )


def run_size(
    pg: BenchPostgres,
    source: str,
    root: Path,
    embedder: EmbedServerProcess,
    *,
    n: int,
    jobs: int,
    start_timeout: float,
    series: int = 1,
    bouncer: str | None,
    code: str = "branch",
    pythonpath: str | None = None,
    overrides: dict[str, str] | None = None,
    quiet_idle: float = 0.0,
    trickle: float | None = None,
) -> SizeResult:
    dbname = f"fleet_{code}_{n}"
    admin(pg.admin_url, f'DROP DATABASE IF EXISTS "{dbname}"')
    admin(pg.admin_url, f'CREATE DATABASE "{dbname}" TEMPLATE "{source}"')
    # the copy dirtied every page it wrote: out now, not by a checkpoint during the run
    admin(pg.admin_url, "CHECKPOINT")
    idle_before = wait_for_idle(quiet_idle)
    url = with_dbname(pg.admin_url, dbname)
    settings: dict[str, str] = {"DATABASE_URL": url}
    if bouncer is not None:
        settings = {
            "DATABASE_URL": with_dbname(bouncer, dbname),
            "DATABASE_POOLER": "transaction",
            "DATABASE_DIRECT_URL": url,
        }
    env = worker_env(
        HOME=str(root / "home"),
        STORAGE_URL=(root / "blobs").as_uri(),
        **settings,
        **tei_settings(embedder, DIMENSION),
        **(overrides or {}),
    )
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    watch = psycopg.connect(url, autocommit=True)
    logs = root / f"logs-{code}-{n}"
    logs.mkdir(exist_ok=True)
    load_before = os.getloadavg()[0]
    sampler = ActivitySampler(pg.admin_url, dbname)  # connects now, records once entered
    processes = []
    for i in range(n):
        handle = (logs / f"worker-{i}.log").open("ab")
        processes.append(
            subprocess.Popen(
                [sys.executable, "-m", "trioindex.cli", "worker"],
                env=env,
                stdout=handle,
                stderr=handle,
            )
        )
    try:
        launched = time.monotonic()
        deadline = launched + start_timeout
        started = 0
        while time.monotonic() < deadline:
            started = int(
                _one(watch, "SELECT count(*) FROM indexing_workers WHERE status = 'RUNNING'")
            )
            exited = sum(1 for p in processes if p.poll() is not None)
            if started + exited >= n:  # every process has registered or given up
                break
            time.sleep(0.5)
        start_seconds = time.monotonic() - launched
        time.sleep(3)  # the listeners connect
        idle_at_start = backends_of(watch)
        # the start-up's extra pooled connections close one per database.pool-max-idle
        settle_from = time.monotonic()
        while time.monotonic() - settle_from < SETTLE_LIMIT:
            if backends_of(watch) <= 2 * n:
                break
            time.sleep(0.5)
        settled_after = time.monotonic() - settle_from
        idle = sum(backends_of(watch) for _ in range(3)) / 3
        idle_from, idle_cpu_from = time.monotonic(), processes_cpu(processes)
        time.sleep(IDLE_WINDOW)
        idle_cpu = (processes_cpu(processes) - idle_cpu_from) / (time.monotonic() - idle_from)
        cpu_before = server_cpu_now(pg)
        workers_before = processes_cpu(processes)
        sched_before = main_threads_sched(processes)
        switches_before = machine_context_switches()
        window_from = time.monotonic()
        embedder_before = embedder.cpu_seconds()
        embedder.reset_stats()
        pg.reset_statements()
        with sampler:
            released = release_jobs(watch, trickle)
            finish_deadline = time.monotonic() + 120 + jobs / 5
            while time.monotonic() < finish_deadline:
                done = int(
                    _one(watch, "SELECT count(*) FROM embedding_jobs WHERE status = 'SUCCEEDED'")
                )
                if done >= jobs:
                    break
                time.sleep(0.2)
            cpu_after = server_cpu_now(pg)
            workers_after = processes_cpu(processes)
            sched_after = main_threads_sched(processes)
            switches_after = machine_context_switches()
            window = time.monotonic() - window_from
            embedder_after = embedder.cpu_seconds()
            embedded = embedder.stats()
            load_after = os.getloadavg()[0]
            claims = claim_stats(pg.admin_url, dbname, max(1, done))
            seconds = float(
                _one(
                    watch,
                    "SELECT extract(epoch FROM max(finished_at))::float8 FROM embedding_jobs",
                )
                - released.timestamp()
            )
            spread = spread_of(watch, released)
        samples = sampler.backends or [0]
    finally:
        watch.close()
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    refused = sum(
        1 for log in logs.glob("*.log") if "too many clients" in log.read_text(errors="replace")
    )
    return SizeResult(
        code=code,
        workers=n,
        series=series,
        started=started,
        start_seconds=start_seconds,
        refused_logs=refused,
        jobs=done,
        seconds=seconds,
        idle_at_start_per_worker=idle_at_start / n,
        idle_per_worker=idle / n,
        settled_after=settled_after,
        busy_mean_per_worker=sum(samples) / len(samples) / n,
        busy_peak=max(samples),
        server_cpu_ms_per_job=(cpu_after - cpu_before) * 1000 / max(1, done),
        waits=dict(sampler.waits.most_common(6)),
        load_before=load_before,
        load_after=load_after,
        worker_cpu_ms_per_job=(workers_after - workers_before) * 1000 / max(1, done),
        idle_cpu_ms_per_s_per_worker=idle_cpu * 1000 / n,
        claims=claims,
        main_thread_cpu_ms_per_job=(sched_after[0] - sched_before[0]) * 1000 / max(1, done),
        embedder_cpu_ms_per_job=(embedder_after - embedder_before) * 1000 / max(1, done),
        embed_requests=int(embedded["embed_requests"]),
        embed_texts=int(embedded["inputs"]),
        main_thread_running=(sched_after[0] - sched_before[0]) / n / window,
        main_thread_runnable=(sched_after[1] - sched_before[1]) / n / window,
        jobs_per_worker=spread[0],
        finished_by=spread[1],
        latency=spread[2],
        idle_before=idle_before,
        switches_per_job=(switches_after - switches_before) / max(1, done),
    )


def best_of(
    results: Sequence[SizeResult], rate: str = "jobs_per_s"
) -> dict[tuple[str, int], float]:
    """The best ``rate`` of each code in each series: what a size's "× best" divides by."""
    best: dict[tuple[str, int], float] = {}
    for r in results:
        key = (r.code, r.series)
        best[key] = max(best.get(key, 0.0), getattr(r, rate))
    return {key: value or 1.0 for key, value in best.items()}


def table(results: Sequence[SizeResult]) -> list[str]:
    best = best_of(results)
    lines = [
        "| code | workers | started (s) | jobs | jobs/s | × best | conns/worker 3 s after start"
        " | idle (settled after s) | busy mean | busy peak (all) | PG CPU ms/job"
        " | workers' CPU ms/job | idle before | load before / after"
        " | top wait events of active backends (samples) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in results:
        waits = ", ".join(f"{k} {v}" for k, v in r.waits.items())
        refused = f" (refused in {r.refused_logs})" if r.refused_logs else ""
        lines.append(
            f"| {r.label} | {r.workers} | {r.started} ({r.start_seconds:.0f}){refused}"
            f" | {r.jobs} | {r.jobs_per_s:.0f} | {r.jobs_per_s / best[r.code, r.series]:.2f}"
            f" | {r.idle_at_start_per_worker:.2f}"
            f" | {r.idle_per_worker:.2f} ({r.settled_after:.0f})"
            f" | {r.busy_mean_per_worker:.2f} | {r.busy_peak}"
            f" | {r.server_cpu_ms_per_job:.2f} | {r.worker_cpu_ms_per_job:.1f}"
            f" | {r.idle_before:.0%} | {r.load_before:.1f} / {r.load_after:.1f} | {waits} |"
        )
    return lines


def claim_table(results: Sequence[SizeResult]) -> list[str]:
    """The claims of each size (``pg_stat_statements``, release → last job)."""
    lines = [
        "| code | workers | idle CPU ms/s a worker | claims/job | jobs/claim | buffers/claim"
        " | claim exec ms/job | statements/job | jobs/store | most execution time (ms/job) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        c = r.claims
        top = ", ".join(f"`{head}` {ms:.2f}" for head, ms in c.top.items())
        lines.append(
            f"| {r.label} | {r.workers} | {r.idle_cpu_ms_per_s_per_worker:.1f}"
            f" | {c.calls / max(1, r.jobs):.3f}"
            f" | {c.rows / max(1, c.calls):.1f} | {c.buffers / max(1, c.calls):.0f}"
            f" | {c.total_ms / max(1, r.jobs):.3f} | {c.statements / max(1, r.jobs):.3f}"
            f" | {r.jobs / max(1, c.stores):.1f} | {top} |"
        )
    return lines


def spread_table(results: Sequence[SizeResult]) -> list[str]:
    """How each size's jobs spread over its workers and over time: the steady rate leaves out
    the release's ramp and the tail of the last jobs, which a size's wall rate counts."""
    best = best_of(results, "steady_jobs_per_s")
    lines = [
        "| code | workers | workers that ran jobs | jobs a worker (most / fewest) | 10 % / 50 % / 90 %"
        " / all finished (s) | jobs/s wall | jobs/s steady (10–90 %) | × best steady"
        " | a job's latency, median / p95 (ms) |",
        "|---|---:|---:|---|---|---:|---:|---:|---|",
    ]
    for r in results:
        most = r.jobs_per_worker[0] if r.jobs_per_worker else 0
        fewest = r.jobs_per_worker[-1] if r.jobs_per_worker else 0
        q10, q50, q90 = r.finished_by
        lines.append(
            f"| {r.label} | {r.workers} | {len(r.jobs_per_worker)} | {most} / {fewest}"
            f" | {q10:.2f} / {q50:.2f} / {q90:.2f} / {r.seconds:.2f} | {r.jobs_per_s:.0f}"
            f" | {r.steady_jobs_per_s:.0f} | {r.steady_jobs_per_s / best[r.code, r.series]:.2f}"
            f" | {r.latency[0] * 1000:.0f} / {r.latency[1] * 1000:.0f} |"
        )
    return lines


def cpu_table(results: Sequence[SizeResult], cores: int) -> list[str]:
    """Where each size's CPU went, per job, and the two ceilings it implies: one worker's main
    thread cannot run more than ``1000 / main`` jobs a second (a Python process does its
    Python work on one core at a time), and the machine cannot run more than ``cores × 1000 /
    (workers + PostgreSQL + embedder)`` (every process here shares the same cores)."""
    lines = [
        "| code | workers | jobs/s | main threads' CPU ms/job | workers' CPU ms/job"
        " | PG CPU ms/job | embedder CPU ms/job | embedding requests/job (texts each)"
        " | context switches/job | cores busy | a worker's main thread running / runnable / asleep"
        " | one-process ceiling (jobs/s) | machine ceiling (jobs/s) |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---|---:|---:|",
    ]
    for r in results:
        per_job = r.worker_cpu_ms_per_job + r.server_cpu_ms_per_job + r.embedder_cpu_ms_per_job
        main = r.main_thread_cpu_ms_per_job
        lines.append(
            f"| {r.label} | {r.workers} | {r.jobs_per_s:.0f} | {main:.2f}"
            f" | {r.worker_cpu_ms_per_job:.2f} | {r.server_cpu_ms_per_job:.2f}"
            f" | {r.embedder_cpu_ms_per_job:.2f}"
            f" | {r.embed_requests / max(1, r.jobs):.3f} ({r.embed_texts / max(1, r.embed_requests):.1f})"
            f" | {r.switches_per_job:.1f} | {r.jobs_per_s * per_job / 1000:.2f}"
            f" | {r.main_thread_running:.2f} / {r.main_thread_runnable:.2f}"
            f" / {max(0.0, 1 - r.main_thread_running - r.main_thread_runnable):.2f}"
            f" | {1000 / main if main > 0 else 0:.0f}"
            f" | {cores * 1000 / per_job if per_job > 0 else 0:.0f} |"
        )
    return lines


#: The fleet goal: every size's throughput at least this share of the best size's
GOAL_SHARE = 0.9


def goal_table(results: Sequence[SizeResult]) -> list[str]:
    """Each size's share of its series' best, series by series, and in how many series every
    size reached :data:`GOAL_SHARE` (the fleet goal), per code; then each size's median rate
    over the series and its share of the best median."""
    best = best_of(results)
    series = sorted({r.series for r in results})
    lines = [
        "| code | workers | × best, series "
        + " / ".join(str(k) for k in series)
        + " | lowest | median jobs/s | × best median |",
        "|---|---:|---|---:|---:|---:|",
    ]
    verdicts = []
    for code in dict.fromkeys(r.code for r in results):
        mine = [r for r in results if r.code == code]
        sizes = list(dict.fromkeys(r.workers for r in mine))
        medians = {
            n: statistics.median(r.jobs_per_s for r in mine if r.workers == n) for n in sizes
        }
        best_median = max(medians.values()) or 1.0
        for n in sizes:
            shares = [r.jobs_per_s / best[code, r.series] for r in mine if r.workers == n]
            lines.append(
                f"| {code} | {n} | {' / '.join(f'{x:.3f}' for x in shares)} | {min(shares):.3f}"
                f" | {medians[n]:.0f} | {medians[n] / best_median:.3f} |"
            )
        met = [
            k
            for k in series
            if all(r.jobs_per_s >= GOAL_SHARE * best[code, k] for r in mine if r.series == k)
        ]
        verdicts.append(
            f"- {code}: every size at ≥ {GOAL_SHARE} × its series' best in {len(met)} of"
            f" {len(series)} series: {verdict(len(met) == len(series))}"
        )
        lowest = min(medians.values()) / best_median
        verdicts.append(
            f"- {code}: every size's median over {len(series)} series at ≥ {GOAL_SHARE} × the"
            f" best median (lowest {lowest:.3f}): {verdict(lowest >= GOAL_SHARE)}"
        )
    return [*lines, "", *verdicts]


def raw_table(raws: Sequence[tuple[int, ThroughputResult]]) -> list[str]:
    """The raw loop at each size's number of connections, by series."""
    best: dict[int, float] = {}
    for series, r in raws:
        best[series] = max(best.get(series, 0.0), r.jobs_per_s) or 1.0
    lines = [
        "| series | raw loop connections | jobs/s | × best | PG CPU ms/job | client CPU ms/job"
        " | load before |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for series, r in raws:
        lines.append(
            f"| {series} | {r.scenario.concurrency} | {r.jobs_per_s:.0f}"
            f" | {r.jobs_per_s / best[series]:.2f}"
            f" | {r.server_cpu_ms_per_job:.2f} | {r.client_cpu_ms_per_job:.2f}"
            f" | {r.load_average_1m:.1f} |"
        )
    return lines


def idle_share(seconds: float) -> float:
    """The share of the machine's CPU time (all cores) that was idle over the next
    ``seconds``."""
    before = psutil.cpu_times()._asdict()
    time.sleep(seconds)
    spent: dict[str, float] = {k: v - before[k] for k, v in psutil.cpu_times()._asdict().items()}
    # Linux counts guest time in user time too
    total = sum(spent.values()) - spent.get("guest", 0.0) - spent.get("guest_nice", 0.0)
    return (spent["idle"] + spent.get("iowait", 0.0)) / max(1e-9, total)


def wait_for_idle(share: float, limit: float = QUIET_LIMIT) -> float:
    """Wait until the machine was at least ``share`` idle over :data:`IDLE_PROBE` seconds (at
    most ``limit`` seconds, then a line says so and the size runs anyway); the last share
    measured. Not the load average: that falls for minutes after 64 workers exit, on a machine
    already idle."""
    waited_from = time.monotonic()
    while True:
        idle = idle_share(IDLE_PROBE)
        if idle >= share:
            return idle
        if time.monotonic() - waited_from >= limit:
            print(
                f"the machine was {idle:.0%} idle after {limit:.0f} s; running anyway", flush=True
            )
            return idle


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--sizes", default="1,4,16,64", help="worker counts (1,4,16,64)")
    parser.add_argument("--docs", type=int, default=1000, help="jobs per size (1000)")
    parser.add_argument(
        "--start-timeout", type=float, default=600, help="seconds for N workers to start (600)"
    )
    parser.add_argument(
        "--pgbouncer",
        action="store_true",
        help="workers through PgBouncer (transaction mode), LISTEN on PostgreSQL itself",
    )
    parser.add_argument(
        "--pgbouncer-pool",
        default=None,
        metavar="N[,N...]",
        help="PgBouncer's server connections a database (default_pool_size; 20, its own"
        " default); several sizes run every size once through each, interleaved",
    )
    parser.add_argument(
        "--src",
        default=None,
        help="run this checkout's code from a copy of its src (PYTHONPATH), to edit meanwhile",
    )
    parser.add_argument(
        "--baseline",
        metavar="SRC",
        default=None,
        help="also run every size with PYTHONPATH=SRC (e.g. /work/main/src), interleaved",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a worker setting for every code (TRIOINDEX_ left out, e.g. WORKER_POLLING_INTERVAL=2s)",
    )
    parser.add_argument(
        "--raw",
        action="store_true",
        help="also the raw SKIP LOCKED loop with as many connections as workers, per size",
    )
    parser.add_argument(
        "--no-warm-up",
        action="store_true",
        help="skip the unreported one-worker pass that fills the fake embedder's cache",
    )
    parser.add_argument(
        "--series",
        type=int,
        default=1,
        help="run every size this many times, each series' order rotated by one (1)",
    )
    parser.add_argument(
        "--quiet-idle",
        type=float,
        default=0.9,
        help=f"before each size, wait (at most {QUIET_LIMIT:.0f} s) until the machine's CPU was"
        f" this idle over {IDLE_PROBE:.0f} s (0.9)",
    )
    parser.add_argument(
        "--trickle",
        type=float,
        default=None,
        metavar="RATE",
        help="release the jobs one at a time, RATE a second (default: all at once)",
    )
    parser.add_argument("--quick", action="store_true", help="sizes 1,4 and 100 documents")
    parser.add_argument("--out", type=Path, default=None, help="write the table as JSON here")
    args = parser.parse_args(argv)
    if args.trickle is not None and not args.trickle > 0:
        parser.error(f"--trickle must be a positive rate, not {args.trickle}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = [1, 4] if args.quick else [int(s) for s in args.sizes.split(",")]
    docs = 100 if args.quick else args.docs
    root = Path(tempfile.mkdtemp(prefix="trioindex-bench-fleet-"))
    root.chmod(0o755)
    results: list[SizeResult] = []
    raws: list[tuple[int, ThroughputResult]] = []
    with (
        contextlib.ExitStack() as stack,
        BenchPostgres() as pg,
        EmbedServerProcess(latency_ms=0, dimension=DIMENSION) as embedder,
        pg.fresh_database("fleet_source") as source_url,
    ):
        info = machine_info(pg.admin_url)
        info["max_connections"] = _one(pg.admin_url, "SHOW max_connections")
        cores = int(info.get("usable_cores") or os.cpu_count() or 1)
        write_documents(root / "docs", docs)
        env = worker_env(
            HOME=str(root / "home"),
            DATABASE_URL=source_url,
            STORAGE_URL=(root / "blobs").as_uri(),
            **tei_settings(embedder, DIMENSION),
        )
        created = ingest_folder(env, root / "docs")
        with psycopg.connect(source_url, autocommit=True) as conn:
            conn.execute("UPDATE embedding_jobs SET available_at = now() + interval '1 hour'")
        print(f"{created} documents staged; max_connections {info['max_connections']}", flush=True)
        source = str(conninfo_to_dict(source_url)["dbname"])
        trees: list[tuple[str, str | None]] = [("branch", args.src)]
        if args.baseline is not None:
            trees.append(("baseline", args.baseline))
        # PgBouncer's pool sizes to compare (None: workers connect to PostgreSQL directly)
        pools: list[int | None] = [None]
        if args.pgbouncer:
            pools = [int(n) for n in (args.pgbouncer_pool or "20").split(",")]
            info["pgbouncer_pool"] = pools
        bouncers = {
            n: stack.enter_context(running_pgbouncer(pg.admin_url, pool_size=n))
            for n in pools
            if n is not None
        }
        codes = [
            (tree if len(pools) == 1 else f"{tree}-pool{n}", path, bouncers.get(n))
            for tree, path in trees
            for n in pools
        ]
        overrides = dict(o.split("=", 1) for o in args.overrides)
        if not args.no_warm_up:
            # The fake embedder builds each text's vector once and serves it from its cache
            # after: without this unreported pass, the first size run pays that (0.6 ms of
            # embedder CPU a job on the same cores, ten times what later sizes pay).
            warm = run_size(
                pg,
                source,
                root,
                embedder,
                n=1,
                jobs=created,
                start_timeout=args.start_timeout,
                bouncer=codes[0][2],
                code="warm",
                pythonpath=args.src,
                overrides=overrides,
            )
            admin(pg.admin_url, 'DROP DATABASE IF EXISTS "fleet_warm_1" WITH (FORCE)')
            print(f"warm-up (not reported): embedder {warm.embedder_cpu_ms_per_job:.2f} ms/job")
        for series in range(1, args.series + 1):
            shift = (series - 1) % len(sizes)
            for n in sizes[shift:] + sizes[:shift]:
                turn = (series - 1) % len(codes)  # no code always runs first at a size
                for code, pythonpath, bouncer in codes[turn:] + codes[:turn]:
                    result = run_size(
                        pg,
                        source,
                        root,
                        embedder,
                        n=n,
                        series=series,
                        jobs=created,
                        start_timeout=args.start_timeout,
                        bouncer=bouncer,
                        code=code,
                        pythonpath=pythonpath,
                        overrides=overrides,
                        quiet_idle=args.quiet_idle,
                        trickle=args.trickle,
                    )
                    results.append(result)
                    print(
                        table([result])[-1],
                        claim_table([result])[-1],
                        cpu_table([result], cores)[-1],
                        spread_table([result])[-1],
                        sep="\n",
                        flush=True,
                    )
                    admin(pg.admin_url, f'DROP DATABASE IF EXISTS "fleet_{code}_{n}" WITH (FORCE)')
                if args.raw:
                    raws.append((series, run_raw(pg, Scenario("raw", 1, n), created)))
                    print(raw_table(raws[-1:])[-1], flush=True)
    lines = [*format_machine(info), "", *table(results), "", *claim_table(results)]
    lines += ["", *cpu_table(results, cores), "", *spread_table(results), "", *goal_table(results)]
    if raws:
        lines += ["", *raw_table(raws)]
    print("\n".join(lines))
    if args.out is not None:
        args.out.write_text(
            json.dumps(
                {
                    "machine": info,
                    "results": [attrs.asdict(r) for r in results],
                    "baseline": args.baseline,
                    "overrides": args.overrides,
                    "raw": [{"series": k, **r.as_json()} for k, r in raws],
                },
                indent=2,
                default=str,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
