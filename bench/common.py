"""Shared benchmark utilities: the machine, a throwaway PostgreSQL, counters, and result files.

Owns:

* :func:`machine_info` — CPU model, cores, RAM, OS, Python, PostgreSQL version and the
  settings that decide commit cost, git commit — printed and stored with every result;
* :class:`BenchPostgres` — testkit's throwaway PostgreSQL 18 + pgvector with
  ``pg_stat_statements`` loaded, a migrated template, and a fresh database per scenario
  (``CREATE DATABASE ... TEMPLATE``) dropped afterwards. Durability settings stay at the
  server defaults (``fsync``, ``synchronous_commit`` on): the figures are meant to show what a
  commit really costs, since transactions per job is what the benchmarks compare;
* :class:`DbCounters` — ``xact_commit``, WAL position and statement counts of one database,
  read after every other session has gone so their statistics are flushed;
* :func:`percentiles`, :func:`peak_rss_mb`;
* the report: :func:`page_head`, :func:`markdown_table`, :func:`machine_lines`, and the
  one plot helper :func:`plot_panels` (grouped bars and lines, :class:`Panel`) over
  :func:`figure` / :func:`save_figure`;
* :class:`Session` — one invocation's command line, output folder (``--out``; a temporary
  folder with ``--quick``) and result files: NAME.json, NAME.png, NAME.md.

Benchmarks are scripts, not tests: they may block and sleep (in the main thread or their own
threads), and they print what they measure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import re
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np
import psutil  # type: ignore[import-untyped]
import psycopg

from testkit.postgres import EmbeddedServer, admin, create_template, fresh_database

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

    def git(*args: str) -> str:
        command = ["git", *args]
        return subprocess.run(
            command, cwd=REPO_ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        head, dirty = git("rev-parse", "--short", "HEAD"), git("status", "--porcelain", "-uno")
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
    _server: EmbeddedServer | None = None
    _template: str = ""

    def __enter__(self) -> BenchPostgres:
        # the server runs as its own user when we are root: it must be able to enter the folder
        self.home.chmod(0o755)
        self._server = EmbeddedServer.start(self.home)
        self.admin_url = self._server.admin_url
        self._load_stat_statements(self._server)
        self._template = create_template(self.admin_url, "bench_tpl")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()

    def _load_stat_statements(self, server: EmbeddedServer) -> None:
        """Preload ``pg_stat_statements`` (a restart): it counts the statements per job.

        It tracks top-level statements only (the default), so a count is a client round trip;
        statements run inside triggers and functions are part of their caller's time.
        """
        self._admin("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
        server.restart()
        self._admin("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")

    def _admin(self, sql: str, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        return admin(self.admin_url, sql, params)

    def fresh_database(self, prefix: str) -> contextlib.AbstractContextManager[str]:
        """A new migrated database (its URL), dropped when the block ends."""
        return fresh_database(self.admin_url, prefix, self._template)

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

    def count_every_statement(self, url: str) -> None:
        """From here on, count every statement (nested ones too: slower) and function, and
        ``url``'s table, WAL and statement statistics from zero."""
        for sql in (
            "ALTER SYSTEM SET track_functions = 'all'",
            "ALTER SYSTEM SET pg_stat_statements.track = 'all'",
            "SELECT pg_reload_conf()",
            "SELECT pg_stat_reset_shared('wal')",
        ):
            self._admin(sql)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT pg_stat_reset()")
        self.reset_statements()

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


def run_child_in_tree(module: str, tree: Path | None, *options: str) -> str:
    """The standard output of ``python -m module --child OPTIONS`` in a fresh interpreter that
    runs ``tree``'s code (its ``src`` first on ``PYTHONPATH``; this checkout's when None), for
    benchmarks that compare two trees round by round; a failing child stops the benchmark with
    what it said."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str((tree or REPO_ROOT) / "src"), str(REPO_ROOT)])
    done = subprocess.run(
        [sys.executable, "-m", module, "--child", *options],
        check=False,
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(done.stderr or done.stdout)
    return done.stdout


def add_tree_options(parser: argparse.ArgumentParser, rounds: int) -> None:
    """The options of a benchmark that compares this tree's code with another's, round by
    round, each round in fresh interpreters (:func:`run_child_in_tree`): ``--rounds``,
    ``--baseline-tree DIR`` and the hidden ``--child`` those interpreters are run with."""
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--baseline-tree", type=Path, default=None, metavar="DIR")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)


def compared_trees(args: argparse.Namespace) -> list[tuple[str, Path | None]]:
    """The trees each round runs, by name: ``baseline`` first when ``--baseline-tree`` is
    given, then ``this tree`` (None: this checkout's code)."""
    trees: list[tuple[str, Path | None]] = [("this tree", None)]
    if args.baseline_tree is not None:
        trees.insert(0, ("baseline", args.baseline_tree))
    return trees


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def write_json(path: Path, payload: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, sort_keys=False, default=str) + "\n")
    return path


@contextlib.contextmanager
def figure(rows: int, cols: int, size: tuple[float, float], **options: Any) -> Iterator[Any]:
    """A matplotlib figure (Agg, no display) and its axes; laid out and closed after the block.
    Save it with :func:`save_figure` inside the block."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(rows, cols, figsize=size, **options)
    try:
        yield fig, axes
    finally:
        plt.close(fig)


def save_figure(figure: Figure, path: Path) -> Path:
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120, bbox_inches="tight")
    return path


def markdown_table(
    columns: Sequence[str], rows: Iterable[Sequence[str]], align: str = ""
) -> list[str]:
    """A Markdown table; ``align`` has one letter per column, ``l`` or ``r`` (default: the
    first column left, the others right)."""
    align = align or "l" + "r" * (len(columns) - 1)
    rule = "".join("---:|" if a == "r" else "---|" for a in align)
    lines = ["| " + " | ".join(columns) + " |", "|" + rule]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def column_table(
    columns: Sequence[tuple[str, Callable[[Any], str]]], items: Iterable[Any], align: str = ""
) -> list[str]:
    """A Markdown table with a row per item; a column is its header and how it shows an item."""
    rows = [[show(item) for _, show in columns] for item in items]
    return markdown_table([header for header, _ in columns], rows, align)


def machine_lines(machine: dict[str, Any]) -> list[str]:
    """The report's machine block, a Markdown list."""
    return [f"- {line}" for line in format_machine(machine)]


def page_head(
    title: str,
    date: str,
    command: str,
    elapsed: float,
    machine: dict[str, Any],
    *,
    about: str = "",
) -> list[str]:
    """A report's first lines: title, date, command, the machine block and, from ``about`` (the
    benchmark module's docstring, its one description of the method), "What is measured"."""
    lines = [
        f"# {title}",
        "",
        f"- Date: {date}",
        f"- Command: `{command}` (from the repository root; {elapsed:.0f} s)",
        *machine_lines(machine),
        "",
    ]
    if about:
        text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", about.strip()).replace("``", "`")
        lines += ["## What is measured", "", *text.splitlines(), ""]
    return lines


def verdict(met: bool) -> str:
    """How a report names a target's outcome."""
    return "met" if met else "**not met**"


@attrs.frozen
class Panel:
    """One chart of a figure: grouped ``bars`` (series → one value per ``groups`` entry, with
    an optional ``notes`` text above each group's last bar) and/or ``lines`` (series → x, y)."""

    title: str
    ylabel: str
    xlabel: str = ""
    groups: Sequence[str] = ()
    bars: dict[str, Sequence[float]] = attrs.Factory(dict)
    notes: Sequence[str] = ()
    lines: dict[str, tuple[Sequence[float], Sequence[float]]] = attrs.Factory(dict)
    hline: tuple[float, str] | None = None
    log: bool = False


_GREYS_THEN_BLUE = ("#cccccc", "#888888", "#1f77b4", "#ff7f0e")


def cdf(values: Sequence[float]) -> tuple[Sequence[float], Sequence[float]]:
    """Sorted values and the fraction of values at or below each: a line for :class:`Panel`."""
    ordered = sorted(values)
    return ordered, [(i + 1) / len(ordered) for i in range(len(ordered))]


def plot_panels(path: Path, panels: Sequence[Panel], size: tuple[float, float]) -> Path:
    """The report's figure: ``panels`` side by side, saved as ``path``."""
    with figure(1, len(panels), size, squeeze=False) as (fig, axes):
        for ax, panel in zip(axes[0], panels, strict=True):
            width = 0.8 / max(len(panel.bars), 1)
            x = np.arange(len(panel.groups))
            for i, (label, values) in enumerate(panel.bars.items()):
                offset = (i - (len(panel.bars) - 1) / 2) * width
                colour = _GREYS_THEN_BLUE[i + max(0, 3 - len(panel.bars))]
                ax.bar(x + offset, values, width, label=label, color=colour)
                if i == len(panel.bars) - 1:
                    for xi, value, note in zip(x, values, panel.notes, strict=False):
                        ax.text(xi + offset, value, note, ha="center", va="bottom", fontsize=8)
            if panel.groups:
                ax.set_xticks(x, panel.groups, rotation=15, ha="right", fontsize=8)
            for label, (xs, ys) in panel.lines.items():
                ax.plot(xs, ys, label=label)
            if panel.hline is not None:
                ax.axhline(panel.hline[0], color="#d62728", linestyle=":", label=panel.hline[1])
            if panel.log:
                ax.set_yscale("log")
            ax.set(title=panel.title, xlabel=panel.xlabel, ylabel=panel.ylabel)
            ax.title.set_fontsize(10)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        return save_figure(fig, path)


# ---------------------------------------------------------------------------------------------
# a benchmark run: command line, output folder, result files


def bench_parser(name: str, description: str, quick_help: str) -> argparse.ArgumentParser:
    """``python -m bench.NAME`` with the options every benchmark has: ``--quick`` and ``--out``."""
    result = argparse.ArgumentParser(prog=f"python -m bench.{name}", description=description)
    result.add_argument("--quick", action="store_true", help=quick_help)
    return result


def add_out(parser: argparse.ArgumentParser, name: str) -> None:
    """``--out``, added last so ``--help`` lists it after the benchmark's own options."""
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"folder for {name}.json/.png/.md (default docs/test-results; --quick: a temp folder)",
    )


@attrs.define(eq=False)
class Session:
    """One benchmark invocation: where its files go, its command line, when it began."""

    name: str
    out: Path
    command: str
    began: float = attrs.Factory(time.monotonic)

    @classmethod
    def start(cls, name: str, args: argparse.Namespace) -> Session:
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
        # the local model must never be fetched during a measurement
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        out: Path = args.out or (
            Path(tempfile.mkdtemp(prefix=f"trioindex-bench-{name}-")) if args.quick else RESULTS_DIR
        )
        command = shlex.join([".venv/bin/python", "-m", f"bench.{name}", *sys.argv[1:]])
        return cls(name, out, command)

    def publish(
        self,
        machine: dict[str, Any],
        figures: dict[str, Any],
        plot: Callable[[Path], Path],
        markdown: Callable[[str, float, str], str],
    ) -> int:
        """Write NAME.json (the run's header, then ``figures``), NAME.png (``plot(path)``) and
        NAME.md (``markdown(date, elapsed, png_name)``); say where they went."""
        date = utc_now()
        elapsed = time.monotonic() - self.began
        payload = {
            "benchmark": self.name,
            "date": date,
            "command": self.command,
            "runtime_s": round(elapsed, 1),
            "machine": machine,
            **figures,
        }
        json_path = write_json(self.out / f"{self.name}.json", payload)
        png_path = plot(self.out / f"{self.name}.png")
        md_path = self.out / f"{self.name}.md"
        md_path.write_text(markdown(date, elapsed, png_path.name))
        print(f"wrote {json_path}, {png_path}, {md_path} in {elapsed:.0f}s")
        return 0


def warm_pool(connection: Callable[[], contextlib.AbstractContextManager[object]], n: int) -> None:
    """Hold ``n`` connections of a pool (``Database.connection``) at once, so the pool has grown
    to full size before a measurement starts."""
    with contextlib.ExitStack() as stack:
        for _ in range(n):
            stack.enter_context(connection())
