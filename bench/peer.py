"""Peer benchmark: trioindex next to pgai's vectorizer worker on pgai's own workload.

Both systems index the same texts (``N`` documents of 600 characters, one chunk each, 768
dimensions) against the same OpenAI-compatible mock (``testkit.embed_server`` in its own
process, answering every request after a fixed 50 ms; every text is asked for once before the
first run, so no run pays the mock's first encoding of a vector: ``warm_mock``), each in a
fresh database of the same embedded PostgreSQL + pgvector. Runs are interleaved in one
invocation (trioindex, pgai ``-c 8``, pgai ``-c 4``, then again), so machine noise falls on
both.

* **trioindex**: the texts are written as ``.txt`` files and enqueued with ``ingest`` (its rate
  is reported on its own, not counted), then ``trioindex worker --drain`` runs with default
  settings — only the embedder (``openai``, the mock's URL, model and dimension), the database
  and a folder store are configured.
* **trioindex, index-min-vectors 0**: the same, with the model's HNSW index built before the
  first vector and maintained row by row (what every model had before the threshold; the
  default, 10,000, leaves these 2,000 vectors to exact search). Both rows report recall@10 of
  the vector ranking against exact cosine top 10 (50 queries: stored vectors plus noise).
  ``--defaults-only`` leaves this row out (at 20,000 documents it is the longest run by far).
* **pgai** 0.12.1 (installed into its own virtual environment under ``~/.cache``: the worker
  needs only its OpenAI embedder, not the 6 GB of parsers of its ``vectorizer-worker`` extra):
  ``pgai install``, a table with the texts, ``ai.create_vectorizer`` (column loading, the
  default recursive splitter, ``ai.embedding_openai`` pointed at the mock, batch size 50, no
  index, no scheduling), then ``pgai vectorizer worker --once -c C``.

Figures: chunks/s *steady* (the middle 80 % of rows by write time: both destination tables get
the same extra column, ``DEFAULT clock_timestamp()``) and *wall* (worker process start to exit); CPU ms per chunk of the worker process (and
its children), of PostgreSQL (the postmaster and every backend it reaped) and of the mock
(its process: it shares the machine's cores, and its CPU grows with the requests); transactions per
chunk (``pg_stat_database.xact_commit``); requests per chunk and the mean request batch, counted
at the mock. Each run's *timeline* (printed with its figures, kept in the JSON) says when, in
seconds after the worker process started, its log said each step (services open, registered,
first job, index build, queue drained, stopped: :data:`TIMELINE_MARKS`; and when an index build
the worker left to PostgreSQL ended after its exit, which the figures wait for, its CPU
included in PostgreSQL's), when its first, 10th
and 90th percentile and last rows were written, and when it exited: the wall time outside the
steady window, by step; and its *tenths*, the rows per second within each tenth of the rows by
write time (kept in the JSON): how much of the steady window is still start or end. Both systems run with their modules compiled to bytecode
(:func:`compile_bytecode`).

Run ``.venv/bin/python -m bench.peer`` (``just bench-peer``); ``--quick`` runs 500 documents once
each and writes to a temporary folder. ``--baseline-tree DIR`` also runs trioindex from another
source tree in every round, just before this tree's run (its ``src`` on ``PYTHONPATH``; main's:
``git archive main | tar -x -C DIR``): a change against its base in one invocation.
``--variant KEY=VALUE[,KEY=VALUE...]`` (repeatable) also runs trioindex with those settings
(names of ``TRIOINDEX_*`` variables without the prefix, e.g.
``EMBEDDING_MAX_IN_FLIGHT=16,WORKER_MAX_CONCURRENCY=512``) in every round, each just after the
defaults' run: other settings against the defaults in one invocation.

``--profile`` runs trioindex once (``--docs``, default 2000) with ``pg_stat_statements`` counting
nested statements and ``track_functions = all``, and prints where PostgreSQL's time goes (each
statement's execution ms per document and share, each function's self time, HOT updates, WAL
bytes and events per document); with ``py-spy`` in the virtual environment the worker runs under
``py-spy record --gil`` and its raw stacks are kept (the path is printed). Nothing is written to
the page (docs/test-results/peer.md, "Where the CPU goes", says how its figures were read).

``--ingest N`` measures ``ingest`` alone instead: ``N`` small files (600 characters) into a fresh
database, then the same folder again (every file unchanged); files/s, CPU ms per file of the
ingesting process and of PostgreSQL, transactions per file. It rewrites the page's "Ingest"
section only (a full run keeps that section).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import httpx
import numpy as np
import psutil  # type: ignore[import-untyped]
import psycopg

from bench.common import (
    REPO_ROOT,
    BenchPostgres,
    Session,
    add_out,
    bench_parser,
    column_table,
    cpu_seconds,
    figure,
    machine_info,
    page_head,
    save_figure,
    utc_now,
)
from bench.harness import chunk_texts, ingest_folder, log_tail, worker_env
from testkit.embed_process import EmbedServerProcess
from testkit.postgres import admin

DIMENSION = 768
LATENCY_MS = 50.0
CHARACTERS = 600
MODEL = "text-embedding-3-small"
PGAI = "pgai==0.12.1"
# What pgai's OpenAI embedder and column loading import (see pgai/vectorizer/embedders/openai.py).
PGAI_NEEDS = (
    PGAI,
    "openai>=1.44,<2",
    "tiktoken>=0.7,<1",
    "pgvector>=0.3,<1",
    "langchain-text-splitters>=0.2,<1",
    "exceptiongroup>=1,<2",
    "ijson>=3.3",
    "filetype==1.2.0",
    "tokenizers",  # imported by its voyageai embedder at import time
    "numpy",
)
# (a folder of its own since its modules are compiled to bytecode: the one before was not)
PGAI_HOME = Path.home() / ".cache" / "trioindex-bench" / "pgai-0.12.1-bytecode"


@attrs.frozen
class Run:
    system: str
    label: str
    chunks: int
    wall_s: float
    steady_per_s: float
    worker_cpu_s: float
    db_cpu_s: float
    xacts: int
    requests: int
    inputs: int
    ingest_per_s: float | None = None
    embedder_cpu_s: float | None = None
    recall_at_10: float | None = None
    timeline: dict[str, float] = attrs.field(factory=dict)
    tenths: tuple[float, ...] = ()  # rows/s in each tenth of the rows (rates_by_tenth)

    @property
    def wall_per_s(self) -> float:
        return self.chunks / self.wall_s

    def per_chunk(self, value: float) -> float:
        return value / max(self.chunks, 1)

    def as_json(self) -> dict[str, Any]:
        return {
            **attrs.asdict(self),
            "wall_per_s": round(self.wall_per_s, 1),
            "cpu_ms_per_chunk": round(self.per_chunk(self.worker_cpu_s + self.db_cpu_s) * 1e3, 3),
            "mean_batch": round(self.inputs / max(self.requests, 1), 1),
        }


WRITTEN_AT = "bench_written_at"


def watch_writes(url: str, table: str) -> None:
    """Give ``table`` a column stamped with the clock at each row's insert (both systems' tables
    get the same one), so the steady rate comes from the rows themselves."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            f"ALTER TABLE {table} ADD COLUMN {WRITTEN_AT} timestamptz DEFAULT clock_timestamp()"
        )


def written_times(url: str, table: str) -> list[float]:
    """Each row's write time (epoch seconds), in order."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            f"SELECT extract(epoch FROM {WRITTEN_AT})::float8 FROM {table} ORDER BY 1"
        ).fetchall()
    return [row[0] for row in rows]


def rate_between(times: Sequence[float], low: int, high: int) -> float:
    """Rows per second from row ``low`` to row ``high`` (indexes into sorted write times)."""
    if high <= low or times[high] <= times[low]:
        return float("nan")
    return float((high - low) / (times[high] - times[low]))


def steady_rate(times: Sequence[float]) -> float:
    """Rows per second over the middle 80 % of the rows, by write time."""
    return rate_between(times, int(len(times) * 0.1), int(len(times) * 0.9) - 1)


def rates_by_tenth(times: Sequence[float]) -> tuple[float, ...]:
    """Rows per second within each tenth of the rows, by write time: where the steady window
    (tenths 2-9) is slower than the run's middle, its start or its end is still in it."""
    n = len(times)
    if n < 20:
        return ()
    return tuple(
        round(rate_between(times, n * i // 10, min(n * (i + 1) // 10, n - 1)), 1) for i in range(10)
    )


def process_tree_cpu(process: psutil.Process) -> float:
    """CPU seconds of a live process and its live children."""
    total = 0.0
    for p in [process, *process.children(recursive=True)]:
        try:
            times = p.cpu_times()
            total += times.user + times.system + times.children_user + times.children_system
        except psutil.Error:
            pass
    return total


# The line measure() adds when a build the worker left to PostgreSQL ends after its exit.
BUILD_ENDED = "bench: the index build left to PostgreSQL ended"

# What a trioindex worker's log lines say, in the order a drain run says them: the timeline's
# marks (the first line matching each pattern).
TIMELINE_MARKS = (
    ("services open", "trioindex.services: database:"),
    ("registered", " registered (max-concurrency"),
    ("ready", " ready: waiting for jobs"),
    ("first job done", "': succeeded"),
    ("index build due", "HNSW index due"),
    ("index build starts", "building the vector index"),
    ("queue drained", ": queue drained"),
    ("index built", "HNSW index built"),
    ("index build handed off", "HNSW index build handed to PostgreSQL"),
    ("stopped", " stopped; counters"),
    ("index build ended (server)", BUILD_ENDED),
)


@attrs.frozen
class Measured:
    """One worker process run to its end: wall seconds, CPU seconds of it and its children,
    its start on the epoch clock, and when (seconds after its start) each line was read."""

    wall_s: float
    cpu_s: float
    started_at: float
    lines: tuple[tuple[float, str], ...]

    def marks(self) -> dict[str, float]:
        """Seconds after start of each :data:`TIMELINE_MARKS` line seen."""
        found: dict[str, float] = {}
        for name, needle in TIMELINE_MARKS:
            for at, line in self.lines:
                if needle in line:
                    found[name] = at
                    break
        return found


def run_measured(args: Sequence[str], env: dict[str, str], log: Path, limit_s: float) -> Measured:
    """Run a worker command to its end, its output read line by line as it comes (each line
    stamped with the seconds since the start, in ``log`` too)."""
    started_at, began = time.time(), time.monotonic()
    process = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines: list[tuple[float, str]] = []

    def read() -> None:
        assert process.stdout is not None
        with log.open("a") as out:
            for raw in process.stdout:
                at = time.monotonic() - began
                line = raw.decode(errors="replace").rstrip("\n")
                lines.append((at, line))
                out.write(f"{at:9.3f} {line}\n")

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    watched = psutil.Process(process.pid)
    cpu = 0.0
    while process.poll() is None:
        cpu = max(cpu, process_tree_cpu(watched))
        time.sleep(0.05)
    wall = time.monotonic() - began
    reader.join(10)
    if process.returncode != 0:
        raise RuntimeError(f"{args[0]} exited {process.returncode}:\n{log_tail(log)}")
    # the last sample misses at most 50 ms of the process itself; children reaped by it count
    return Measured(wall, cpu, started_at, tuple(lines))


def warm_mock(server: EmbedServerProcess, texts: Sequence[str]) -> None:
    """Ask the mock for every text once before any run. It caches the JSON of each text's
    vector (``testkit.embed_server.VECTOR_CACHE_TEXTS``, 32,768 of them): a text's first
    answer costs it ~0.4 ms of CPU on these two shared cores, a later one nothing. Without this, whichever run came first (trioindex, in round
    one) shared the machine with that work; the requests are not counted (``measure`` resets
    the mock's figures)."""
    with httpx.Client(timeout=60) as client:
        for start in range(0, len(texts), 100):
            for encoding in ("float", "base64"):  # the mock caches each format apart
                answer = client.post(
                    f"{server.url}/v1/embeddings",
                    json={
                        "model": MODEL,
                        "input": list(texts[start : start + 100]),
                        "encoding_format": encoding,
                    },
                )
                answer.raise_for_status()


Figures = tuple[Measured, float, int, int, int, float]


def measure(pg: BenchPostgres, url: str, server: EmbedServerProcess, work: Any) -> Figures:
    """Run ``work()`` (a :class:`Measured`); returns it plus DB CPU, transactions, requests,
    inputs and the mock's own CPU seconds (it shares the machine's cores) counted around it."""
    server.reset_stats()
    mock = psutil.Process(server.pid)
    before, mock_before = pg.counters(url), process_tree_cpu(mock)
    measured = await_builds(url, work())
    after, mock_after = pg.counters(url), process_tree_cpu(mock)
    stats = server.stats()
    return (
        measured,
        after.server_cpu_s - before.server_cpu_s,
        after.xact_commit - before.xact_commit,
        stats["embed_requests"],
        stats["inputs"],
        mock_after - mock_before,
    )


def await_builds(url: str, measured: Measured, limit_s: float = 900.0) -> Measured:
    """Wait until no index build runs in the database (a build ``worker --drain`` left to
    PostgreSQL goes on after the worker's exit): the figures then count its CPU, and the
    timeline says when it ended (a :data:`BUILD_ENDED` line, if one was still running)."""
    deadline = time.monotonic() + limit_s
    waited = False
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                """SELECT count(*) FROM pg_stat_progress_create_index
                   WHERE datname = current_database()"""
            ).fetchone()
            if row is None or row[0] == 0:
                break
            waited = True
            time.sleep(0.05)
    if not waited:
        return measured
    ended = (time.time() - measured.started_at, BUILD_ENDED)
    return attrs.evolve(measured, lines=(*measured.lines, ended))


def recall_at_10(url: str, queries: int = 50) -> float:
    """Mean recall@10 of ``ORDER BY vector::vector(dim) <=> q`` (the shape search ranks with:
    the model's HNSW index once it has one, an exact scan before) against exact cosine top 10;
    the queries are stored vectors with a little noise, as in bench/search.py."""
    with psycopg.connect(url, autocommit=True) as conn:
        model = conn.execute("SELECT id FROM embedding_models").fetchone()
        rows = conn.execute("SELECT chunk_id, vector::real[] FROM embeddings").fetchall()
        assert model is not None
        ids = [row[0] for row in rows]
        stored = np.array([row[1] for row in rows], dtype=np.float32)
        stored /= np.linalg.norm(stored, axis=1, keepdims=True)
        rng = np.random.default_rng(7)
        found = []
        for i in rng.choice(len(ids), size=min(queries, len(ids)), replace=False):
            q = stored[i] + 0.02 * rng.standard_normal(DIMENSION).astype(np.float32)
            exact = {ids[j] for j in np.argsort(-(stored @ q))[:10]}
            ranked = conn.execute(
                f"""SELECT chunk_id FROM embeddings WHERE embedding_model_id = '{model[0]}'
                    ORDER BY vector::vector({DIMENSION}) <=> %s::vector({DIMENSION}) LIMIT 10""",
                (str(q.tolist()),),
            ).fetchall()
            found.append(len(exact & {row[0] for row in ranked}) / 10)
    return float(np.mean(found))


def run_trioindex(
    pg: BenchPostgres,
    server: EmbedServerProcess,
    texts: Sequence[str],
    work: Path,
    index_min_vectors: int | None = None,
    *,
    profile: bool = False,
    tree: Path | None = None,
    settings: Mapping[str, str] | None = None,
) -> Run:
    """``ingest`` + ``worker --drain`` with defaults; ``index_min_vectors`` 0 builds the model's
    HNSW index before the first vector (the behaviour before the threshold existed); ``profile``
    prints where the time went (see the module docstring); ``tree``: the worker (and
    ``ingest``) run the ``trioindex`` package of that source tree instead of this one;
    ``settings``: ``TRIOINDEX_*`` variables (without the prefix) set for both."""
    root = work / f"trioindex-{time.monotonic_ns()}"
    corpus = root / "corpus"
    corpus.mkdir(parents=True)
    for i, text in enumerate(texts):
        (corpus / f"doc-{i:05d}.txt").write_text(text)
    with pg.fresh_database("peer_trio") as url:
        env = worker_env(
            HOME=str(root / "home"),
            DATABASE_URL=url,
            STORAGE_URL=(root / "blobs").as_uri(),
            EMBEDDING_API="openai",
            EMBEDDING_URL=server.url,
            EMBEDDING_MODEL=MODEL,
            EMBEDDING_DIMENSION=str(DIMENSION),
            **(settings or {}),
        )
        if index_min_vectors is not None:
            env["TRIOINDEX_EMBEDDING_INDEX_MIN_VECTORS"] = str(index_min_vectors)
        if tree is not None:
            env["PYTHONPATH"] = str(tree / "src")
        compile_bytecode((tree or REPO_ROOT) / "src" / "trioindex")
        began = time.monotonic()
        created = ingest_folder(env, corpus)
        ingest_rate = created / (time.monotonic() - began)
        pg.quiesce(url)
        command = [sys.executable, "-m", "trioindex.cli", "worker", "--drain"]
        watch_writes(url, "embeddings")
        if profile:
            command = start_profile(pg, url, root, command)
        figures = measure(
            pg, url, server, lambda: run_measured(command, env, root / "worker.log", 900)
        )
        if profile:
            print_profile(pg, url, len(texts))
        label = "worker --drain (defaults)"
        if index_min_vectors is not None:
            label = f"worker --drain, index-min-vectors {index_min_vectors}"
        if tree is not None:
            label = f"{label}, code of {tree}"
        if settings:
            label = "worker --drain, " + ", ".join(f"{k}={v}" for k, v in settings.items())
        run = _run("trioindex", label, url, "embeddings", figures, ingest_rate)
        return attrs.evolve(run, recall_at_10=recall_at_10(url))


def _run(  # noqa: PLR0917 - one row of the table
    system: str,
    label: str,
    url: str,
    table: str,
    figures: Figures,
    ingest_rate: float | None = None,
) -> Run:
    measured, db_cpu, xacts, requests, inputs, embedder_cpu = figures
    with psycopg.connect(url, autocommit=True) as conn:
        done = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    assert done is not None
    times = written_times(url, table)
    return Run(
        system=system,
        label=label,
        chunks=int(done[0]),
        wall_s=measured.wall_s,
        steady_per_s=steady_rate(times),
        tenths=rates_by_tenth(times),
        worker_cpu_s=measured.cpu_s,
        db_cpu_s=db_cpu,
        xacts=xacts,
        requests=requests,
        inputs=inputs,
        ingest_per_s=ingest_rate,
        embedder_cpu_s=embedder_cpu,
        timeline=timeline(measured, url, table),
    )


def timeline(measured: Measured, url: str, table: str) -> dict[str, float]:
    """Seconds after the process started: each log mark (:data:`TIMELINE_MARKS`), the first,
    10th-percentile, 90th-percentile and last row written (the steady window is between the
    middle two), and the exit."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            f"""SELECT extract(epoch FROM min({WRITTEN_AT}))::float8,
                       extract(epoch FROM percentile_disc(0.1) WITHIN GROUP (ORDER BY {WRITTEN_AT}))::float8,
                       extract(epoch FROM percentile_disc(0.9) WITHIN GROUP (ORDER BY {WRITTEN_AT}))::float8,
                       extract(epoch FROM max({WRITTEN_AT}))::float8
                FROM {table}"""
        ).fetchone()
    marks = measured.marks()
    if row is not None and row[0] is not None:
        for name, at in zip(("first row", "10 % rows", "90 % rows", "last row"), row, strict=True):
            marks[name] = at - measured.started_at
    marks["exit"] = measured.wall_s
    return {name: round(at, 3) for name, at in sorted(marks.items(), key=lambda kv: kv[1])}


def pgai_bin() -> Path:
    """pgai's command in its own virtual environment, made with uv on first use, its modules
    compiled to bytecode (:func:`compile_bytecode` says why)."""
    binary = PGAI_HOME / "bin" / "pgai"
    if not binary.exists():
        subprocess.run(["uv", "venv", "-q", "-p", sys.executable, str(PGAI_HOME)], check=True)
        env = {**os.environ, "VIRTUAL_ENV": str(PGAI_HOME)}
        install = ["uv", "pip", "install", "-q", "--compile-bytecode", *PGAI_NEEDS]
        subprocess.run(install, check=True, env=env)
    return binary


def compile_bytecode(folder: Path) -> None:
    """Compile every module under ``folder`` that has no up-to-date bytecode. Both systems run
    compiled, as installed packages are (``just setup`` and the Dockerfile for trioindex's
    dependencies, :func:`pgai_bin` for pgai's): with ``PYTHONDONTWRITEBYTECODE`` set, as here,
    a process would otherwise compile every module it imports at each start."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", str(folder)], check=True)


def run_pgai(
    pg: BenchPostgres,
    server: EmbedServerProcess,
    texts: Sequence[str],
    work: Path,
    concurrency: int,
) -> Run:
    binary = pgai_bin()
    with pg.fresh_database("peer_pgai") as url:
        subprocess.run([str(binary), "install", "-d", url], check=True, capture_output=True)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE docs (id bigint PRIMARY KEY, body text NOT NULL)")
            with conn.cursor().copy("COPY docs (id, body) FROM STDIN") as copy:
                for i, text in enumerate(texts):
                    copy.write_row((i, text))
            conn.execute(
                """SELECT ai.create_vectorizer('public.docs'::regclass,
                       loading => ai.loading_column('body'),
                       embedding => ai.embedding_openai(%s, %s, base_url => %s),
                       processing => ai.processing_default(batch_size => 50),
                       indexing => ai.indexing_none(),
                       scheduling => ai.scheduling_none())""",
                (MODEL, DIMENSION, f"{server.url}/v1"),
            )
        watch_writes(url, "docs_embedding_store")
        pg.quiesce(url)
        # pgai ships the tokenizer files; without this tiktoken would download them
        cache = next(PGAI_HOME.glob("lib/python*/site-packages/pgai/vectorizer/tiktoken_cache"))
        env = {**os.environ, "OPENAI_API_KEY": "bench", "TIKTOKEN_CACHE_DIR": str(cache)}
        args = [str(binary), "vectorizer", "worker", "-d", url, "--once", "-c", str(concurrency)]
        figures = measure(
            pg, url, server, lambda: run_measured(args, env, work / f"pgai-c{concurrency}.log", 900)
        )
        label = f"vectorizer worker -c {concurrency}, batch 50"
        return _run("pgai", label, url, "docs_embedding_store", figures)


PY_SPY = Path(sys.executable).parent / "py-spy"


def start_profile(pg: BenchPostgres, url: str, root: Path, command: list[str]) -> list[str]:
    """Count nested statements and function times from zero; the worker command, under py-spy
    when it is installed (sampling only the thread holding the GIL: CPU, not waits)."""
    pg.count_every_statement(url)
    if not PY_SPY.exists():
        return command
    print(f"py-spy stacks: {root / 'py-spy.txt'}")
    return [str(PY_SPY), "record", "--gil", "-r", "250", "-f", "raw", "-o", str(root / "py-spy.txt"),
            "--", *command]  # fmt: skip


def print_profile(pg: BenchPostgres, url: str, docs: int) -> None:
    """Execution ms per document of each statement (nested ones too: a function's statements
    are in its own time as well), functions' self time, updates and HOT updates per table, WAL
    and events per document."""
    statements = admin(
        pg.admin_url,
        """SELECT s.calls, s.total_exec_time, s.toplevel, s.query FROM pg_stat_statements s
           JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = %s
           ORDER BY s.total_exec_time DESC""",
        (psycopg.conninfo.conninfo_to_dict(url)["dbname"],),
    )
    worker_sql = ("trioindex_", "WITH worker")  # the worker's own round trips
    top = sum(
        ms for _, ms, toplevel, q in statements if toplevel and any(w in q for w in worker_sql)
    )
    print(
        f"statements: calls, ms per document, share of the worker's top-level ones ({top:.0f} ms)"
    )
    for calls, ms, toplevel, query in statements[:40]:
        text = ("" if toplevel else "  (nested) ") + " ".join(query.split())
        print(f"{calls:7d} {ms / docs:7.3f} {ms / top:6.1%}  {text[:110]}")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        for title, sql in (
            ("functions: calls, total and self ms per document", "SELECT funcname, calls, "
             f"round((total_time / {docs})::numeric, 3), round((self_time / {docs})::numeric, 3) "
             "FROM pg_stat_user_functions ORDER BY self_time DESC"),
            ("tables: inserts, updates, HOT updates, index and sequential scans", "SELECT relname, "
             "n_tup_ins, n_tup_upd, n_tup_hot_upd, idx_scan, seq_scan FROM pg_stat_user_tables "
             "WHERE n_tup_ins + n_tup_upd > 0 ORDER BY n_tup_upd DESC"),
            ("WAL: records, full-page images, bytes per document", "SELECT wal_records, wal_fpi, "
             f"round(wal_bytes / {docs}) FROM pg_stat_wal"),
            ("events per document", f"SELECT event_type, round(count(*)::numeric / {docs}, 2) "
             "FROM indexing_events GROUP BY 1 ORDER BY 2 DESC"),
        ):  # fmt: skip
            print(title)
            for row in conn.execute(sql).fetchall():
                print("   ", " | ".join(str(v) for v in row))


def run_ingest(
    pg: BenchPostgres,
    server: EmbedServerProcess,
    count: int,
    work: Path,
    *,
    blobs: Path,
    store: str,
) -> list[dict[str, Any]]:
    """``ingest`` of ``count`` new small files into a folder store at ``blobs``, then of the same
    files again (unchanged)."""
    corpus = work / f"ingest-{time.monotonic_ns()}" / "corpus"
    corpus.mkdir(parents=True)
    for i, text in enumerate(chunk_texts(count, characters=CHARACTERS, salt="ingest")):
        (corpus / f"doc-{i:05d}.txt").write_text(text)
    rows: list[dict[str, Any]] = []
    with pg.fresh_database("peer_ingest") as url:
        env = worker_env(
            HOME=str(corpus.parent / "home"),
            DATABASE_URL=url,
            STORAGE_URL=blobs.as_uri(),
            EMBEDDING_API="openai",
            EMBEDDING_URL=server.url,
            EMBEDDING_MODEL=MODEL,
            EMBEDDING_DIMENSION=str(DIMENSION),
        )
        for files in ("new", "unchanged"):
            before, cpu, began = pg.counters(url), cpu_seconds(), time.monotonic()
            ingest_folder(env, corpus)
            wall, cpu = time.monotonic() - began, cpu_seconds() - cpu
            after = pg.counters(url)
            rows.append(
                {
                    "files": f"{count} {files}",
                    "folder store on": store,
                    "files/s": round(count / wall, 1),
                    "CPU ms/file ingest + PG": f"{cpu / count * 1e3:.2f} + "
                    f"{(after.server_cpu_s - before.server_cpu_s) / count * 1e3:.2f}",
                    "xacts/file": round((after.xact_commit - before.xact_commit) / count, 3),
                }
            )
            print(rows[-1], flush=True)
    return rows


INGEST_HEADING = "## Ingest"
RESULTS_HEADING = "## Results"


def ingest_section(rows: Sequence[dict[str, Any]], date: str, command: str, load: float) -> str:
    table = column_table([(name, lambda r, n=name: str(r[n])) for name in rows[0]], rows)
    return "\n".join(
        [
            INGEST_HEADING,
            "",
            f"`{command}` ({date}; the machine above, 1-minute load average {load:.2f} at start):",
            "",
            *table,
            "",
        ]
    )


def kept_sections(page: Path) -> str:
    """Every section of the page after its "Results" (a full run writes the head and "Results";
    the dated sections, "Ingest" and the readings after them stay as they are)."""
    text = page.read_text() if page.exists() else ""
    start = text.find(RESULTS_HEADING)
    if start < 0:
        return text[text.index(INGEST_HEADING) :] if INGEST_HEADING in text else ""
    after = text.find("\n## ", start + len(RESULTS_HEADING))
    return "" if after < 0 else text[after + 1 :]


def _f(value: float, digits: int = 1) -> str:
    return f"{value:,.{digits}f}"


def markdown(runs: Sequence[Run], head: list[str]) -> str:
    best = {
        "steady": max((r.steady_per_s for r in runs if r.system == "pgai"), default=float("nan")),
        "wall": max((r.wall_per_s for r in runs if r.system == "pgai"), default=float("nan")),
    }
    table = column_table(
        [
            ("system", lambda r: f"{r.system}: {r.label}"),
            ("chunks", lambda r: str(r.chunks)),
            ("chunks/s steady", lambda r: _f(r.steady_per_s)),
            ("chunks/s wall", lambda r: _f(r.wall_per_s)),
            (
                "× pgai best (steady / wall)",
                lambda r: (
                    f"{r.steady_per_s / best['steady']:.2f} / {r.wall_per_s / best['wall']:.2f}"
                ),
            ),
            (
                "CPU ms/chunk worker + PG (+ mock)",
                lambda r: (
                    f"{_f(r.per_chunk(r.worker_cpu_s) * 1e3, 2)} + "
                    f"{_f(r.per_chunk(r.db_cpu_s) * 1e3, 2)}"
                    + (
                        ""
                        if r.embedder_cpu_s is None
                        else f" (+ {_f(r.per_chunk(r.embedder_cpu_s) * 1e3, 2)})"
                    )
                ),
            ),
            ("xacts/chunk", lambda r: _f(r.per_chunk(r.xacts), 2)),
            ("requests/chunk", lambda r: _f(r.per_chunk(r.requests), 3)),
            ("mean batch", lambda r: _f(r.inputs / max(r.requests, 1))),
            ("ingest files/s", lambda r: "" if r.ingest_per_s is None else _f(r.ingest_per_s, 0)),
            ("recall@10", lambda r: "" if r.recall_at_10 is None else _f(r.recall_at_10, 3)),
        ],
        runs,
    )
    return "\n".join([*head, RESULTS_HEADING, "", *table, ""])


def plot(path: Path, runs: Sequence[Run]) -> Path:
    with figure(1, 1, (8, 3.5)) as (fig, ax):
        labels = [f"{r.system}\n{r.label.split(',')[0]}" for r in runs]
        xs = range(len(runs))
        ax.bar([x - 0.2 for x in xs], [r.steady_per_s for r in runs], 0.4, label="steady")
        ax.bar([x + 0.2 for x in xs], [r.wall_per_s for r in runs], 0.4, label="wall")
        ax.set_xticks(list(xs), labels, fontsize=7)
        ax.set_ylabel("chunks/s")
        ax.legend()
        return save_figure(fig, path)


def parse_variant(text: str) -> dict[str, str]:
    """``KEY=VALUE,KEY=VALUE`` as a mapping (``--variant``)."""
    pairs = [item.partition("=") for item in text.split(",") if item]
    if not pairs or any(not key or not sep for key, sep, _ in pairs):
        raise ValueError(f"not KEY=VALUE[,KEY=VALUE...]: {text!r}")
    return {key.strip().upper(): value.strip() for key, _, value in pairs}


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench_parser("peer", "trioindex next to pgai's vectorizer worker", "500 docs, once")
    parser.add_argument("--docs", type=int, default=None, help="documents (default 2000)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (2)")
    parser.add_argument("--ingest", type=int, default=None, metavar="N", help="ingest N files")
    parser.add_argument("--profile", action="store_true", help="where one run's time goes")
    parser.add_argument(
        "--defaults-only",
        action="store_true",
        help="trioindex with its defaults only (no index-min-vectors 0 row), next to pgai",
    )
    parser.add_argument(
        "--baseline-tree",
        type=Path,
        default=None,
        metavar="DIR",
        help="also run trioindex from the source tree DIR (say main's: git archive main | tar -x"
        " -C DIR), before this tree's run in every round",
    )
    parser.add_argument(
        "--variant",
        type=parse_variant,
        action="append",
        default=[],
        metavar="KEY=VALUE[,...]",
        help="also run trioindex with these settings (TRIOINDEX_ names without the prefix),"
        " after the defaults' run in every round; repeatable",
    )
    add_out(parser, "peer")
    args = parser.parse_args(argv)
    session = Session.start("peer", args)
    if args.ingest:
        return ingest_only(session, args.ingest)
    docs = args.docs or (500 if args.quick else 2000)
    if args.profile:
        return profile_only(docs)
    rounds = args.rounds or (1 if args.quick else 2)
    texts = chunk_texts(docs, characters=CHARACTERS, salt="peer")
    runs: list[Run] = []
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"trioindex-peer-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    with BenchPostgres() as pg, EmbedServerProcess(LATENCY_MS, DIMENSION) as server:
        machine = machine_info(pg.admin_url)
        warm_mock(server, texts)
        for _ in range(rounds):
            for index_min_vectors in (None,) if args.defaults_only else (None, 0):
                for tree in (args.baseline_tree, None) if args.baseline_tree else (None,):
                    runs.append(
                        run_trioindex(pg, server, texts, work, index_min_vectors, tree=tree)
                    )
                    print(runs[-1].as_json(), flush=True)
            for variant in args.variant:
                runs.append(run_trioindex(pg, server, texts, work, settings=variant))
                print(runs[-1].as_json(), flush=True)
            for concurrency in (8, 4):
                runs.append(run_pgai(pg, server, texts, work, concurrency))
                print(runs[-1].as_json(), flush=True)
    return session.publish(
        machine,
        {"docs": docs, "rounds": rounds, "runs": [r.as_json() for r in runs]},
        lambda path: plot(path, runs),
        lambda date, elapsed, png: (
            markdown(
                runs,
                [
                    *page_head(
                        "trioindex next to pgai",
                        date,
                        session.command,
                        elapsed,
                        machine,
                        about=__doc__,
                    ),
                    f"![chunks/s]({png})",
                    "",
                ],
            )
            + "\n"
            + kept_sections(session.out / "peer.md")
        ),
    )


def profile_only(docs: int) -> int:
    texts = chunk_texts(docs, characters=CHARACTERS, salt="peer")
    work = Path(tempfile.mkdtemp(prefix="trioindex-peer-profile-"))
    with BenchPostgres() as pg, EmbedServerProcess(LATENCY_MS, DIMENSION) as server:
        warm_mock(server, texts)
        print(run_trioindex(pg, server, texts, work, profile=True).as_json())
    return 0


def ingest_only(session: Session, count: int) -> int:
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"trioindex-peer-{os.getpid()}"
    load = os.getloadavg()[0]
    with BenchPostgres() as pg, EmbedServerProcess(LATENCY_MS, DIMENSION) as server:
        rows = run_ingest(pg, server, count, work, blobs=work / "blobs", store="disk")
        # the same run with blobs in memory: what ingest itself costs, the store's fsyncs aside
        with tempfile.TemporaryDirectory(dir="/dev/shm") as shm:
            rows += run_ingest(pg, server, count, work, blobs=Path(shm), store="tmpfs")
    shutil.rmtree(work, ignore_errors=True)
    page = session.out / "peer.md"
    text = page.read_text() if page.exists() else ""
    kept = (text[: text.index(INGEST_HEADING)] if INGEST_HEADING in text else text).rstrip("\n")
    # sections after "Ingest" (such as "Where the CPU goes") stay as they are
    after = text[text.index(INGEST_HEADING) + 1 :] if INGEST_HEADING in text else ""
    tail = after[after.index("\n## ") :] if "\n## " in after else ""
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(f"{kept}\n\n{ingest_section(rows, utc_now(), session.command, load)}{tail}")
    print(f"wrote the ingest section of {page}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
