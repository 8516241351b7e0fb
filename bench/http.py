"""HTTP service against the Python API: search latency and upload throughput (`just bench-http`).

**search** — 100k chunks (10k documents × 10, bench/search.py's clustered 1024-dimension
vectors and manual-page words, stored as a worker stores them, HNSW built after the load) for
the server model BAAI/bge-m3, embedded by testkit's fake TEI server in a process of its own.
`trioindex serve` runs as a process; 16 clients, each a process of its own (so no client
shares the measuring Python's GIL), send `GET /v1/search` (keep-alive, one connection each)
for a fixed time with an API key; beside it, in the same run and on the same data,
`Index.search` in this process from 16 Trio tasks for the same time. The queries cycle through
four texts of five corpus words in the modes hybrid, text, vector, hybrid. The two runs
alternate (HTTP, in-process, HTTP, in-process) and each side's latencies are pooled: p50, p95,
p99 and the ratio of the p50s (goal ≤ 1.3×). With `--baseline REF` a second `serve` process
runs REF's `src/` (git archive) on the same database and takes turns with the first, so a
change is measured before and after in one run.

**upload** — 1,000 small text files (200-400 bytes, distinct), uploaded by 16 client
processes with `POST /v1/documents/{key}` (each process its share over one kept-alive
`http.client` connection; `--upload-client httpx` for httpx's), next to
`trioindex ingest FOLDER` of another 1,000 files of the same shape (a fresh process, as a user
runs it, its start included) on the same database and folder store: files/s and the ratio
(goal ≥ 0.8×). Beside them, with the same server, another 1,000 such files sent as batch
uploads (`POST /v1/documents`, multipart/form-data, ``--batch-size`` files per request,
50 by default) by ``--batch-clients`` client processes (4). No worker runs: all only store
the bytes and enqueue. CPU per file is
reported by part (`serve`, the clients, the `ingest` process, PostgreSQL, the machine) with
each run's load average; `--profile DIR` records each `serve` with py-spy.
"""

from __future__ import annotations

import argparse
import http.client
import io
import json
import multiprocessing
import os
import resource
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs
import httpx
import numpy as np
import psutil
import trio

from bench.common import (
    REPO_ROOT,
    RESULTS_DIR,
    BenchPostgres,
    machine_info,
    markdown_table,
    page_head,
    percentiles,
    utc_now,
    verdict,
)
from bench.search import synthetic_corpus
from testkit.embed_process import EmbedServerProcess
from testkit.processes import base_env, cli, free_port, spawn, stop_process, wait_for, wait_for_port
from testkit.search_corpus import IndexedDocument, store_indexed
from trioindex.api.index import Index
from trioindex.config import load_settings
from trioindex.db.api_keys import Role, create_key
from trioindex.db.models import ensure_model
from trioindex.db.pool import connect
from trioindex.db.vector_index import create_index_sql

REPORT = RESULTS_DIR / "http.md"
MODEL, DIMENSION = "BAAI/bge-m3", 1024
CLIENTS = 16
BOUNDARY = "trioindex-bench-boundary"
MODES = ("hybrid", "text", "vector", "hybrid")
SEARCH_GOAL, UPLOAD_GOAL = 1.3, 0.8

# -- data ---------------------------------------------------------------------------------------


def load_corpus(url: str, chunks: int) -> list[str]:
    """Store ``chunks`` chunks for the server model and build its HNSW index; return the
    query texts (five words of a stored chunk each)."""
    rng, vectors, words, texts = synthetic_corpus(chunks, DIMENSION)
    began = time.monotonic()
    with connect(url) as conn:
        model = ensure_model(conn, MODEL, DIMENSION)
        conn.execute(f"DROP INDEX IF EXISTS {model.index_name}")
        docs = (
            IndexedDocument(
                f"doc-{d:05d}", texts[d * 10 : d * 10 + 10], vectors[d * 10 : d * 10 + 10]
            )
            for d in range(chunks // 10)
        )
        store_indexed(conn, model, docs)
        conn.execute("SET maintenance_work_mem = '512MB'")
        conn.execute(create_index_sql(conn, model, concurrently=False))
        conn.execute("VACUUM ANALYZE")
    print(f"loaded {chunks:,} chunks and built the HNSW index in {time.monotonic() - began:.0f} s")
    return [" ".join(words[i][:5]) for i in rng.integers(0, chunks, 64)]


def small_files(folder: Path, tag: str, count: int) -> list[Path]:
    """``count`` distinct text files of 200-400 bytes under ``folder``."""
    rng = np.random.default_rng(len(tag))
    folder.mkdir(parents=True)
    paths = []
    for i in range(count):
        path = folder / f"{i // 100:02d}" / f"note-{i:04d}.txt"
        path.parent.mkdir(exist_ok=True)
        body = f"{tag} note {i}: " + "lorem ipsum dolor sit amet " * int(rng.integers(7, 14))
        path.write_text(body)
        paths.append(path)
    return paths


# -- the service --------------------------------------------------------------------------------


@attrs.frozen
class Served:
    """A running ``serve``: its URL and its process id (for its CPU time)."""

    url: str
    pid: int


@contextmanager
def serving(
    env: dict[str, str], log: Path, src: Path | None = None, *extra: str
) -> Iterator[Served]:
    """``trioindex serve`` on a free port (``src``: another checkout's sources; ``extra``: more
    options of ``serve``)."""
    if src is not None:
        env = env | {"PYTHONPATH": str(src)}
    port = free_port()
    process = spawn(env, "serve", "--port", str(port), *extra, log=log)
    try:
        wait_for_port(port, process, 120, "trioindex serve")
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _healthy(url), 60, "/healthz to answer 200")
        yield Served(url, process.pid)
    finally:
        stop_process(process)


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` and every process under it, live or reaped
    (a backend that exits moves from the live sum to its parent's ``children_*`` times)."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return float("nan")
    total = 0.0
    for process in processes:
        with suppress(psutil.Error):
            times = process.cpu_times()
            total += times.user + times.system + times.children_user + times.children_system
    return total


@attrs.frozen
class CpuMeter:
    """CPU seconds spent by the bench's parts between :meth:`start` and :meth:`read`:
    ``serve`` (when given), PostgreSQL (postmaster and backends), this process's children
    (an ``ingest`` run), and the machine as a whole."""

    serve_pid: int | None
    postgres_pid: int
    began: dict[str, float]

    @classmethod
    def start(cls, postgres_pid: int, serve_pid: int | None = None) -> CpuMeter:
        meter = cls(serve_pid, postgres_pid, {})
        meter.began.update(meter._now())
        return meter

    def _now(self) -> dict[str, float]:
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        machine = psutil.cpu_times()
        now = {
            "postgres": tree_cpu_seconds(self.postgres_pid),
            "children": children.ru_utime + children.ru_stime,
            "machine": machine.user + machine.system + machine.nice + machine.softirq
            + machine.irq,
        }  # fmt: skip
        if self.serve_pid is not None:
            now["serve"] = tree_cpu_seconds(self.serve_pid)
            with suppress(psutil.Error):
                now["serve system"] = psutil.Process(self.serve_pid).cpu_times().system
        return now

    def read(self) -> dict[str, float]:
        return {name: value - self.began[name] for name, value in self._now().items()}


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def baseline_src(ref: str, into: Path) -> Path:
    """``ref``'s ``src/`` folder, extracted under ``into``."""
    archive = subprocess.run(
        ["git", "archive", ref, "src"], cwd=REPO_ROOT, capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


# -- clients (each in a process of its own) -----------------------------------------------------


_client: httpx.Client | None = None
_barrier: Any = None


def _start_client(barrier: Any) -> None:
    """A pool process's one HTTP client (made once: on a loaded machine it takes seconds)."""
    global _client, _barrier
    _client, _barrier = httpx.Client(timeout=60), barrier


def _search_client(
    url: str, token: str, queries: Sequence[str], first: int, seconds: float
) -> list[float]:
    assert _client is not None
    headers = {"Authorization": f"Bearer {token}"}
    _client.get(f"{url}/v1/search", params={"q": queries[0]}, headers=headers).raise_for_status()
    _barrier.wait()
    latencies = []
    n, stop_at = first, time.monotonic() + seconds
    while time.monotonic() < stop_at:
        params = {"q": queries[n % len(queries)], "mode": MODES[n % len(MODES)]}
        began = time.perf_counter()
        answer = _client.get(f"{url}/v1/search", params=params, headers=headers)
        latencies.append(time.perf_counter() - began)
        if answer.status_code != 200:
            raise RuntimeError(f"search answered {answer.status_code}: {answer.text[:200]}")
        n += 1
    return latencies


def _upload_client(
    url: str, token: str, files: Sequence[tuple[str, str]], client: str
) -> tuple[float, float, float]:
    """The client's start and end (wall clock) of its uploads, and its CPU seconds for them.
    ``client``: ``httpx`` (the process's ``httpx.Client``) or ``http.client`` (the standard
    library's, about a tenth of httpx's CPU per request); both keep one connection alive."""
    assert _client is not None
    headers = {"Authorization": f"Bearer {token}"}
    _client.get(f"{url}/v1/status", headers=headers).raise_for_status()
    post = _httpx_post if client == "httpx" else _stdlib_post(url)
    _barrier.wait()
    began, cpu = time.time(), time.process_time()
    for key, path in files:
        status, text = post(f"{url}/v1/documents/{key}", Path(path).read_bytes(), headers)
        if status != 201:
            raise RuntimeError(f"upload answered {status}: {text[:200]}")
    return began, time.time(), time.process_time() - cpu


def _batch_body(files: Sequence[tuple[str, str]]) -> bytes:
    """The multipart/form-data body of ``files`` (key, path): one part per file."""
    parts = [
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{key}"; filename="{Path(path).name}"'
        f"\r\nContent-Type: text/plain\r\n\r\n".encode()
        + Path(path).read_bytes()
        + b"\r\n"
        for key, path in files
    ]
    return b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()


def _batch_client(
    url: str, token: str, batches: Sequence[Sequence[tuple[str, str]]]
) -> tuple[float, float, float]:
    """As :func:`_upload_client`, one ``POST /v1/documents`` per batch over one kept-alive
    ``http.client`` connection; the bodies are built before the clock starts."""
    assert _client is not None
    headers = {"Authorization": f"Bearer {token}"}
    _client.get(f"{url}/v1/status", headers=headers).raise_for_status()
    post = _stdlib_post(url)
    headers["Content-Type"] = f"multipart/form-data; boundary={BOUNDARY}"
    bodies = [(len(batch), _batch_body(batch)) for batch in batches]
    _barrier.wait()
    began, cpu = time.time(), time.process_time()
    for count, body in bodies:
        status, text = post(f"{url}/v1/documents", body, headers)
        if status != 200 or json.loads(text)["created"] != count:
            raise RuntimeError(f"batch upload answered {status}: {text[:300]}")
    return began, time.time(), time.process_time() - cpu


def _httpx_post(url: str, data: bytes, headers: dict[str, str]) -> tuple[int, str]:
    assert _client is not None
    answer = _client.post(url, content=data, headers=headers)
    return answer.status_code, answer.text


def _stdlib_post(base: str) -> Callable[[str, bytes, dict[str, str]], tuple[int, str]]:
    """A POST over one kept-alive ``http.client`` connection to ``base``."""
    where = urlsplit(base)
    connection = http.client.HTTPConnection(where.hostname or "", where.port, timeout=60)

    def post(url: str, data: bytes, headers: dict[str, str]) -> tuple[int, str]:
        connection.request("POST", urlsplit(url).path, body=data, headers=headers)
        answer = connection.getresponse()
        return answer.status, answer.read().decode()

    return post


def _ready(_: int) -> None:
    time.sleep(0.5)  # long enough that every process of the pool takes one


def client_pool(clients: int = CLIENTS) -> Any:
    """``clients`` processes, each with its HTTP client, meeting at one barrier per run."""
    context = multiprocessing.get_context("spawn")
    pool = context.Pool(clients, initializer=_start_client, initargs=(context.Barrier(clients),))
    pool.map(_ready, range(clients * 2), chunksize=1)
    return pool


def http_searches(
    pool: Any, url: str, token: str, queries: Sequence[str], seconds: float
) -> list[float]:
    jobs = [(url, token, queries, i, seconds) for i in range(CLIENTS)]
    return [t for part in pool.starmap(_search_client, jobs, chunksize=1) for t in part]


async def _in_process(settings: Any, queries: Sequence[str], seconds: float) -> list[float]:
    latencies: list[float] = []
    async with Index.open(settings) as index:
        await index.open_model()
        await index.search(queries[0])
        deadline = trio.current_time() + seconds

        async def client(first: int) -> None:
            n = first
            while trio.current_time() < deadline:
                began = time.perf_counter()
                await index.search(queries[n % len(queries)], mode=MODES[n % len(MODES)])  # type: ignore[arg-type]
                latencies.append(time.perf_counter() - began)
                n += 1

        async with trio.open_nursery() as nursery:
            for i in range(CLIENTS):
                nursery.start_soon(client, i)
    return latencies


def in_process_searches(env: dict[str, str], queries: Sequence[str], seconds: float) -> list[float]:
    settings = load_settings(environ=env)
    return trio.run(_in_process, settings, queries, seconds)


def http_uploads(  # noqa: PLR0917 (the run's parts)
    pool: Any, url: str, token: str, root: Path, paths: Sequence[Path], client: str
) -> tuple[float, float]:
    """Seconds from the first client's start to the last client's last answer, and the
    clients' CPU seconds for their uploads."""
    named = [(f"upload/{p.relative_to(root).as_posix()}", str(p)) for p in paths]
    spans = pool.starmap(
        _upload_client,
        [(url, token, named[i::CLIENTS], client) for i in range(CLIENTS)],
        chunksize=1,
    )
    return _span(spans)


def _span(spans: Sequence[tuple[float, float, float]]) -> tuple[float, float]:
    took = max(end for _, end, _ in spans) - min(start for start, _, _ in spans)
    return float(took), float(sum(cpu for _, _, cpu in spans))


def http_batch_uploads(  # noqa: PLR0917 (the run's parts)
    pool: Any, url: str, token: str, root: Path, paths: Sequence[Path], size: int, clients: int
) -> tuple[float, float]:
    """As :func:`http_uploads`, in batches of ``size`` files shared among the ``clients``
    processes of ``pool`` (batch *i* to client *i* mod ``clients``)."""
    named = [(f"batch/{p.relative_to(root).as_posix()}", str(p)) for p in paths]
    batches = [named[i : i + size] for i in range(0, len(named), size)]
    spans = pool.starmap(
        _batch_client, [(url, token, batches[i::clients]) for i in range(clients)], chunksize=1
    )
    return _span(spans)


def ingest_seconds(env: dict[str, str], folder: Path) -> float:
    began = time.monotonic()
    done = cli(env, "ingest", str(folder), "--as", "ingest", timeout=900)
    took = time.monotonic() - began
    if done.returncode != 0:
        raise RuntimeError(f"ingest failed: {done.stderr[-2000:]}")
    return took


# -- the run ------------------------------------------------------------------------------------


def side(latencies: list[float]) -> dict[str, Any]:
    ms = [t * 1000 for t in latencies]
    return {"n": len(ms), **percentiles(ms, (50, 95, 99))}


def run(args: argparse.Namespace, url: str, work: Path) -> dict[str, Any]:
    figures: dict[str, Any] = {"chunks": args.chunks, "seconds": args.seconds}
    figures["rounds"] = args.rounds
    queries = load_corpus(url, args.chunks) if args.only != "upload" else []
    log = work / "embed.log"
    with EmbedServerProcess(latency_ms=0, dimension=DIMENSION, log_path=log) as embed:
        env = base_env(
            TRIOINDEX_DATABASE_URL=url,
            TRIOINDEX_HOME=str(work / "home"),
            TRIOINDEX_STORAGE_URL=(work / "blobs").as_uri(),
            TRIOINDEX_EMBEDDING_API="tei",
            TRIOINDEX_EMBEDDING_URL=embed.url,
            TRIOINDEX_EMBEDDING_MODEL=MODEL,
            TRIOINDEX_EMBEDDING_DIMENSION=str(DIMENSION),
        )
        with connect(url) as conn:
            token = create_key(conn, "bench", Role.WRITE)[1]
        servers: dict[str, Path | None] = {"this": None}
        if args.baseline:
            servers[args.baseline] = baseline_src(args.baseline, work / "baseline")
        with client_pool() as pool, client_pool(args.batch_clients) as batch_pool:
            if args.only != "upload":
                figures["search"] = searches(args, env, pool, servers, token, queries, work)
            if args.only != "search":
                figures["upload"] = uploads(args, env, (pool, batch_pool), servers, token, work)
    if args.only != "search":
        expected = {"upload": args.files * len(servers), "batch": args.files, "ingest": args.files}
        counts = {name: _count(url, f"{name}/%") for name in expected}
        if counts != expected:
            raise RuntimeError(f"documents stored: {counts}, expected {expected}")
    figures["machine"] = machine_info(url)
    return figures


def searches(  # noqa: PLR0917 (the run's parts)
    args: argparse.Namespace,
    env: dict[str, str],
    pool: Any,
    servers: dict[str, Path | None],
    token: str,
    queries: Sequence[str],
    work: Path,
) -> dict[str, Any]:
    results: dict[str, list[float]] = {name: [] for name in [*servers, "in-process"]}
    for r in range(args.rounds):
        for i, (name, src) in enumerate(servers.items()):
            with serving(env, work / f"serve-search-{r}-{i}.log", src) as service:
                got = http_searches(pool, service.url, token, queries, args.seconds)
            results[name] += got
            print(f"round {r + 1} search over HTTP ({name}): {side(got)}")
        got = in_process_searches(env, queries, args.seconds)
        results["in-process"] += got
        print(f"round {r + 1} search in-process: {side(got)}")
    return {name: side(t) for name, t in results.items()}


def uploads(  # noqa: PLR0917 (the run's parts)
    args: argparse.Namespace,
    env: dict[str, str],
    pools: tuple[Any, Any],
    servers: dict[str, Path | None],
    token: str,
    work: Path,
) -> dict[str, Any]:
    """Each server's uploads (this checkout's also in batches), then ``ingest``: seconds,
    and CPU seconds by part."""
    pool, batch_pool = pools
    seconds: dict[str, float] = {}
    cpu: dict[str, dict[str, float]] = {}
    load: dict[str, float] = {}
    for i, (name, src) in enumerate(servers.items()):
        files = small_files(work / f"files-{i}", f"upload {name}", args.files)
        with serving(env, work / f"serve-upload-{i}.log", src, *args.serve_options) as service:
            meter = CpuMeter.start(args.postgres_pid, service.pid)
            with profiling(args.profile, service.pid, f"serve-{i}.txt") as profiled:
                load[name] = os.getloadavg()[0]
                seconds[name], clients = http_uploads(
                    pool, service.url, token, work, files, args.upload_client
                )
            cpu[name] = meter.read() | {"clients": clients}
            _said(name, seconds, load, cpu, args.files, profiled)
            if src is not None:
                continue  # another checkout may have no batch uploads
            batched = f"{name}, batches of {args.batch_size}"
            files = small_files(work / "files-batch", "batch", args.files)
            meter = CpuMeter.start(args.postgres_pid, service.pid)
            with profiling(args.profile, service.pid, f"serve-{i}-batch.txt") as profiled:
                load[batched] = os.getloadavg()[0]
                seconds[batched], clients = http_batch_uploads(
                    batch_pool,
                    service.url,
                    token,
                    work,
                    files,
                    args.batch_size,
                    args.batch_clients,
                )
            cpu[batched] = meter.read() | {"clients": clients}
            _said(batched, seconds, load, cpu, args.files, profiled)
    small_files(work / "files-ingest", "ingest", args.files)
    meter = CpuMeter.start(args.postgres_pid)
    load["ingest"] = os.getloadavg()[0]
    seconds["ingest"] = ingest_seconds(env, work / "files-ingest")
    cpu["ingest"] = meter.read()
    print(f"ingest: {args.files} files in {seconds['ingest']:.1f} s, load {load['ingest']:.1f};"
          f" CPU ms per file: {per_unit(cpu['ingest'], args.files)}")  # fmt: skip
    return {
        "files": args.files,
        "seconds": seconds,
        "cpu": cpu,
        "load": load,
        "batch_clients": args.batch_clients,
    }


def _said(  # noqa: PLR0917 (the run's parts)
    name: str,
    seconds: dict[str, float],
    load: dict[str, float],
    cpu: dict[str, dict[str, float]],
    files: int,
    profiled: Path | None,
) -> None:
    print(f"upload: {files} files over HTTP ({name}) in {seconds[name]:.1f} s,"
          f" load {load[name]:.1f}; CPU ms per file: {per_unit(cpu[name], files)}")  # fmt: skip
    if profiled is not None:
        print(f"profile of serve ({name}): {profiled}")


def per_unit(cpu: dict[str, float], units: int) -> dict[str, float]:
    """CPU milliseconds per unit, by part."""
    return {part: round(seconds * 1000 / units, 2) for part, seconds in cpu.items()}


@contextmanager
def profiling(folder: Path | None, pid: int, name: str) -> Iterator[Path | None]:
    """``py-spy record`` of process ``pid`` (collapsed stacks in ``folder/name``) while the
    block runs, when a folder is given (py-spy must be installed beside this Python: it is not
    a dependency of the project)."""
    if folder is None:
        yield None
        return
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / name
    spy = subprocess.Popen(
        [str(Path(sys.executable).with_name("py-spy")), "record", "--pid", str(pid), "--format", "raw", "--rate", "200", "--gil",
         "--output", str(out), "--nonblocking"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield out
    finally:
        spy.send_signal(2)
        spy.wait(60)


def _count(url: str, pattern: str) -> int:
    with connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) AS n FROM documents WHERE external_key LIKE %s", (pattern,)
        ).fetchone()
    assert row is not None
    return int(row["n"])


def report(figures: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    if "search" in figures:
        lines += search_lines(figures)
    if "upload" in figures:
        lines += upload_lines(figures["upload"])
    return lines


def search_lines(figures: dict[str, Any]) -> list[str]:
    search = figures["search"]
    own = search["in-process"]["p50"]
    rows = [
        [
            "`Index.search`, 16 Trio tasks in one process"
            if name == "in-process"
            else f"over HTTP, `serve` at {name}",
            f"{s['n']:,}",
            *(f"{s[p]:.1f}" for p in ("p50", "p95", "p99")),
            f"{s['p50'] / own:.2f}×",
        ]
        for name, s in search.items()
    ]
    ratio = search["this"]["p50"] / own
    return [
        f"## Search: {figures['chunks']:,} chunks, {MODEL}, {CLIENTS} concurrent clients",
        "",
        f"{figures['rounds']} rounds of {figures['seconds']:.0f} s per side, alternating;"
        " latency in ms.",
        "",
        *markdown_table(["", "searches", "p50", "p95", "p99", "p50 / in-process"], rows),
        "",
        f"Goal: HTTP p50 ≤ {SEARCH_GOAL}× in-process: {ratio:.2f}× —"
        f" {verdict(ratio <= SEARCH_GOAL)}.",
        "",
    ]


def upload_lines(up: dict[str, Any]) -> list[str]:
    rate = {name: up["files"] / s for name, s in up["seconds"].items()}
    rows = [
        [
            _upload_row(name, up),
            f"{up['seconds'][name]:.1f}",
            f"{r:.0f}",
            f"{r / rate['ingest']:.2f}×",
            f"{up['load'][name]:.1f}",
        ]
        for name, r in rate.items()
    ]
    ratios = {name: r / rate["ingest"] for name, r in rate.items() if name != "ingest"}
    goals = [
        f"Goal: HTTP ≥ {UPLOAD_GOAL}× ingest's files/s: {name} {ratio:.2f}× —"
        f" {verdict(ratio >= UPLOAD_GOAL)}."
        for name, ratio in ratios.items()
    ]
    parts = ("serve", "serve system", "clients", "children", "postgres", "machine")
    cpu_rows = [
        [name, *(f"{per_unit(cpu, up['files']).get(part, float('nan')):.2f}" for part in parts)]
        for name, cpu in up["cpu"].items()
    ]
    return [
        f"## Upload: {up['files']:,} small files (200-400 bytes)",
        "",
        *markdown_table(["", "seconds", "files/s", "files/s / ingest", "load average"], rows),
        "",
        *(line for goal in goals for line in (goal, "")),
        "CPU ms per file: `serve` (all its threads; `serve system`: its kernel share), the"
        " client processes, this bench's reaped children (the `ingest` process), PostgreSQL"
        " (postmaster and backends) and the whole machine (other load included).",
        "",
        *markdown_table(["", *parts], cpu_rows),
        "",
    ]


def _upload_row(name: str, up: dict[str, Any]) -> str:
    if name == "ingest":
        return "`trioindex ingest FOLDER` (one process, its start included)"
    if "batches" in name:
        return f"HTTP, `serve` at {name}, {up['batch_clients']} client processes"
    return f"HTTP, `serve` at {name}, one file per request, {CLIENTS} client processes"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="5k chunks, short runs; nothing is written"
    )
    parser.add_argument("--baseline", metavar="REF", help="also serve REF's src/ (e.g. main)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--only", choices=["search", "upload"], help="run one part (nothing is written)"
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="py-spy each upload server, collapsed stacks in DIR/serve-N.txt",
    )
    parser.add_argument(
        "--upload-client",
        choices=["http.client", "httpx"],
        default="http.client",
        help="the upload clients' HTTP library (default http.client)",
    )
    parser.add_argument(
        "--serve-option",
        dest="serve_options",
        action="append",
        default=[],
        metavar="OPTION",
        help="an option for every upload server, e.g. --serve-option=--workers=2 (repeatable)",
    )
    parser.add_argument(
        "--batch-size", type=int, default=50, help="files per batch upload (default 50)"
    )
    parser.add_argument(
        "--batch-clients", type=int, default=4, help="batch upload client processes (default 4)"
    )
    args = parser.parse_args()
    args.chunks, args.seconds, args.files = (
        (5_000, 4.0, 200) if args.quick else (100_000, 15.0, 1_000)
    )
    began = time.monotonic()
    with (
        BenchPostgres() as pg,
        pg.fresh_database("http") as url,
        tempfile.TemporaryDirectory() as tmp,
    ):
        args.postgres_pid = int((pg.home / "pgdata" / "postmaster.pid").read_text().split()[0])
        figures = run(args, url, Path(tmp))
    body = report(figures)
    command = "just bench-http" + (f" --baseline {args.baseline}" if args.baseline else "")
    command += f" --only {args.only}" if args.only else ""
    head = page_head("HTTP service next to the Python API", utc_now(), command, time.monotonic() - began,
                     figures["machine"], about=__doc__ or "")  # fmt: skip
    print("\n".join(body))
    if not (args.quick or args.only):
        REPORT.write_text("\n".join([*head, *body]))
        print(f"wrote {REPORT}")


if __name__ == "__main__":
    main()
