"""``run_worker`` inside a process of its own making (an application, a test): it indexes, and
leaves the process's garbage collector settings as they were. Only the ``worker`` command,
whose process exists for the worker, tunes them (``own_process``; the tuning itself is tested in
a process of its own, test_collector.py), so this test process keeps CPython's defaults."""

from __future__ import annotations

import functools
import gc
from pathlib import Path

import pytest
import trio

from testkit.embed_server import FakeEmbedServer
from testkit.processes import FAST_WORKER, cli, query, tei_env
from trioindex.config import load_settings
from trioindex.worker import collector
from trioindex.worker.wiring import run_worker

pytestmark = pytest.mark.slow

DOCUMENTS = 6


def collector_settings() -> tuple[tuple[int, int, int], int]:
    return gc.get_threshold(), gc.get_freeze_count()


def test_a_worker_run_in_process_indexes_and_leaves_the_collector_alone(
    database_url: str, tmp_path: Path, embed_server: FakeEmbedServer
) -> None:
    env = tei_env(database_url, tmp_path, embed_server.url, **FAST_WORKER)
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(DOCUMENTS):
        (docs / f"doc-{i}.txt").write_text(
            f"document {i}, indexed by a worker in a test's process."
        )
    ingest = cli(env, "ingest", str(docs))
    assert ingest.returncode == 0, ingest.stderr[-3000:]
    before = collector_settings()
    assert before[0][0] != collector.YOUNG_THRESHOLD  # else the check below could not fail

    worker = trio.run(
        functools.partial(run_worker, load_settings(environ=env), drain=True, listen=False)
    )

    assert worker.counters.succeeded == DOCUMENTS
    statuses = query(database_url, "SELECT status FROM embedding_jobs")
    assert [row["status"] for row in statuses] == ["SUCCEEDED"] * DOCUMENTS
    assert collector_settings() == before
