"""A bounded load run against ``trioindex serve``: 16 concurrent clients search and upload for
about ten seconds, and nothing is lost (every upload answered 201 is one document with one
version and one job, and no other document appears); search latency over HTTP is measured
beside ``Index.search`` in this process, at the same concurrency, on the same data."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import trio

from testkit.documents import TOPICS, document_bytes, paragraph
from testkit.processes import cli, query
from tests.http.conftest import Running
from trioindex.api.index import Index
from trioindex.config import load_settings

pytestmark = pytest.mark.slow

CLIENTS = 16
#: One request of a client: (its HTTP client, the client's number, the request's number).
Step = Callable[[httpx.Client, int, int], None]
QUERIES = [
    ("structured concurrency nurseries", "hybrid"),
    ("SKIP LOCKED claims", "text"),
    ("cosine distance embeddings", "vector"),
    ("renewable lease worker dies", "hybrid"),
]


def _percentiles(seconds: list[float]) -> tuple[float, float]:
    ordered = sorted(seconds)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def _clients(service: Running, token: str, seconds: float, step: Step) -> None:
    """``CLIENTS`` threads, each with its own HTTP client, calling ``step(client, i, n)`` for
    ``seconds`` from the moment every client is ready (making one can take seconds on a busy
    machine), each at least once."""
    ready = threading.Barrier(CLIENTS)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            with service.client(token) as c:
                ready.wait()
                deadline = time.monotonic() + seconds
                n = 0
                while True:
                    step(c, i, n)
                    n += 1
                    if time.monotonic() >= deadline:
                        break
        except BaseException as exc:
            errors.append(exc)
            ready.abort()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def _http_searches(service: Running, token: str, seconds: float) -> list[float]:
    latencies: list[float] = []
    lock = threading.Lock()

    def search(c: httpx.Client, i: int, n: int) -> None:
        q, mode = QUERIES[(i + n) % len(QUERIES)]
        start = time.perf_counter()
        answer = c.get("/v1/search", params={"q": q, "mode": mode})
        took = time.perf_counter() - start
        assert answer.status_code == 200, answer.text
        with lock:
            latencies.append(took)

    _clients(service, token, seconds, search)
    return latencies


def _in_process_searches(env: dict[str, str], cwd: Path, seconds: float) -> list[float]:
    latencies: list[float] = []

    async def main() -> None:
        async with Index.open(load_settings(environ=env, cwd=cwd)) as index:
            await index.open_model()
            deadline = trio.current_time() + seconds

            async def client(i: int) -> None:
                n = i
                while trio.current_time() < deadline:
                    q, mode = QUERIES[n % len(QUERIES)]
                    start = time.perf_counter()
                    await index.search(q, mode=mode)  # type: ignore[arg-type]
                    latencies.append(time.perf_counter() - start)
                    n += 1

            async with trio.open_nursery() as nursery:
                for i in range(CLIENTS):
                    nursery.start_soon(client, i)

    trio.run(main)
    return latencies


def test_sixteen_clients_search_and_upload_for_ten_seconds_and_lose_nothing(
    service: Running, tmp_path: Path
) -> None:
    token = service.key("load", "write")
    with service.client(token) as c:
        for topic, sentence in TOPICS:
            body = [paragraph(topic, sentence, 6) for _ in range(3)]
            c.post(f"/v1/documents/seed/{topic}.md", content=document_bytes("md", topic, body))
    drained = cli(service.env, "worker", "--drain", timeout=300)
    assert drained.returncode == 0, drained.stderr[-2000:]

    over_http = _http_searches(service, token, 5)
    in_process = _in_process_searches(service.env, tmp_path, 5)

    uploaded: list[str] = []
    answers: list[int] = []
    mixed: list[float] = []
    lock = threading.Lock()

    def upload_or_search(c: httpx.Client, i: int, n: int) -> None:
        if n % 2 == 0:
            key = f"load/{i}/{n}.txt"
            data = f"client {i} upload {n}: the load run marker-load-{i}-{n}".encode()
            answer = c.post(f"/v1/documents/{key}", content=data)
            with lock:
                answers.append(answer.status_code)
                if answer.status_code == 201:
                    uploaded.append(key)
        else:
            q, mode = QUERIES[n % len(QUERIES)]
            start = time.perf_counter()
            found = c.get("/v1/search", params={"q": q, "mode": mode})
            with lock:
                answers.append(found.status_code)
                mixed.append(time.perf_counter() - start)

    _clients(service, token, 10, upload_or_search)
    assert set(answers) == {200, 201}, sorted(set(answers))
    rows = query(
        service.database_url,
        """SELECT d.external_key, count(DISTINCT v.id) AS versions, count(j.id) AS jobs
           FROM documents d JOIN document_versions v ON v.document_id = d.id
           JOIN embedding_jobs j ON j.document_version_id = v.id
           WHERE d.external_key LIKE 'load/%%' GROUP BY d.external_key""",
    )
    assert sorted(r["external_key"] for r in rows) == sorted(uploaded)
    assert {(r["versions"], r["jobs"]) for r in rows} == {(1, 1)}
    http_p50, http_p99 = _percentiles(over_http)
    own_p50, own_p99 = _percentiles(in_process)
    mixed_p50, mixed_p99 = _percentiles(mixed)
    print(
        f"\nsearch, {CLIENTS} clients: HTTP p50 {http_p50 * 1000:.1f} ms p99 {http_p99 * 1000:.1f} ms"
        f" ({len(over_http)} searches); in-process Index.search p50 {own_p50 * 1000:.1f} ms"
        f" p99 {own_p99 * 1000:.1f} ms ({len(in_process)}); ratio of p50s {http_p50 / own_p50:.2f}"
        f"\nmixed run: {len(uploaded)} uploads, {len(mixed)} searches, search p50"
        f" {mixed_p50 * 1000:.1f} ms p99 {mixed_p99 * 1000:.1f} ms"
    )
    # the latency target, against the in-process search measured in this run (the machine may
    # be busy with other work): bench/http.py measures it properly (docs/test-results/http.md)
    assert http_p99 < max(5.0, 5 * own_p99), (http_p99, own_p99)
    assert mixed_p99 < max(10.0, 10 * own_p99), (mixed_p99, own_p99)
    assert "Traceback" not in service.log_text()
