"""One chaos run, start to end: the dependencies up, the fault phase (kills, outages, faulty
embedding server, ingest waves), the drain, SIGTERM, then every check of
testkit/chaos/checks.py against the database and the logs.

tests/test_chaos_smoke.py runs a short one; ``just chaos`` (bench/chaos.py) runs the full ones
and writes the report.
"""

from __future__ import annotations

import contextlib
import json
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import attrs

from testkit.chaos.checks import run_checks
from testkit.chaos.corpus import make_corpus
from testkit.chaos.evidence import Check, Observed, Stored
from testkit.chaos.faults import Outages, RecordingEmbedServer, ToggleProxy
from testkit.chaos.fleet import Fleet, Ingestor, IngestWave, WorkerProcess
from testkit.chaos.plan import (
    DIMENSION,
    HANG_SECONDS,
    KILL_EVERY,
    SHUTDOWN_GRACE,
    WORKER_ENV,
    WORKERS,
    Options,
)
from testkit.claim_tokens import install_token_trap
from testkit.postgres import EmbeddedServer, admin
from testkit.processes import (
    REPO_ROOT,
    base_env,
    free_port,
    stop_process,
    try_query,
    wait_for_port,
)
from trioindex.db.migrations import migrate
from trioindex.db.pool import with_dbname


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def new_run_folder() -> Path:
    # mode 755: the embedded PostgreSQL server may run as its own user and must enter it
    folder = Path(tempfile.mkdtemp(prefix="trioindex-chaos-"))
    folder.chmod(0o755)
    return folder


def start_database(home: Path) -> tuple[EmbeddedServer, str]:
    """An embedded PostgreSQL in ``home`` (mode 755: the server may run as its own user) and
    its one migrated database, with the claim-token trap; the server and the database URL."""
    home.mkdir(parents=True)
    home.chmod(0o755)
    pg = EmbeddedServer.start(home)
    admin(pg.admin_url, "CREATE DATABASE chaos")
    url = with_dbname(pg.admin_url, "chaos")
    migrate(url)
    install_token_trap(url)
    return pg, url


@attrs.define(eq=False)
class Timeline:
    clock: Callable[[], float]
    entries: list[dict[str, Any]] = attrs.Factory(list)

    def note(self, event: str, **extra: Any) -> None:
        self.entries.append({"t": round(self.clock(), 2), "event": event, **extra})


@attrs.define(eq=False)
class RunResult:
    number: int
    seed: int
    passed: bool
    checks: list[Check]
    counts: dict[str, Any]
    payload: dict[str, Any]
    run_dir: Path


def run_once(
    options: Options,
    number: int,
    run_dir: Path,
    command: str,
    describe_machine: Callable[[str], dict[str, Any]] | None = None,
) -> RunResult:
    """One run in ``run_dir`` (its logs stay there); ``describe_machine(admin_url)`` fills the
    payload's ``machine`` (the benchmark's machine block; empty without it)."""
    rng = random.Random(options.seed)
    tag = f"{rng.getrandbits(16):04x}"
    logs = run_dir / "logs"  # everything the product wrote: scanned at the end
    infra = run_dir / "infra"  # moto's log
    corpus_dir = run_dir / "corpus"
    for folder in (logs, infra, corpus_dir):
        folder.mkdir(parents=True)
    corpus = make_corpus(corpus_dir, options.documents, rng, tag, waves=len(options.waves))
    run_began = began = time.monotonic()

    def clock() -> float:
        """Seconds since the fault phase began (since the run began, until then)."""
        return time.monotonic() - began

    timeline = Timeline(clock)
    secret = f"chaos-secret-{rng.getrandbits(64):016x}"
    duration = options.duration
    with contextlib.ExitStack() as stack:
        pg, url = start_database(run_dir / "pg")
        stack.callback(pg.close, remove=False)
        machine = describe_machine(pg.admin_url) if describe_machine is not None else {}

        moto_port = free_port()
        moto_log = (infra / "moto.log").open("wb")
        stack.callback(moto_log.close)
        moto = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(moto_port)],
            stdout=moto_log,
            stderr=moto_log,
            cwd=run_dir,
        )
        stack.callback(stop_process, moto)
        wait_for_port(moto_port, moto, 60, "moto's S3 server")
        proxy = ToggleProxy(("127.0.0.1", moto_port))
        proxy.start()
        stack.callback(proxy.stop)

        embed = RecordingEmbedServer(dimension=DIMENSION, hang_seconds=HANG_SECONDS)
        embed.start()
        stack.callback(embed.stop)

        env = base_env(
            TRIOINDEX_HOME=str(run_dir / "home"),
            TRIOINDEX_DATABASE_URL=url,
            TRIOINDEX_STORAGE_URL=f"s3://chaos:{secret}@127.0.0.1:{proxy.port}/chaos?secure=false",
            TRIOINDEX_EMBEDDING_URL=embed.url,
            **WORKER_ENV,
        )
        fleet = Fleet(env, logs, clock)
        stack.callback(fleet.kill_all)
        ingestor = Ingestor(
            env,
            logs,
            [
                IngestWave(i, corpus_dir / f"wave-{i}", at * duration)
                for i, at in enumerate(options.waves)
                if (corpus_dir / f"wave-{i}").exists()
            ],
        )
        stack.callback(ingestor.kill)

        outages = Outages(duration, proxy, pg, url, clock, timeline.note)

        kills = 0
        restarts_due: list[float] = []
        exits: list[WorkerProcess] = []

        def supervise(now: float) -> None:
            for process in fleet.reap():
                exits.append(process)
                timeline.note(
                    "worker exited on its own", worker=process.number, status=process.returncode
                )
                restarts_due.append(now + 1.0)  # like a container restart policy, with a pause
            for due in [d for d in restarts_due if d <= now]:
                restarts_due.remove(due)
                started = fleet.start_one()
                timeline.note("worker restarted", worker=started.number)
            for note in ingestor.tick(now):
                timeline.note(note)
            sample_lease_lag(now)

        # The longest any job was seen PROCESSING past its lease during the run: how long lease
        # recovery took to notice (a figure for the report; the end state is a check).
        lease_lag = {"max_s": 0.0, "next": 0.0}

        def sample_lease_lag(now: float) -> None:
            if now < lease_lag["next"]:
                return
            lease_lag["next"] = now + 1.0
            rows = try_query(
                url,
                """SELECT coalesce(max(extract(epoch FROM clock_timestamp() - lease_expires_at)),
                                   0)::float AS lag
                   FROM embedding_jobs WHERE status = 'PROCESSING'""",
            )
            if rows is not None:
                lease_lag["max_s"] = max(lease_lag["max_s"], float(rows[0]["lag"]))

        def progress(now: float, phase: str) -> None:
            rows = try_query(
                url, "SELECT status, count(*) AS n FROM embedding_jobs GROUP BY status"
            )
            jobs = (
                "database down"
                if rows is None
                else " ".join(
                    f"{r['status']} {r['n']}" for r in sorted(rows, key=lambda r: str(r["status"]))
                )
            )
            print(
                f"  [{phase} {now:5.0f}s] jobs: {jobs or 'none yet'}; kills {kills}; "
                f"workers {len(fleet.live())}",
                flush=True,
            )

        # -- the fault phase --------------------------------------------------------------------
        print(f"run {number}: seed {options.seed}, {len(corpus)} documents, run folder {run_dir}")
        began = time.monotonic()
        phase_began_utc = utc_now()
        embed.set_fault_rates(options.fault_rates, seed=options.seed)
        for _ in range(WORKERS):
            fleet.start_one()
        timeline.note("fault phase begins", workers=WORKERS)
        next_kill = rng.uniform(*KILL_EVERY)
        next_progress = 10.0
        while (now := clock()) < duration:
            outages.tick(now)
            if now >= next_kill:
                live = fleet.live()
                if live:
                    victim = rng.choice(live)
                    fleet.kill(victim)
                    kills += 1
                    replacement = fleet.start_one()
                    timeline.note("kill -9", worker=victim.number, replacement=replacement.number)
                next_kill = now + rng.uniform(*KILL_EVERY)
            supervise(now)
            if now >= next_progress:
                progress(now, "faults")
                next_progress += 10.0
            time.sleep(0.05)
        outages.tick(clock(), final=True)
        if not options.faults_in_drain:
            embed.set_fault_rates({})
        faults_until = clock()
        timeline.note("fault phase ends")

        # -- the drain --------------------------------------------------------------------------
        drain_began = clock()
        drained = False
        next_progress = drain_began + 10.0
        while (now := clock()) - drain_began < options.drain_timeout:
            supervise(now)
            if ingestor.idle:
                rows = try_query(
                    url,
                    """SELECT count(*) AS jobs,
                              count(*) FILTER (WHERE status IN ('PENDING', 'PROCESSING')) AS open
                       FROM embedding_jobs""",
                )
                if rows is not None and rows[0]["open"] == 0 and rows[0]["jobs"] == len(corpus):
                    drained = True
                    break
            if now >= next_progress:
                progress(now, "drain")
                next_progress += 10.0
            time.sleep(0.2)
        drain_seconds = clock() - drain_began
        timeline.note("drained" if drained else "drain timed out", seconds=round(drain_seconds, 1))

        # SIGTERM is meant for running workers: one still starting (no signal handler yet)
        # would die of it before registering, which says nothing about graceful shutdown
        unregistered = fleet.wait_registered(timeout=60.0)
        fleet.stop_all(timeout=SHUTDOWN_GRACE + 20.0)
        timeline.note("workers stopped with SIGTERM")
        status = subprocess.run(
            [sys.executable, "-m", "trioindex.cli", "status", "--json"],
            env=env,
            capture_output=True,
            cwd=REPO_ROOT,
            timeout=120,
            check=False,
        )
        (logs / "status.out").write_bytes(status.stdout)
        (logs / "status.log").write_bytes(status.stderr)
        status_json: dict[str, Any] = json.loads(status.stdout) if status.returncode == 0 else {}

        seen = Observed(
            corpus=corpus,
            tag=tag,
            secret=secret,
            logs=logs,
            fleet=fleet,
            exits=exits,
            unregistered=unregistered,
            ingestor=ingestor,
            drained=drained,
            vector_faults=embed.vector_faults(),
            server=embed.stats(),
            fault_rates=options.fault_rates,
            outages=outages.happened,
            storage_resets=proxy.reset_open + proxy.reset_new,
        )
        checks, counts = run_checks(seen, Stored.load(url))
        counts.update(
            fault_phase_s=round(faults_until, 1),
            drain_s=round(drain_seconds, 1),
            outages={
                what: [round(start, 1), round(end, 1)] for what, start, end in outages.happened
            },
            max_processing_past_lease_s=round(lease_lag["max_s"], 1),
        )
        elapsed = time.monotonic() - run_began

    passed = all(check.ok for check in checks)
    payload: dict[str, Any] = {
        "benchmark": "chaos",
        "run": number,
        "date": utc_now(),
        "command": command,
        "seed": options.seed,
        "passed": passed,
        "runtime_s": round(elapsed, 1),
        "fault_phase_began": phase_began_utc,  # timeline times count from here
        "machine": machine,
        "options": {
            "duration_s": duration,
            "documents": options.documents,
            "drain_timeout_s": options.drain_timeout,
            "workers": WORKERS,
            "kill_every_s": list(KILL_EVERY),
            "fault_rates": options.fault_rates,
            "waves": list(options.waves),
            "worker_settings": WORKER_ENV,
        },
        "counts": counts,
        "checks": [attrs.asdict(c) for c in checks],
        "status_cli": status_json,
        "timeline": timeline.entries,
        "run_dir": str(run_dir),
    }
    return RunResult(number, options.seed, passed, checks, counts, payload, run_dir)
