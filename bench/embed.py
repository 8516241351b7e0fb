"""Embedding-step benchmark: chunks/s through prepare → embed → store + complete, next to what
the embedding backend itself delivers in the same run (each scenario on a fresh database).

1. **HTTP (TEI)** against ``testkit.embed_server`` in its own process (1024 dimensions, fixed
   latency 0 / 20 / 50 ms; batch sizes 1, 8, 32). Capacity = a minimal Trio + ``httpx`` client
   with ``max-in-flight`` (4) requests and nothing else, before and after the step run (mean).
   The step: jobs of 64 chunks staged (their chunk set stored) and claimed for real, then the
   worker's own steps (:class:`~trioindex.worker.wiring.PipelineSteps`: ``embed`` and
   ``complete``, its coalescer and group committers serving beside them) on each, 8 jobs at
   once, one shared ``TeiEmbedder`` and a pool of 4 (the defaults). The step's own ceiling:
   the same with an in-process embedder (and once without the HNSW index).
2. **The local model** (all-MiniLM-L6-v2 through ``open_embedder(api="local")``) against
   ``SentenceTransformer.encode`` on the same texts in the same batches, in the same process.

Also the client's CPU per 1024-dimension vector (orjson, validation, hashing, float32).
Run ``.venv/bin/python -m bench.embed``; ``--quick`` is a smoke run (temporary folder unless
``--out`` says otherwise).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import logging
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import orjson
import trio

from bench.common import (
    BenchPostgres,
    DbCounters,
    Panel,
    Session,
    add_out,
    bench_parser,
    column_table,
    cpu_seconds,
    machine_info,
    markdown_table,
    page_head,
    percentiles,
    plot_panels,
    verdict,
    warm_pool,
)
from bench.harness import (
    RawEncode,
    RawRun,
    chunk_texts,
    load_raw_model,
    machine_busy_seconds,
    raw_capacity,
    raw_encode,
    vector_costs,
)
from testkit.embed_process import EmbedServerProcess
from trioindex.config import default_settings
from trioindex.db import jobs as lifecycle
from trioindex.db.models import EmbeddingModel, ensure_model
from trioindex.db.pool import Database, connect
from trioindex.db.vector_index import build_vector_index
from trioindex.embedding import Embedder, EmbedderInfo, open_embedder
from trioindex.embedding.local import DEFAULT_MODEL
from trioindex.embedding.vectors import Vectors, validate_vectors
from trioindex.storage import AsyncObjectStore, FolderStore
from trioindex.values import Claim
from trioindex.worker.wiring import PipelineSteps, build_chunker

HTTP_MODEL = "BAAI/bge-m3"
HTTP_DIMENSION = 1024
LOCAL_DIMENSION = 384
LATENCIES_MS: tuple[float, ...] = (0.0, 20.0, 50.0)
BATCHES: tuple[int, ...] = (1, 8, 32)
QUICK_LATENCIES_MS: tuple[float, ...] = (0.0, 20.0)
QUICK_BATCHES: tuple[int, ...] = (1, 32)
IN_FLIGHT = 4  # embedding.max-in-flight default
JOB_CONCURRENCY = 8  # a worker's max-concurrency
POOL_SIZE = 4  # database.pool-size default
CHUNKS_PER_JOB = 64
TEXT_POOL = 512
TEXT_CHARACTERS = 1000
TARGET_RATIO = 0.9
# The step run is sized from the measured capacity to last about STEP_SECONDS at capacity.
STEP_SECONDS = 4.0
RAW_SECONDS = 2.0
MAX_STEP_CHUNKS = 3072
QUICK_STEP_SECONDS = 1.5
QUICK_RAW_SECONDS = 1.0
QUICK_MAX_STEP_CHUNKS = 512
LOCAL_BATCH = 32
LOCAL_JOBS = 3
LOCAL_CHUNKS_PER_JOB = 32
QUICK_LOCAL_JOBS = 1
QUICK_LOCAL_CHUNKS_PER_JOB = 16

logger = logging.getLogger("bench.embed")


# ---------------------------------------------------------------------------------------------
# values


@attrs.frozen
class StepRun:
    """One run of the embedding step over staged, claimed jobs."""

    jobs: int
    chunks: int
    stored: int
    wall_s: float
    client_cpu_s: float
    server_cpu_s: float | None  # the fake server process; None for the local model
    pg_cpu_s: float
    xact: int
    wal_bytes: int
    loop_lag_ms: dict[str, float]  # how late a 5 ms sleep woke up meanwhile: p50, p99
    other_cores: float  # CPU the rest of the machine used meanwhile, in cores

    @property
    def chunks_per_s(self) -> float:
        return self.stored / self.wall_s if self.wall_s > 0 else float("nan")

    def as_json(self) -> dict[str, Any]:
        per = 1000 / max(self.stored, 1)
        return {
            "jobs": self.jobs,
            "chunks": self.chunks,
            "stored": self.stored,
            "wall_s": round(self.wall_s, 3),
            "chunks_per_s": round(self.chunks_per_s, 1),
            "client_cpu_ms_per_chunk": round(self.client_cpu_s * per, 3),
            "server_cpu_ms_per_chunk": None
            if self.server_cpu_s is None
            else round(self.server_cpu_s * per, 3),
            "postgres_cpu_ms_per_chunk": round(self.pg_cpu_s * per, 3),
            "transactions": self.xact,
            "wal_bytes_per_chunk": round(self.wal_bytes / max(self.stored, 1), 1),
            "loop_lag_ms": {k: round(v, 2) for k, v in self.loop_lag_ms.items()},
            "other_processes_cores": round(self.other_cores, 2),
        }


@attrs.frozen
class HttpResult:
    latency_ms: float
    batch: int
    raw_before: RawRun
    raw_after: RawRun
    step: StepRun
    load_average_1m: float

    @property
    def label(self) -> str:
        return f"{self.latency_ms:.0f} ms / batch {self.batch}"

    @property
    def capacity(self) -> float:
        return (self.raw_before.inputs_per_s + self.raw_after.inputs_per_s) / 2

    @property
    def ratio(self) -> float:
        return self.step.chunks_per_s / self.capacity

    @property
    def ideal(self) -> float:
        """Chunks/s the server's latency allows: in-flight x batch / latency."""
        return IN_FLIGHT * self.batch / (self.latency_ms / 1000) if self.latency_ms else math.inf

    def as_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "latency_ms": self.latency_ms,
            "batch": self.batch,
            "in_flight": IN_FLIGHT,
            "job_concurrency": JOB_CONCURRENCY,
            "ideal_chunks_per_s": None if self.latency_ms == 0 else round(self.ideal, 1),
            "capacity_chunks_per_s": round(self.capacity, 1),
            "step_chunks_per_s": round(self.step.chunks_per_s, 1),
            "ratio": round(self.ratio, 3),
            "target_met": self.ratio >= TARGET_RATIO,
            "load_average_1m_before": round(self.load_average_1m, 2),
            "raw_before": self.raw_before.as_json(),
            "raw_after": self.raw_after.as_json(),
            "step": self.step.as_json(),
        }


@attrs.frozen
class LocalResult:
    batch: int
    raw_before: RawEncode
    raw_after: RawEncode
    step: StepRun
    load_seconds: float
    torch_threads: int

    @property
    def capacity(self) -> float:
        return (self.raw_before.chunks_per_s + self.raw_after.chunks_per_s) / 2

    @property
    def ratio(self) -> float:
        return self.step.chunks_per_s / self.capacity

    def as_json(self) -> dict[str, Any]:
        return {
            "model": DEFAULT_MODEL,
            "dimension": LOCAL_DIMENSION,
            "batch": self.batch,
            "torch_threads": self.torch_threads,
            "capacity_chunks_per_s": round(self.capacity, 2),
            "step_chunks_per_s": round(self.step.chunks_per_s, 2),
            "ratio": round(self.ratio, 3),
            "target_met": self.ratio >= TARGET_RATIO,
            "raw_before": self.raw_before.as_json(),
            "raw_after": self.raw_after.as_json(),
            "step": self.step.as_json(),
            "model_load_s": round(self.load_seconds, 1),
        }


# ---------------------------------------------------------------------------------------------
# staging: versions with their chunk set stored, and claimed jobs

_STAGE_SQL = """
WITH docs AS (
    INSERT INTO documents (external_key)
    SELECT 'embed-' || g FROM generate_series(1, %(jobs)s) AS g
    RETURNING id, external_key
), versions AS (
    INSERT INTO document_versions (document_id, version_no, storage_key, original_name,
                                   content_type, byte_size, sha256)
    SELECT id, 1, 'sha256/bench/' || external_key, external_key || '.txt', 'text/plain', 1,
           repeat('a', 64)
    FROM docs
    RETURNING id, document_id
), jobs AS (
    INSERT INTO embedding_jobs (document_version_id, embedding_model_id, max_attempts)
    SELECT id, %(model)s, 3 FROM versions
)
SELECT id, document_id FROM versions
"""

_COPY_CHUNKS = """COPY document_chunks (document_id, document_version_id, chunk_index, content,
    char_start, char_end, token_count, content_sha256) FROM STDIN"""


def stage_claims(
    url: str,
    texts: Sequence[str],
    jobs: int,
    chunks_per_job: int = CHUNKS_PER_JOB,
    *,
    model: str = HTTP_MODEL,
    dimension: int = HTTP_DIMENSION,
) -> list[Claim]:
    """``jobs`` versions with a chunk set of ``chunks_per_job`` chunks each (texts taken in
    turn from ``texts``), their PENDING jobs, all claimed by one registered worker (each claim
    finds its chunk set stored: it only embeds)."""
    with contextlib.closing(connect(url)) as conn:
        model_id = ensure_model(conn, model, dimension).id
        with conn.transaction():
            versions = conn.execute(_STAGE_SQL, {"jobs": jobs, "model": model_id}).fetchall()
            n = 0
            with conn.cursor().copy(_COPY_CHUNKS) as copy:
                for version in versions:
                    for index in range(chunks_per_job):
                        text = texts[n % len(texts)]
                        n += 1
                        digest = hashlib.sha256(text.encode()).hexdigest()
                        row = (version["document_id"], version["id"], index, text)
                        copy.write_row((*row, 0, len(text), len(text) // 4, digest))
        worker = lifecycle.register_worker(
            conn, hostname="bench-embed", pid=os.getpid(), version="bench", max_concurrency=jobs
        )
        claims = lifecycle.claim_jobs(conn, worker, jobs, 3600.0)
    if len(claims) != jobs or not all(claim.chunks_ready for claim in claims):
        raise RuntimeError(f"claimed {len(claims)} of {jobs} staged jobs (or a set is missing)")
    return claims


# ---------------------------------------------------------------------------------------------
# the step run


LAG_PROBE_S = 0.005


async def _loop_lag(samples: list[float]) -> None:
    """How late a 5 ms sleep wakes up, in ms: the event loop's responsiveness while the step
    runs (Python work on the loop and the GIL held by other threads both show up here). Five
    milliseconds keeps the probe's own cost near 200 wake-ups a second."""
    while True:
        began = trio.current_time()
        await trio.sleep(LAG_PROBE_S)
        samples.append((trio.current_time() - began - LAG_PROBE_S) * 1000)


async def _run_steps(
    url: str, claims: Sequence[Claim], open_: Callable[[], Any]
) -> tuple[int, float, float, list[float]]:
    """Open the embedder and the pool, then run every claim's steps (the worker's
    :class:`PipelineSteps`, bound as ``build_worker`` binds them), JOB_CONCURRENCY at once.

    Returns embeddings stored, wall seconds, client CPU seconds of the step runs only, and the
    event-loop lag samples (ms) taken meanwhile.
    """
    embedder: Embedder = await open_()
    db = Database(url, pool_size=POOL_SIZE)
    await trio.to_thread.run_sync(db.open)
    settings = default_settings()
    steps = PipelineSteps(
        db=db,
        # never read: every claim finds its chunk set stored, so no step parses
        store=AsyncObjectStore(FolderStore(Path(tempfile.gettempdir())), trio.CapacityLimiter(1)),
        chunker=build_chunker(settings, embedder),
        embedder=embedder,
        max_document_bytes=settings.parsing.max_document_bytes,
        parse_timeout=settings.parsing.timeout,
        max_in_flight=IN_FLIGHT,
    )
    try:
        # hold every connection once so the pool is full before the clock starts
        await trio.to_thread.run_sync(warm_pool, db.connection, POOL_SIZE)
        jobs = trio.CapacityLimiter(JOB_CONCURRENCY)
        stored = 0
        lag: list[float] = []

        async def one(claim: Claim) -> None:
            nonlocal stored
            async with jobs:
                try:
                    # not `stored += await ...`: that reads `stored` before the await
                    count = await steps.embed(claim)
                    await steps.complete(claim)
                finally:
                    steps.forget(claim)
                stored += count

        began, cpu0 = trio.current_time(), cpu_seconds()
        async with trio.open_nursery() as outer:
            outer.start_soon(_loop_lag, lag)
            outer.start_soon(steps.serve)
            async with trio.open_nursery() as nursery:
                for claim in claims:
                    nursery.start_soon(one, claim)
            wall, cpu = trio.current_time() - began, cpu_seconds() - cpu0
            outer.cancel_scope.cancel()
        return stored, wall, cpu, lag
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(db.close)
            await embedder.aclose()


def run_step(
    pg: BenchPostgres,
    url: str,
    claims: Sequence[Claim],
    chunks_per_job: int,
    *,
    open_: Callable[[], Any],
    server: EmbedServerProcess | None,
) -> StepRun:
    before: DbCounters = pg.counters(url, settle_seconds=5)
    server0 = server.cpu_seconds() if server is not None else None
    busy0, own0, t0 = machine_busy_seconds(), cpu_seconds(), time.monotonic()
    stored, wall, client_cpu, lag = trio.run(_run_steps, url, claims, open_)
    busy1, own1, t1 = machine_busy_seconds(), cpu_seconds(), time.monotonic()
    server_cpu = (
        server.cpu_seconds() - server0 if server is not None and server0 is not None else None
    )
    after = pg.counters(url, settle_seconds=10)
    pg_cpu = after.server_cpu_s - before.server_cpu_s
    # what the rest of the machine used meanwhile (busy CPU minus ours, the server's and
    # PostgreSQL's), in cores
    others = (busy1 - busy0 - (own1 - own0) - (server_cpu or 0.0) - pg_cpu) / (t1 - t0)
    with contextlib.closing(connect(url)) as conn:
        row = conn.execute("SELECT count(*) AS n FROM embeddings").fetchone()
    in_db = int(row["n"]) if row else 0
    expected = len(claims) * chunks_per_job
    if stored != expected or in_db != expected:
        raise RuntimeError(f"step stored {stored} / {in_db} embeddings, expected {expected}")
    return StepRun(
        jobs=len(claims),
        chunks=expected,
        stored=stored,
        wall_s=wall,
        client_cpu_s=client_cpu,
        server_cpu_s=server_cpu,
        pg_cpu_s=pg_cpu,
        xact=after.xact_commit - before.xact_commit,
        wal_bytes=pg.wal_bytes(before, after),
        loop_lag_ms=percentiles(lag, (50, 99)),
        other_cores=max(0.0, others),
    )


# ---------------------------------------------------------------------------------------------
# experiment 1: HTTP


def _batches(texts: Sequence[str], size: int) -> list[list[str]]:
    return [list(texts[i : i + size]) for i in range(0, len(texts), size)]


def run_http(
    pg: BenchPostgres,
    server: EmbedServerProcess,
    latency_ms: float,
    batch: int,
    texts: Sequence[str],
    *,
    sizes: tuple[float, float, int],
) -> HttpResult:
    """One scenario; ``sizes``: the step run's target seconds, the raw runs' seconds, and the
    most chunks a step run may have."""
    step_seconds, raw_seconds, max_chunks = sizes
    batches = _batches(texts, batch)
    load = os.getloadavg()[0]
    raw_before = raw_capacity(server, batches, concurrency=IN_FLIGHT, seconds=raw_seconds)
    wanted = raw_before.inputs_per_s * step_seconds
    # at least one full round of job slots, so every run has the same shape at its start
    jobs = max(JOB_CONCURRENCY, min(max_chunks, round(wanted)) // CHUNKS_PER_JOB)
    with pg.fresh_database("embed") as url:
        claims = stage_claims(url, texts, jobs)
        pg.quiesce(url)

        async def open_() -> Embedder:
            return await open_embedder(
                api="tei",
                url=server.url,
                model=HTTP_MODEL,
                dimension=HTTP_DIMENSION,
                batch_size=batch,
                max_in_flight=IN_FLIGHT,
                request_timeout=120.0,
            )

        step = run_step(pg, url, claims, CHUNKS_PER_JOB, open_=open_, server=server)
    raw_after = raw_capacity(server, batches, concurrency=IN_FLIGHT, seconds=raw_seconds)
    return HttpResult(latency_ms, batch, raw_before, raw_after, step, load)


@attrs.define(eq=False)
class InProcessEmbedder:
    """An embedder with no transport at all: it answers from prebuilt TEI-style JSON (the fake
    server's vectors), parsed with orjson and validated as :class:`TeiEmbedder` does.

    The step run with it is the step's own ceiling on this machine — what prepare, parsing,
    validation, drafts and the COPY cost when the embedding backend costs nothing.
    """

    dimension: int
    _fragments: dict[str, bytes]

    @classmethod
    def for_texts(cls, texts: Sequence[str], dimension: int) -> InProcessEmbedder:
        from testkit.embed_server import fake_vector, floats_json

        return cls(dimension, {t: floats_json(fake_vector(t, dimension)).encode() for t in texts})

    @property
    def info(self) -> EmbedderInfo:
        return EmbedderInfo(
            model=HTTP_MODEL,
            dimension=self.dimension,
            max_batch_size=CHUNKS_PER_JOB,
            max_batch_tokens=None,
            max_input_tokens=None,
        )

    async def embed(self, texts: Sequence[str]) -> Vectors:
        body = b"[" + b",".join(self._fragments[t] for t in texts) + b"]"
        return validate_vectors(
            orjson.loads(body), expected_count=len(texts), dimension=self.dimension
        )

    async def aclose(self) -> None:
        return


def run_ceiling(
    pg: BenchPostgres,
    embedder: InProcessEmbedder,
    texts: Sequence[str],
    jobs: int,
    *,
    drop_hnsw: bool = False,
) -> StepRun:
    """The step with the in-process embedder, into the model's HNSW index (built first, as a
    worker does past ``embedding.index-min-vectors``); ``drop_hnsw`` leaves it out (a
    diagnostic: what the index costs per stored vector)."""
    with pg.fresh_database("embed_ceiling") as url:
        claims = stage_claims(url, texts, jobs)
        if not drop_hnsw:
            with contextlib.closing(connect(url)) as conn:
                for row in conn.execute("SELECT * FROM embedding_models").fetchall():
                    build_vector_index(conn, EmbeddingModel.from_row(row), min_vectors=0)
        pg.quiesce(url)

        async def open_() -> Embedder:
            return embedder

        return run_step(pg, url, claims, CHUNKS_PER_JOB, open_=open_, server=None)


# ---------------------------------------------------------------------------------------------
# experiment 2: the local model


def run_local(pg: BenchPostgres, *, jobs: int, chunks_per_job: int) -> LocalResult:
    texts = chunk_texts(jobs * chunks_per_job, characters=TEXT_CHARACTERS, salt="local")
    groups = [texts[i : i + chunks_per_job] for i in range(0, len(texts), chunks_per_job)]
    model, load_seconds, threads = load_raw_model()
    raw_encode(model, [texts[:8]], LOCAL_BATCH)  # warm-up: the first call pays one-off costs
    raw_before = raw_encode(model, groups, LOCAL_BATCH)
    with pg.fresh_database("embed_local") as url:
        claims = stage_claims(
            url, texts, jobs, chunks_per_job, model=DEFAULT_MODEL, dimension=LOCAL_DIMENSION
        )
        pg.quiesce(url)

        async def open_() -> Embedder:
            embedder = await open_embedder(
                api="local",
                url=None,
                model=DEFAULT_MODEL,
                dimension=LOCAL_DIMENSION,
                batch_size=LOCAL_BATCH,
                max_in_flight=IN_FLIGHT,
                request_timeout=120.0,
            )
            await embedder.embed(["warm-up"] * 8)
            return embedder

        step = run_step(pg, url, claims, chunks_per_job, open_=open_, server=None)
    raw_after = raw_encode(model, groups, LOCAL_BATCH)
    return LocalResult(
        batch=LOCAL_BATCH,
        raw_before=raw_before,
        raw_after=raw_after,
        step=step,
        load_seconds=load_seconds,
        torch_threads=threads,
    )


# ---------------------------------------------------------------------------------------------
# report


def plot(
    http: Sequence[HttpResult],
    local: LocalResult | None,
    ceiling: float,
    no_hnsw: float,
    path: Path,
) -> Path:
    runs: list[HttpResult | LocalResult] = [*http, *([local] if local else [])]
    labels = [r.label if isinstance(r, HttpResult) else "local model / batch 32" for r in runs]
    ratios = [r.ratio for r in runs]
    throughput = Panel(
        f"Step against capacity (ceiling {ceiling:,.0f}/s; without HNSW {no_hnsw:,.0f}/s)",
        "chunks/s (log)",
        groups=labels,
        bars={
            "capacity (raw client / raw encode)": [r.capacity for r in runs],
            "embedding step (prepare → embed → commit)": [r.step.chunks_per_s for r in runs],
        },
        hline=(ceiling, "step ceiling, in-process embedder") if http else None,
        log=True,
    )
    ratio = Panel(
        "step / capacity",
        "ratio",
        groups=labels,
        bars={"step / capacity": ratios},
        notes=[f"{r:.2f}" for r in ratios],
        hline=(TARGET_RATIO, f"target {TARGET_RATIO}"),
    )
    return plot_panels(path, [throughput, ratio], (16, 5.5))


def _ratio(value: float) -> str:
    return f"**{value:.2f}**" if value >= TARGET_RATIO else f"{value:.2f}"


def _lag(step: dict[str, Any]) -> str:
    return f"{step['loop_lag_ms']['p50']:.1f} / {step['loop_lag_ms']['p99']:.1f}"


def _http_columns(ceiling: float) -> list[tuple[str, Callable[[HttpResult], str]]]:
    def step_and_raw(key: str) -> Callable[[HttpResult], str]:
        return lambda r: (
            f"{r.step.as_json()[key + 'chunk']:.2f} / {r.raw_before.as_json()[key + 'input']:.2f}"
        )

    return [
        ("latency ms", lambda r: f"{r.latency_ms:.0f}"),
        ("batch", lambda r: str(r.batch)),
        ("latency bound chunks/s", lambda r: "—" if r.latency_ms == 0 else f"{r.ideal:,.0f}"),
        (
            "capacity chunks/s (before / after)",
            lambda r: f"{r.raw_before.inputs_per_s:,.0f} / {r.raw_after.inputs_per_s:,.0f}",
        ),
        ("step chunks/s", lambda r: f"{r.step.chunks_per_s:,.0f}"),
        ("step / capacity", lambda r: _ratio(r.ratio)),
        (
            "step / min(capacity, ceiling)",
            lambda r: f"{r.step.chunks_per_s / min(r.capacity, ceiling):.2f}",
        ),
        (f"jobs of {CHUNKS_PER_JOB}", lambda r: f"{r.step.jobs}"),
        ("client CPU ms/chunk (step / raw)", step_and_raw("client_cpu_ms_per_")),
        ("server CPU ms/chunk (step / raw)", step_and_raw("server_cpu_ms_per_")),
        *_step_columns(lambda r: r.step.as_json(), ("postgres", "lag", "others")),
    ]


def _step_columns(
    step: Callable[[Any], dict[str, Any]], names: Sequence[str]
) -> list[tuple[str, Callable[[Any], str]]]:
    """Columns from a step run's JSON, shared by the ceiling, HTTP and local tables."""
    every: dict[str, tuple[str, Callable[[dict[str, Any]], str]]] = {
        "client": ("client CPU ms/chunk", lambda j: f"{j['client_cpu_ms_per_chunk']:.2f}"),
        "postgres": ("PostgreSQL CPU ms/chunk", lambda j: f"{j['postgres_cpu_ms_per_chunk']:.2f}"),
        "wal": ("WAL bytes/chunk", lambda j: f"{j['wal_bytes_per_chunk']:,.0f}"),
        "xact": ("transactions", lambda j: str(j["transactions"])),
        "lag": ("loop lag ms p50 / p99", _lag),
        "others": ("other processes, cores", lambda j: f"{j['other_processes_cores']:.2f}"),
    }

    def column(name: str) -> tuple[str, Callable[[Any], str]]:
        header, show = every[name]
        return header, lambda item: show(step(item))

    return [column(n) for n in names]


_CEILING_COLUMNS: list[tuple[str, Callable[[tuple[str, StepRun]], str]]] = [
    ("run", lambda nr: nr[0]),
    ("chunks", lambda nr: str(nr[1].stored)),
    ("chunks/s", lambda nr: f"{nr[1].chunks_per_s:,.0f}"),
    *_step_columns(
        lambda nr: nr[1].as_json(), ("client", "postgres", "wal", "xact", "lag", "others")
    ),
]


def _markdown(
    *,
    machine: dict[str, Any],
    command: str,
    date: str,
    elapsed: float,
    http: Sequence[HttpResult],
    ceilings: Sequence[StepRun],
    no_hnsw: StepRun,
    local: LocalResult | None,
    breakdown: dict[str, float],
    png_name: str,
) -> str:
    ceiling = _mean_rate(ceilings)
    named = [*zip(("before the scenarios", "after the scenarios"), ceilings, strict=False)]
    named.append(("diagnostic: the model's HNSW index dropped", no_hnsw))
    lines = [
        *page_head(
            "Embedding step benchmark", date, command, elapsed, machine, about=__doc__ or ""
        ),
        f"Target: step / capacity ≥ {TARGET_RATIO}. The step's ceiling (in-process embedder, "
        f"no HTTP) averaged **{ceiling:,.0f} chunks/s**; loop lag = how late a 5 ms "
        "`trio.sleep` woke up; other processes = CPU the rest of the machine used meanwhile.",
        "",
        "## HTTP embedder (TEI protocol) against the fake server",
        "",
        *column_table(_CEILING_COLUMNS, named),
        "",
        *column_table(_http_columns(ceiling), http, "r" * 13),
    ]
    if local is not None:
        step = local.as_json()["step"]
        lines += [
            "",
            "## Local model (all-MiniLM-L6-v2, 384 dimensions)",
            "",
            f"batch-size {local.batch}, torch threads {local.torch_threads}, {local.step.jobs} "
            f"jobs × {local.step.chunks // local.step.jobs} chunks.",
            "",
            *column_table(
                [
                    (
                        "raw encode chunks/s (before / after)",
                        lambda r: (
                            f"{r.raw_before.chunks_per_s:.1f} / {r.raw_after.chunks_per_s:.1f}"
                        ),
                    ),
                    ("step chunks/s", lambda r: f"{r.step.chunks_per_s:.1f}"),
                    ("step / raw", lambda r: _ratio(r.ratio)),
                    (
                        "step client CPU ms/chunk",
                        lambda r: f"{step['client_cpu_ms_per_chunk']:.1f}",
                    ),
                    *_step_columns(lambda r: step, ("postgres", "lag")),
                ],
                [local],
                "r" * 6,
            ),
        ]
    b = breakdown
    lines += [
        "",
        f"## Client work per {HTTP_DIMENSION}-dimension vector (in-process, one thread)",
        "",
        *markdown_table(
            ("piece of work", "µs per vector", "KiB per vector it leaves alive"),
            [
                [
                    f"`orjson.loads` of a TEI answer ({b['response_bytes_per_vector']:,.0f} "
                    "bytes per vector)",
                    f"{b['orjson_loads_us']:.0f}",
                    f"{b['parsed_kib_per_vector']:.1f}",
                ],
                [
                    "`validate_vectors` (what `TeiEmbedder._embed_batch` returns)",
                    f"{b['validate_vectors_us']:.0f}",
                    f"{b['validated_kib_per_vector']:.1f}",
                ],
                [
                    "`validate_vectors` with the per-value type scan (an answer whose text "
                    "may hold booleans)",
                    f"{b['validate_vectors_scanned_us']:.0f}",
                    "",
                ],
                [
                    "`orjson.loads` + `validate_vectors` of the same answer as base64 on "
                    f"TEI's OpenAI-compatible route ({b['base64_response_bytes_per_vector']:,.0f} "
                    "bytes per vector; what `TeiEmbedder` asks a TEI 1.3+ for)",
                    f"{b['base64_loads_and_validate_us']:.0f}",
                    "",
                ],
                [
                    "`build_drafts` = the answer's float32 matrix copied + "
                    "`drafts_from_matrix` (hashes)",
                    f"{b['build_drafts_us']:.0f}",
                    f"{b['drafts_kib_per_vector']:.1f} (peak while it runs: "
                    f"{b['build_drafts_peak_kib_per_vector']:.1f})",
                ],
            ],
        ),
        "",
        f"![embedding benchmark]({png_name})",
        "",
        "## Reading",
        "",
        *_reading(machine, http, ceiling, no_hnsw, local),
    ]
    return "\n".join(lines).rstrip() + "\n"


def _mean_rate(runs: Sequence[StepRun]) -> float:
    return statistics.fmean(r.chunks_per_s for r in runs) if runs else float("inf")


def _reading(
    machine: dict[str, Any],
    http: Sequence[HttpResult],
    ceiling: float,
    no_hnsw: StepRun,
    local: LocalResult | None,
) -> list[str]:
    """A few facts computed from the figures, so a re-run cannot leave a stale explanation."""
    cores = machine.get("usable_cores") or machine.get("logical_cores") or 1
    out: list[str] = []
    if http:
        met = [r.label for r in http if r.ratio >= TARGET_RATIO]
        above = [r.label for r in http if r.capacity > ceiling]
        out.append(
            f"- **Target ({TARGET_RATIO} × capacity), HTTP:** met in {len(met)} of {len(http)} "
            f"scenarios ({', '.join(met) or 'none'}). Capacity above the step's own ceiling "
            f"({ceiling:,.0f} chunks/s; {no_hnsw.chunks_per_s:,.0f} without the HNSW index): "
            f"{', '.join(above) or 'none'}; there step / min(capacity, ceiling) is the figure."
        )
    if local is not None:
        out.append(
            f"- **Target, local model:** {verdict(local.ratio >= TARGET_RATIO)}: {local.step.chunks_per_s:.1f} chunks/s "
            f"against {local.capacity:.1f} for raw `encode` (ratio {local.ratio:.2f}; torch "
            f"runs {local.torch_threads} threads on {cores} cores)."
        )
    others = [r.step.other_cores for r in http]
    if others:
        out.append(
            f"- Noise: other processes used {min(others):.2f}-{max(others):.2f} cores of "
            f"{cores} during the step runs."
        )
    return out


# ---------------------------------------------------------------------------------------------
# main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = bench_parser(
        "embed",
        "Embedding step throughput against the fake TEI server's capacity and "
        "against the local model's raw encode throughput.",
        "fewer scenarios, short runs",
    )
    parser.add_argument("--no-local", action="store_true", help="skip the local model")
    add_out(parser, "embed")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    session = Session.start("embed", args)
    quick: bool = args.quick
    latencies = QUICK_LATENCIES_MS if quick else LATENCIES_MS
    batches = QUICK_BATCHES if quick else BATCHES
    step_seconds = QUICK_STEP_SECONDS if quick else STEP_SECONDS
    raw_seconds = QUICK_RAW_SECONDS if quick else RAW_SECONDS
    max_chunks = QUICK_MAX_STEP_CHUNKS if quick else MAX_STEP_CHUNKS
    durations = (step_seconds, raw_seconds, max_chunks)

    texts = chunk_texts(TEXT_POOL, characters=TEXT_CHARACTERS)
    breakdown = vector_costs(HTTP_DIMENSION, 32)  # client CPU per vector
    in_process = InProcessEmbedder.for_texts(texts, HTTP_DIMENSION)
    http: list[HttpResult] = []
    ceilings: list[StepRun] = []
    local: LocalResult | None = None
    with BenchPostgres() as pg:
        machine = machine_info(pg.admin_url)
        ceilings.append(run_ceiling(pg, in_process, texts, max_chunks // CHUNKS_PER_JOB))
        print(f"{'ceiling (in-process)':<20} step {ceilings[-1].chunks_per_s:8,.0f} chunks/s")
        no_hnsw = run_ceiling(pg, in_process, texts, max_chunks // CHUNKS_PER_JOB, drop_hnsw=True)
        print(f"{'ceiling, no HNSW':<20} step {no_hnsw.chunks_per_s:8,.0f} chunks/s")
        for latency in latencies:
            with EmbedServerProcess(
                latency_ms=latency, dimension=HTTP_DIMENSION, max_batch_size=max(batches)
            ) as server:
                for batch in batches:
                    result = run_http(pg, server, latency, batch, texts, sizes=durations)
                    print(
                        f"{result.label:<20} capacity {result.capacity:8,.0f} chunks/s  "
                        f"step {result.step.chunks_per_s:8,.0f} chunks/s  "
                        f"ratio {result.ratio:.2f}",
                        flush=True,
                    )
                    http.append(result)
        ceilings.append(run_ceiling(pg, in_process, texts, max_chunks // CHUNKS_PER_JOB))
        print(f"{'ceiling (in-process)':<20} step {ceilings[-1].chunks_per_s:8,.0f} chunks/s")
        if not args.no_local:
            local = run_local(
                pg,
                jobs=QUICK_LOCAL_JOBS if quick else LOCAL_JOBS,
                chunks_per_job=QUICK_LOCAL_CHUNKS_PER_JOB if quick else LOCAL_CHUNKS_PER_JOB,
            )
            print(
                f"{'local model':<20} capacity {local.capacity:8,.1f} chunks/s  "
                f"step {local.step.chunks_per_s:8,.1f} chunks/s  ratio {local.ratio:.2f}",
                flush=True,
            )

    ceiling = _mean_rate(ceilings)
    figures = {
        "options": {
            "quick": quick,
            "latencies_ms": list(latencies),
            "batches": list(batches),
            "in_flight": IN_FLIGHT,
            "job_concurrency": JOB_CONCURRENCY,
            "pool_size": POOL_SIZE,
            "chunks_per_job": CHUNKS_PER_JOB,
            "text_characters": TEXT_CHARACTERS,
            "step_seconds": step_seconds,
            "raw_seconds": raw_seconds,
            "target_ratio": TARGET_RATIO,
        },
        "ceiling": {
            "chunks_per_s": round(ceiling, 1),
            "runs": [r.as_json() for r in ceilings],
            "without_hnsw_index": no_hnsw.as_json(),
        },
        "http": [
            {
                **r.as_json(),
                "ratio_to_attainable": round(r.step.chunks_per_s / min(r.capacity, ceiling), 3),
            }
            for r in http
        ],
        "local": local.as_json() if local is not None else None,
        "client_breakdown_us_per_vector": {k: round(v, 1) for k, v in breakdown.items()},
        "summary": {
            "http_target_met": sum(r.ratio >= TARGET_RATIO for r in http),
            "http_scenarios": len(http),
            "http_ratio_min": round(min((r.ratio for r in http), default=float("nan")), 3),
            "local_ratio": round(local.ratio, 3) if local is not None else None,
        },
    }
    return session.publish(
        machine,
        figures,
        lambda path: plot(http, local, ceiling, no_hnsw.chunks_per_s, path),
        lambda date, elapsed, png_name: _markdown(
            machine=machine,
            command=session.command,
            date=date,
            elapsed=elapsed,
            http=http,
            ceilings=ceilings,
            no_hnsw=no_hnsw,
            local=local,
            breakdown=breakdown,
            png_name=png_name,
        ),
    )


if __name__ == "__main__":
    raise SystemExit(main())
