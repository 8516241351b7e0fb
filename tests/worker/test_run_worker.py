"""``run_worker`` inside a process of its own making (an application, a test): it indexes, and
leaves the process's interpreter settings — the garbage collector's and the interpreter lock's
switch interval — as they were. Only the ``worker`` command, whose process exists for the
worker, tunes them (``own_process``); that tuning is tested in a process of its own
(test_collector.py and below), so this test process keeps CPython's defaults."""

from __future__ import annotations

import functools
import gc
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from testkit.embed_server import FakeEmbedServer
from testkit.processes import FAST_WORKER, cli, query, tei_env
from trioindex.config import load_settings
from trioindex.worker import gil
from trioindex.worker.wiring import run_worker

pytestmark = pytest.mark.slow

DOCUMENTS = 6


def interpreter_settings() -> tuple[tuple[int, int, int], int, float]:
    return gc.get_threshold(), gc.get_freeze_count(), sys.getswitchinterval()


def test_a_worker_run_in_process_indexes_and_leaves_the_interpreter_settings_alone(
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
    before = interpreter_settings()
    assert before[2] != gil.SWITCH_INTERVAL  # else the check below could not fail

    worker = trio.run(
        functools.partial(run_worker, load_settings(environ=env), drain=True, listen=False)
    )

    assert worker.counters.succeeded == DOCUMENTS
    statuses = query(database_url, "SELECT status FROM embedding_jobs")
    assert [row["status"] for row in statuses] == ["SUCCEEDED"] * DOCUMENTS
    assert interpreter_settings() == before


def test_the_worker_process_hands_the_interpreter_lock_over_sooner() -> None:
    probe = "import sys; from trioindex.worker import gil; gil.shorten(); print(sys.getswitchinterval())"
    before = subprocess.run(
        [sys.executable, "-c", "import sys; print(sys.getswitchinterval())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    after = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert float(before) == 0.005
    assert float(after) == gil.SWITCH_INTERVAL
