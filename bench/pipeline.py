"""Pipeline benchmark: real documents through real worker processes, next to what the
embedding backend could do with the same requests, and enqueue → INDEXED latency when idle.

Each scenario gets a fresh database of one embedded PostgreSQL and a fresh folder store:

1. **HTTP embedder.** ``testkit.documents.write_corpus`` files (txt / md / html / docx / pdf)
   are ingested with :func:`trioindex.ingest.ingest_paths`, then ``trioindex worker --drain``
   processes (configured only through ``TRIOINDEX_*``) index them against
   ``testkit.embed_server`` in its own process. Next to it, the server's capacity for the
   *same* requests (a raw ``httpx`` client replaying the recorded batch sizes) and with full
   batches.
2. **Local model.** The same with ``embedding.api = local``, next to
   ``SentenceTransformer.encode`` of the stored chunk texts in this process.
3. **Idle latency.** One idle worker (NOTIFY on); documents ingested one at a time; latency =
   job ``finished_at`` − ``created_at``, and enqueue returned → SUCCEEDED seen (10 ms polling).

Run ``.venv/bin/python -m bench.pipeline``; ``--quick`` is a smoke run that writes its files to
a temporary folder unless ``--out`` says otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import os
import random
import resource
import shutil
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import trio

from bench.common import (
    BenchPostgres,
    Panel,
    Session,
    add_out,
    bench_parser,
    cdf,
    column_table,
    cpu_seconds,
    machine_info,
    markdown_table,
    page_head,
    percentiles,
    plot_panels,
    verdict,
)
from bench.harness import (
    RawEncode,
    RawRun,
    RssSampler,
    folder_env,
    ingest_folder,
    load_raw_model,
    log_tail,
    machine_busy_seconds,
    raw_capacity,
    raw_encode,
    tei_settings,
    wait_process,
)
from testkit.documents import write_corpus
from testkit.embed_process import EmbedServerProcess
from testkit.processes import query, spawn
from trioindex.config import default_settings, load_settings
from trioindex.embedding.local import DEFAULT_MODEL
from trioindex.ingest import SourceFile, ingest_file
from trioindex.pipeline.chunk_values import ChunkingPolicy
from trioindex.pipeline.chunking import Chunker
from trioindex.pipeline.parse_process import ParseRequest, parse_document
from trioindex.services import open_services

HTTP_DIMENSION = 1024
LOCAL_DIMENSION = 384
BATCH = 32  # embedding.batch-size default, also the fake server's max_client_batch_size
IN_FLIGHT = 4  # embedding.max-in-flight default
SENTENCES = 20  # per paragraph in write_corpus: ~5,700 characters per document
COPIES = 6  # 24 files per copy -> 144 documents
QUICK_COPIES = 2
LOCAL_COPIES = 1
LOCAL_CONCURRENCY = 4
IDLE_DOCUMENTS = 30
QUICK_IDLE_DOCUMENTS = 8
IDLE_GAP = (0.05, 0.15)
IDLE_LATENCY_MS = 20.0
POLL_SECONDS = 0.01
WORKER_LIMIT_S = 600.0
RAW_SECONDS = 2.0
# Other processes using more than this many cores during a run make a model-vs-model ratio
# meaningless on two cores; the reading says so instead of explaining noise.
TARGET_RATIO = 0.9


@attrs.frozen
class Scenario:
    name: str
    latency_ms: float
    processes: int
    concurrency: int

    @property
    def label(self) -> str:
        return f"{self.latency_ms:.0f} ms, {self.processes}×{self.concurrency}"


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("fast server", 20.0, 1, 8),
    Scenario("fast server, two workers", 20.0, 2, 4),
    Scenario("slow server", 200.0, 1, 8),
    # the worker's default job slots with a remote embedder (256; these pinned 8 before it)
    Scenario("fast server, default concurrency", 20.0, 1, 256),
)
QUICK_SCENARIOS: tuple[Scenario, ...] = (Scenario("fast server", 20.0, 1, 8),)


# ---------------------------------------------------------------------------------------------
# values


@attrs.frozen
class RunFigures:
    """One drain of the queue by worker processes."""

    documents: int
    succeeded: int
    chunks: int
    active_s: float  # first claim -> last job finished
    process_s: float  # spawn -> every worker exited
    worker_cpu_s: float  # inside the active window
    worker_lifetime_cpu_s: float  # spawn to exit, start-up included
    other_cores: float  # CPU other processes on the machine used meanwhile, in cores
    postgres_cpu_s: float
    peak_rss_mb: float
    phases_ms: dict[str, float]  # mean per job
    by_format: dict[str, dict[str, float]]
    load_average_1m: float

    @property
    def documents_per_s(self) -> float:
        return self.succeeded / self.active_s if self.active_s > 0 else float("nan")

    @property
    def chunks_per_s(self) -> float:
        return self.chunks / self.active_s if self.active_s > 0 else float("nan")

    def as_json(self) -> dict[str, Any]:
        return {
            "documents": self.documents,
            "succeeded": self.succeeded,
            "chunks": self.chunks,
            "active_s": round(self.active_s, 3),
            "process_s": round(self.process_s, 3),
            "documents_per_s": round(self.documents_per_s, 2),
            "chunks_per_s": round(self.chunks_per_s, 1),
            "worker_cpu_ms_per_document": round(self.worker_cpu_s * 1000 / self.documents, 2),
            "worker_lifetime_cpu_s": round(self.worker_lifetime_cpu_s, 2),
            "other_processes_cores": round(self.other_cores, 2),
            "postgres_cpu_ms_per_document": round(self.postgres_cpu_s * 1000 / self.documents, 2),
            "peak_rss_mb": round(self.peak_rss_mb, 1),
            "phases_ms_per_job": {k: round(v, 1) for k, v in self.phases_ms.items()},
            "by_format": self.by_format,
            "load_average_1m_before": round(self.load_average_1m, 2),
        }


@attrs.frozen
class HttpResult:
    scenario: Scenario
    run: RunFigures
    requests: int
    mean_batch: float
    replay: RawRun  # the same batch sizes, raw client
    full_batches: RawRun  # the same chunks in batches of BATCH, raw client

    @property
    def efficiency(self) -> float:
        return self.run.chunks_per_s / self.replay.inputs_per_s

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.scenario.name,
            "label": self.scenario.label,
            "latency_ms": self.scenario.latency_ms,
            "processes": self.scenario.processes,
            "max_concurrency": self.scenario.concurrency,
            "max_in_flight_per_process": IN_FLIGHT,
            "batch_size": BATCH,
            **self.run.as_json(),
            "embedding_requests": self.requests,
            "mean_batch": round(self.mean_batch, 2),
            "capacity_same_requests_chunks_per_s": round(self.replay.inputs_per_s, 1),
            "capacity_full_batches_chunks_per_s": round(self.full_batches.inputs_per_s, 1),
            "efficiency": round(self.efficiency, 3),
            "replay": self.replay.as_json(),
            "full_batches": self.full_batches.as_json(),
        }


@attrs.frozen
class LocalResult:
    run: RunFigures
    raw: RawEncode
    torch_threads: int

    @property
    def efficiency(self) -> float:
        return self.run.chunks_per_s / self.raw.chunks_per_s

    def as_json(self) -> dict[str, Any]:
        return {
            "model": DEFAULT_MODEL,
            "dimension": LOCAL_DIMENSION,
            "max_concurrency": LOCAL_CONCURRENCY,
            **self.run.as_json(),
            "raw_encode_chunks_per_s": round(self.raw.chunks_per_s, 2),
            "raw_encode_s": round(self.raw.wall_s, 2),
            "raw_encode_cpu_ms_per_document": round(
                self.raw.cpu_s * 1000 / max(self.run.succeeded, 1), 1
            ),
            "efficiency": round(self.efficiency, 3),
            "raw_encode_other_processes_cores": round(self.raw.other_cores, 2),
            "torch_threads": self.torch_threads,
        }


@attrs.frozen
class IdleResult:
    documents: int
    db_ms: tuple[float, ...]  # finished_at - created_at
    seen_ms: tuple[float, ...]  # enqueue returned -> SUCCEEDED seen
    by_format: dict[str, float]  # median db_ms

    def as_json(self) -> dict[str, Any]:
        return {
            "documents": self.documents,
            "embedding_latency_ms": IDLE_LATENCY_MS,
            "db": {k: round(v, 1) for k, v in percentiles(self.db_ms).items()},
            "seen": {k: round(v, 1) for k, v in percentiles(self.seen_ms).items()},
            "median_by_format_ms": {k: round(v, 1) for k, v in self.by_format.items()},
            "db_ms": [round(v, 1) for v in self.db_ms],
            "seen_ms": [round(v, 1) for v in self.seen_ms],
        }


# ---------------------------------------------------------------------------------------------
# setup


def scenario_env(
    url: str, root: Path, concurrency: int, server: EmbedServerProcess | None
) -> dict[str, str]:
    """A worker's ``TRIOINDEX_*`` settings: TEI against ``server``, or the local model."""
    embedding = (
        {**tei_settings(server, HTTP_DIMENSION), "EMBEDDING_BATCH_SIZE": str(BATCH)}
        if server is not None
        else {"EMBEDDING_API": "local"}
    )
    return folder_env(url, root, concurrency, EMBEDDING_MAX_IN_FLIGHT=str(IN_FLIGHT), **embedding)


# ---------------------------------------------------------------------------------------------
# one drain by worker processes

_PHASES_SQL = """
SELECT v.original_name, j.chunk_count,
       extract(epoch FROM a.started_at)::float8 AS claimed,
       extract(epoch FROM a.parse_started_at)::float8 AS parse_start,
       extract(epoch FROM a.chunks_stored_at)::float8 AS chunks_stored,
       extract(epoch FROM a.embedding_started_at)::float8 AS embed_start,
       extract(epoch FROM a.embeddings_stored_at)::float8 AS embeddings_stored,
       extract(epoch FROM j.finished_at)::float8 AS finished
FROM embedding_jobs j
JOIN document_versions v ON v.id = j.document_version_id
JOIN embedding_job_attempts a ON a.embedding_job_id = j.id AND a.status = 'SUCCEEDED'
WHERE j.status = 'SUCCEEDED' AND a.parse_started_at IS NOT NULL
  AND a.embeddings_stored_at IS NOT NULL
"""
# the transactions that mark a job's steps: (phase, from, to)
_PHASES = (
    ("claim → parse prepared", "claimed", "parse_start"),
    ("read + extract + chunk", "parse_start", "chunks_stored"),
    ("store chunks → embed prepared", "chunks_stored", "embed_start"),
    ("embedding requests", "embed_start", "embeddings_stored"),
    ("store vectors → complete", "embeddings_stored", "finished"),
    ("whole job", "claimed", "finished"),
)


def _phases(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Mean ms per job between the transactions that mark the steps (each is its ``now()``)."""
    return {
        name: statistics.fmean((r[b] - r[a]) * 1000 for r in rows) if rows else float("nan")
        for name, a, b in _PHASES
    }


def _by_format(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(Path(row["original_name"]).suffix.lstrip("."), []).append(row)
    return {
        fmt: {
            "documents": len(items),
            "chunks_per_document": round(statistics.fmean(r["chunk_count"] for r in items), 2),
            "extract_chunk_ms_median": round(
                statistics.median((r["chunks_stored"] - r["parse_start"]) * 1000 for r in items),
                1,
            ),
        }
        for fmt, items in sorted(groups.items())
    }


def drain(
    pg: BenchPostgres,
    url: str,
    env: dict[str, str],
    *,
    processes: int,
    logs: Path,
    label: str,
    server: EmbedServerProcess | None = None,
) -> RunFigures:
    """Start ``processes`` workers with ``--drain`` on the queued jobs; figures once they exit."""
    documents = int(query(url, "SELECT count(*) AS n FROM embedding_jobs")[0]["n"])
    pg.quiesce(url)
    load = os.getloadavg()[0]
    before = pg.counters(url, settle_seconds=5)
    children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy0, own0 = machine_busy_seconds(), cpu_seconds()
    server0 = server.cpu_seconds() if server is not None else 0.0
    began = time.monotonic()
    log_paths = [logs / f"{label}-worker-{i}.log" for i in range(processes)]
    workers = [spawn(env, "worker", "--drain", log=path) for path in log_paths]
    samplers = [RssSampler(w.pid, interval=0.2).__enter__() for w in workers]
    try:
        for worker, path in zip(workers, log_paths, strict=True):
            code = wait_process(worker, WORKER_LIMIT_S, f"worker {worker.pid}")
            if code != 0:
                raise RuntimeError(f"worker exited {code}:\n{log_tail(path)}")
    finally:
        for sampler in samplers:
            sampler.__exit__(None, None, None)
        for worker in workers:
            if worker.poll() is None:  # only our own children, by handle
                worker.kill()
                worker.wait()
    process_s = time.monotonic() - began
    busy1, own1 = machine_busy_seconds(), cpu_seconds()
    server1 = server.cpu_seconds() if server is not None else 0.0
    children1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    after = pg.counters(url, settle_seconds=10)
    rows = query(url, _PHASES_SQL)
    summary = query(
        url,
        """SELECT count(*) FILTER (WHERE status = 'SUCCEEDED') AS ok,
                  count(*) FILTER (WHERE status <> 'SUCCEEDED') AS other,
                  (SELECT count(*) FROM embeddings) AS vectors
           FROM embedding_jobs""",
    )[0]
    if summary["other"]:
        raise RuntimeError(f"{label}: {summary['other']} jobs did not succeed")
    first, last = min(r["claimed"] for r in rows), max(r["finished"] for r in rows)
    # CPU inside the active window only: start-up (imports, migrations check, a local model's
    # load) is not per-document work. The whole-life figure is kept for reference.
    window_cpu = sum(s.cpu_between(first, last) for s in samplers)
    lifetime_cpu = (children1.ru_utime + children1.ru_stime) - (
        children0.ru_utime + children0.ru_stime
    )
    postgres_cpu = after.server_cpu_s - before.server_cpu_s
    others = (busy1 - busy0) - lifetime_cpu - (own1 - own0) - (server1 - server0) - postgres_cpu
    return RunFigures(
        documents=documents,
        succeeded=int(summary["ok"]),
        chunks=int(summary["vectors"]),
        active_s=last - first,
        process_s=process_s,
        worker_cpu_s=window_cpu,
        worker_lifetime_cpu_s=lifetime_cpu,
        other_cores=max(0.0, others / process_s),
        postgres_cpu_s=postgres_cpu,
        peak_rss_mb=max(s.peak_mb for s in samplers),
        phases_ms=_phases(rows),
        by_format=_by_format(rows),
        load_average_1m=load,
    )


def _chunk_groups(url: str) -> list[list[str]]:
    """Every stored chunk text, grouped by document, in chunk order."""
    rows = query(
        url,
        "SELECT document_version_id AS v, content FROM document_chunks ORDER BY v, chunk_index",
    )
    groups: dict[Any, list[str]] = {}
    for row in rows:
        groups.setdefault(row["v"], []).append(row["content"])
    return list(groups.values())


# ---------------------------------------------------------------------------------------------
# experiment 1: HTTP


def run_http(pg: BenchPostgres, scenario: Scenario, corpus: Path, work: Path) -> HttpResult:
    root = work / scenario.name.replace(" ", "-").replace(",", "")
    root.mkdir(parents=True)
    with (
        EmbedServerProcess(
            latency_ms=scenario.latency_ms,
            dimension=HTTP_DIMENSION,
            max_batch_size=BATCH,
            log_path=root / "server.log",
        ) as server,
        pg.fresh_database("pipeline") as url,
    ):
        env = scenario_env(url, root, scenario.concurrency, server)
        ingest_folder(env, corpus)
        server.reset_stats()
        run = drain(
            pg, url, env, processes=scenario.processes, logs=root, label="http", server=server
        )
        sizes: list[int] = list(server.stats()["batch_sizes"])
        texts = [t for group in _chunk_groups(url) for t in group]
        # the same number and sizes of requests, with the stored chunk texts
        stream = itertools.cycle(texts)
        replay_batches = [list(itertools.islice(stream, size)) for size in sizes]
        # Both cycled for a few seconds (sent once, a few dozen requests would be mostly
        # warm-up and tail) and at least one full pass (a slow server must see the whole mix).
        concurrency = IN_FLIGHT * scenario.processes
        replay, full_run = (
            raw_capacity(
                server, batches, concurrency=concurrency, seconds=RAW_SECONDS, full_pass=True
            )
            for batches in (
                replay_batches,
                [texts[i : i + BATCH] for i in range(0, len(texts), BATCH)],
            )
        )
    return HttpResult(
        scenario=scenario,
        run=run,
        requests=len(sizes),
        mean_batch=statistics.fmean(sizes) if sizes else float("nan"),
        replay=replay,
        full_batches=full_run,
    )


def parse_cpu_ms_per_document(files: Sequence[Path]) -> float:
    """CPU of extracting and chunking every file once, per document, in this process with the
    workers' chunking, warm (a first pass imports the parsers). No process hand-off, database or
    embedding: what parsing alone costs, whoever does it."""
    parsing = default_settings().parsing
    size = parsing.chunk_max_characters
    chunker = Chunker(ChunkingPolicy(max_size=size, overlap=int(size * parsing.chunk_overlap)))
    requests = [
        ParseRequest(data=data, sha256=hashlib.sha256(data).hexdigest(), name=path.name,
                     content_type=None, max_bytes=len(data))
        for path in files
        for data in [path.read_bytes()]
    ]  # fmt: skip
    for request in requests:
        parse_document(request, chunker)
    began = time.process_time()
    for request in requests:
        parse_document(request, chunker)
    return (time.process_time() - began) / len(requests) * 1e3


# ---------------------------------------------------------------------------------------------
# experiment 2: the local model


def run_local(pg: BenchPostgres, corpus: Path, work: Path) -> LocalResult:
    root = work / "local"
    root.mkdir(parents=True)
    with pg.fresh_database("pipeline_local") as url:
        env = scenario_env(url, root, LOCAL_CONCURRENCY, None)
        ingest_folder(env, corpus)
        run = drain(pg, url, env, processes=1, logs=root, label="local")
        groups = _chunk_groups(url)
    model, _, threads = load_raw_model()
    raw_encode(model, [["warm-up"] * 8], BATCH)  # the first call pays one-off costs
    return LocalResult(run=run, raw=raw_encode(model, groups, BATCH), torch_threads=threads)


# ---------------------------------------------------------------------------------------------
# experiment 3: idle latency

_JOB_STATE = """SELECT status, extract(epoch FROM created_at)::float8 AS created,
                       extract(epoch FROM finished_at)::float8 AS finished
                FROM embedding_jobs WHERE id = %s"""
_LISTENING = "SELECT count(*) AS n FROM pg_stat_activity WHERE query ILIKE 'LISTEN%%'"


def run_idle(
    pg: BenchPostgres, files: Sequence[Path], count: int, work: Path, seed: int
) -> IdleResult:
    root = work / "idle"
    root.mkdir(parents=True)
    rng = random.Random(seed)
    chosen = [files[i % len(files)] for i in range(count)]
    with (
        EmbedServerProcess(
            latency_ms=IDLE_LATENCY_MS,
            dimension=HTTP_DIMENSION,
            max_batch_size=BATCH,
            log_path=root / "server.log",
        ) as server,
        pg.fresh_database("pipeline_idle") as url,
    ):
        env = scenario_env(url, root, 2, server)
        settings = load_settings(environ=env, cwd=root)
        worker = spawn(env, "worker", log=root / "idle-worker.log")
        try:
            deadline = time.monotonic() + 60
            while not query(url, _LISTENING)[0]["n"]:
                if worker.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"idle worker not listening:\n{log_tail(root / 'idle-worker.log')}"
                    )
                time.sleep(0.1)

            async def go() -> list[tuple[str, float, float]]:
                measured: list[tuple[str, float, float]] = []
                async with open_services(settings) as services:
                    for i, path in enumerate(chosen):
                        await trio.sleep(rng.uniform(*IDLE_GAP))
                        result = await ingest_file(
                            SourceFile(path, f"idle-{i}-{path.name}"),
                            db=services.db,
                            store=services.storage,
                            model_id=services.model.id,
                            max_attempts=settings.worker.max_attempts,
                        )
                        returned = time.time()
                        with trio.fail_after(60):
                            while True:
                                rows = await trio.to_thread.run_sync(
                                    query, url, _JOB_STATE, result.job_id
                                )
                                if rows and rows[0]["status"] in ("SUCCEEDED", "FAILED"):
                                    break
                                await trio.sleep(POLL_SECONDS)
                        seen, state = time.time(), rows[0]
                        if state["status"] != "SUCCEEDED":
                            raise RuntimeError(f"idle job for {path.name} ended {state['status']}")
                        db_ms = (state["finished"] - state["created"]) * 1000
                        measured.append((path.suffix[1:], db_ms, (seen - returned) * 1000))
                return measured

            measured = trio.run(go)
        finally:
            worker.terminate()  # SIGTERM: our own child, by handle
            wait_process(worker, 60, "idle worker")
    formats: dict[str, list[float]] = {}
    for fmt, db_ms, _ in measured:
        formats.setdefault(fmt, []).append(db_ms)
    return IdleResult(
        documents=len(measured),
        db_ms=tuple(m[1] for m in measured),
        seen_ms=tuple(m[2] for m in measured),
        by_format={k: statistics.median(v) for k, v in sorted(formats.items())},
    )


# ---------------------------------------------------------------------------------------------
# report


def plot(
    http: Sequence[HttpResult], local: LocalResult | None, idle: IdleResult, path: Path
) -> Path:
    extra = [local] if local is not None else []
    rates = Panel(
        "Documents through real workers",
        "chunks/s (log); label = pipeline / same-request capacity",
        groups=[r.scenario.label for r in http] + ["local model"] * len(extra),
        bars={
            f"capacity, full batches of {BATCH}": [r.full_batches.inputs_per_s for r in http]
            + [float("nan")] * len(extra),
            "capacity, the same requests / raw encode": [r.replay.inputs_per_s for r in http]
            + [x.raw.chunks_per_s for x in extra],
            "pipeline (workers)": [r.run.chunks_per_s for r in http]
            + [x.run.chunks_per_s for x in extra],
        },
        notes=[f"{r.efficiency:.2f}" for r in http] + [f"{x.efficiency:.2f}" for x in extra],
        log=True,
    )
    latency = Panel(
        f"Idle worker: enqueue → INDEXED ({idle.documents} documents, NOTIFY)",
        "fraction of documents",
        xlabel="ms",
        lines={
            "finished − created (database)": cdf(idle.db_ms),
            "enqueue returned → seen SUCCEEDED": cdf(idle.seen_ms),
        },
    )
    return plot_panels(path, [rates, latency], (13, 5))


_COLUMNS: list[tuple[str, Callable[[HttpResult], str]]] = [
    ("scenario", lambda r: f"{r.scenario.name} ({r.scenario.label})"),
    ("documents", lambda r: str(r.run.succeeded)),
    ("chunks", lambda r: str(r.run.chunks)),
    ("documents/s", lambda r: f"{r.run.documents_per_s:.1f}"),
    ("chunks/s", lambda r: f"{r.run.chunks_per_s:.0f}"),
    ("capacity, same requests", lambda r: f"{r.replay.inputs_per_s:,.0f}"),
    ("pipeline / capacity", lambda r: f"{r.efficiency:.2f}"),
    ("capacity, full batches", lambda r: f"{r.full_batches.inputs_per_s:,.0f}"),
    ("requests (mean batch)", lambda r: f"{r.requests} ({r.mean_batch:.1f})"),
    ("worker CPU ms/doc", lambda r: f"{r.run.worker_cpu_s * 1000 / r.run.documents:.0f}"),
    ("PostgreSQL CPU ms/doc", lambda r: f"{r.run.postgres_cpu_s * 1000 / r.run.documents:.0f}"),
    ("peak RSS MiB", lambda r: f"{r.run.peak_rss_mb:.0f}"),
    ("other processes, cores", lambda r: f"{r.run.other_cores:.2f}"),
]
_LOCAL_COLUMNS: list[tuple[str, Callable[[LocalResult], str]]] = [
    ("documents", lambda x: str(x.run.succeeded)),
    ("chunks", lambda x: str(x.run.chunks)),
    ("documents/s", lambda x: f"{x.run.documents_per_s:.2f}"),
    ("chunks/s", lambda x: f"{x.run.chunks_per_s:.1f}"),
    ("raw encode chunks/s", lambda x: f"{x.raw.chunks_per_s:.1f}"),
    ("pipeline / raw", lambda x: f"{x.efficiency:.2f}"),
    ("worker CPU ms/doc", lambda x: f"{x.run.worker_cpu_s * 1000 / x.run.documents:.0f}"),
    ("raw encode CPU ms/doc", lambda x: f"{x.raw.cpu_s * 1000 / max(x.run.succeeded, 1):.0f}"),
    ("peak RSS MiB", lambda x: f"{x.run.peak_rss_mb:.0f}"),
    (
        "other processes, cores (run / raw)",
        lambda x: f"{x.run.other_cores:.2f} / {x.raw.other_cores:.2f}",
    ),
]
_FORMAT_COLUMNS: list[tuple[str, Callable[[tuple[str, dict[str, float]]], str]]] = [
    ("format", lambda kv: kv[0]),
    ("documents", lambda kv: f"{kv[1]['documents']:.0f}"),
    ("chunks/document", lambda kv: f"{kv[1]['chunks_per_document']:.1f}"),
    ("read + extract + chunk ms (median)", lambda kv: f"{kv[1]['extract_chunk_ms_median']:.0f}"),
]


def _markdown(
    head: list[str],
    results: tuple[dict[str, Any], Sequence[HttpResult], LocalResult | None, IdleResult],
    png_name: str,
) -> str:
    corpus, http, local, idle = results
    runs = [(r.scenario.label, r.run) for r in http]
    runs += [("local model", local.run)] if local is not None else []
    db, seen = percentiles(idle.db_ms), percentiles(idle.seen_ms)
    lines = [
        *head,
        f"Corpus: {corpus['files']} files "
        f"({', '.join(f'{n} {k}' for k, n in corpus['by_format'].items())}), "
        f"{corpus['bytes'] / 1024:,.0f} KiB. Throughput is over the active window (first claim "
        "→ last job finished); *other processes* = CPU the rest of the machine used meanwhile.",
        "",
        *_parse_cost(corpus),
        "",
        "## HTTP embedder (TEI protocol, fake server, 1024 dimensions)",
        "",
        f"batch-size {BATCH}, max-in-flight {IN_FLIGHT} per process, 1,500-character chunks.",
        "",
        *column_table(_COLUMNS, http),
        "",
        "Where a job's time goes (between the transactions that mark each step):",
        "",
        *markdown_table(
            ["phase (mean ms per job)", *(name for name, _ in runs)],
            [
                [phase, *(f"{run.phases_ms[phase]:.0f}" for _, run in runs)]
                for phase in (runs[0][1].phases_ms if runs else {})
            ],
        ),
    ]
    if http:
        lines += [
            "",
            f"Per format ({http[0].scenario.label}):",
            "",
            *column_table(_FORMAT_COLUMNS, http[0].run.by_format.items()),
        ]
    if local is not None:
        lines += [
            "",
            "## Local model (all-MiniLM-L6-v2, 384 dimensions)",
            "",
            f"max-concurrency {LOCAL_CONCURRENCY}, 256-token chunks, torch threads "
            f"{local.torch_threads}.",
            "",
            *column_table(_LOCAL_COLUMNS, [local], "r" * len(_LOCAL_COLUMNS)),
        ]
    lines += [
        "",
        "## Idle worker: enqueue → INDEXED",
        "",
        f"Server latency {IDLE_LATENCY_MS:.0f} ms; {idle.documents} documents.",
        "",
        *markdown_table(
            ("measure", "p50 ms", "p95 ms", "p99 ms"),
            [
                ["job finished_at − created_at (database)", *(f"{v:.0f}" for v in db.values())],
                [
                    "enqueue returned → SUCCEEDED seen (10 ms polling)",
                    *(f"{v:.0f}" for v in seen.values()),
                ],
            ],
        ),
        "",
        "Median by format (database): "
        + ", ".join(f"{k} {v:.0f} ms" for k, v in idle.by_format.items())
        + ".",
        "",
        f"![pipeline benchmark]({png_name})",
        "",
        "## Reading",
        "",
        *_reading(http, local, corpus.get("parse_cpu_ms_per_doc")),
    ]
    return "\n".join(lines).rstrip() + "\n"


def _parse_cost(corpus: dict[str, Any]) -> list[str]:
    if "parse_cpu_ms_per_doc" not in corpus:
        return []
    return [
        "Extracting and chunking the corpus once in one process, warm, with the workers' "
        "chunking and nothing else (no database, embedding or process hand-off): "
        f"{corpus['parse_cpu_ms_per_doc']:.2f} ms of CPU per document "
        "(`parse_cpu_ms_per_document`); the reading below turns it into the cores parsing "
        "alone would need at the target rate.",
        "",
    ]


def _parse_ceiling(r: HttpResult, parse_ms: float) -> str:
    """What parsing alone would take of the machine's cores at 0.9 of the server's capacity."""
    chunks_per_doc = r.run.chunks / r.run.documents
    cores = os.cpu_count() or 1
    needs = [
        (what, TARGET_RATIO * capacity / chunks_per_doc * parse_ms / 1e3)
        for what, capacity in (
            ("the same requests", r.replay.inputs_per_s),
            ("full batches", r.full_batches.inputs_per_s),
        )
    ]
    return "; ".join(
        f"at {TARGET_RATIO} of its capacity for {what}, parsing alone would use {n:.1f} of the "
        f"{cores} cores"
        for what, n in needs
    )


def _reading(
    http: Sequence[HttpResult], local: LocalResult | None, parse_ms: float | None = None
) -> list[str]:
    """The targets' outcomes, computed from the figures so a re-run cannot leave a stale one."""
    out = [
        f"- **{r.scenario.name}:** {r.efficiency:.2f} of the server's capacity for the same "
        f"requests (target {TARGET_RATIO}: {verdict(r.efficiency >= TARGET_RATIO)}); mean "
        f"request batch {r.mean_batch:.1f} chunks"
        + (f" ({_parse_ceiling(r, parse_ms)})." if parse_ms is not None else ".")
        for r in http
    ]
    if local is not None:
        out.append(
            f"- **Local model:** {local.efficiency:.2f} of raw `encode` (target {TARGET_RATIO}: "
            f"{verdict(local.efficiency >= TARGET_RATIO)}); other processes used "
            f"{max(local.run.other_cores, local.raw.other_cores):.2f} cores meanwhile."
        )
    return out


# ---------------------------------------------------------------------------------------------
# main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = bench_parser(
        "pipeline",
        "Documents through real worker processes against the embedding backend's "
        "capacity, and idle enqueue → INDEXED latency.",
        "small corpus, one scenario",
    )
    parser.add_argument("--no-local", action="store_true", help="skip the local model")
    parser.add_argument("--seed", type=int, default=20240601, help="seed of the idle gaps")
    add_out(parser, "pipeline")
    return parser.parse_args(argv)


def _summary(run: RunFigures, capacity: float, efficiency: float) -> str:
    return (
        f"{run.documents_per_s:6.2f} docs/s  {run.chunks_per_s:6.1f} chunks/s  capacity "
        f"{capacity:6.1f}  efficiency {efficiency:.2f}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    session = Session.start("pipeline", args)
    quick: bool = args.quick
    work = Path(tempfile.mkdtemp(prefix="trioindex-bench-pipeline-work-"))
    try:
        copies = QUICK_COPIES if quick else COPIES
        files = write_corpus(work / "corpus", copies=copies, sentences=SENTENCES)
        local_files = write_corpus(work / "corpus-local", copies=LOCAL_COPIES, sentences=SENTENCES)
        corpus = {
            "copies": copies,
            "files": len(files),
            "bytes": sum(p.stat().st_size for p in files),
            "by_format": dict(Counter(p.suffix.lstrip(".") for p in files)),
            "parse_cpu_ms_per_doc": round(parse_cpu_ms_per_document(files), 2),
        }
        local: LocalResult | None = None
        with BenchPostgres() as pg:
            machine = machine_info(pg.admin_url)
            http = [
                run_http(pg, scenario, work / "corpus", work)
                for scenario in (QUICK_SCENARIOS if quick else SCENARIOS)
            ]
            for r in http:
                print(
                    f"{r.scenario.name:<26} {_summary(r.run, r.replay.inputs_per_s, r.efficiency)}"
                )
            if not args.no_local:
                local = run_local(pg, work / "corpus-local", work)
                print(
                    f"{'local model':<26} {_summary(local.run, local.raw.chunks_per_s, local.efficiency)}"
                )
            # every format in turn: txt, md, html, docx, pdf, txt, ...
            by_suffix: dict[str, list[Path]] = {}
            for path in local_files:
                by_suffix.setdefault(path.suffix, []).append(path)
            idle_files = [p for group in itertools.zip_longest(*by_suffix.values()) for p in group]
            count = QUICK_IDLE_DOCUMENTS if quick else IDLE_DOCUMENTS
            idle = run_idle(pg, [p for p in idle_files if p], count, work, args.seed)
            print(f"{'idle latency':<26} p50 {percentiles(idle.db_ms)['p50']:.0f} ms", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    options = {"quick": quick, "corpus": corpus, "sentences": SENTENCES}
    figures = {
        "options": {**options, "batch_size": BATCH, "max_in_flight": IN_FLIGHT},
        "http": [r.as_json() for r in http],
        "local": local.as_json() if local is not None else None,
        "idle": idle.as_json(),
    }
    return session.publish(
        machine,
        figures,
        lambda path: plot(http, local, idle, path),
        lambda date, elapsed, png_name: _markdown(
            page_head(
                "Pipeline benchmark", date, session.command, elapsed, machine, about=__doc__ or ""
            ),
            (corpus, http, local, idle),
            png_name,
        ),
    )


if __name__ == "__main__":
    raise SystemExit(main())
