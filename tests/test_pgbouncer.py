"""Workers behind a real PgBouncer in transaction mode (``database.pooler = transaction``).

PgBouncer (Debian's package; ``just setup-pgbouncer``) runs on a free port in front of the test
database. A worker with ``database.direct-url`` wakes on an enqueue through its LISTEN connection
to PostgreSQL itself (its polling interval is a minute, so only the NOTIFY can explain a job
done in seconds); it is killed with SIGKILL mid-job, and a worker without a direct URL (polling)
takes the expired job over and completes it, once. Migrations run through PgBouncer from
several clients at once while neighbours keep its server connections busy, and leave no lock
behind. A drained worker without a direct URL builds no HNSW index and says so; one with a
direct URL builds it there.
"""

from __future__ import annotations

import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest

from testkit.documents import write_corpus
from testkit.embed_server import FakeEmbedServer
from testkit.pgbouncer import pgbouncer_binary, running_pgbouncer
from testkit.processes import FAST_WORKER, base_env, cli, query, spawn, tei_env, wait_for
from trioindex.db.migrations import available_migrations, current_version, migrate

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        pgbouncer_binary() is None,
        reason="pgbouncer is not installed (as root: just setup-pgbouncer)",
    ),
]


def _status(url: str, key: str) -> str | None:
    rows = query(
        url,
        """SELECT j.status FROM embedding_jobs j
           JOIN document_versions v ON v.id = j.document_version_id
           JOIN documents d ON d.id = v.document_id
           WHERE d.external_key LIKE %s ORDER BY j.created_at DESC LIMIT 1""",
        f"%{key}",
    )
    return str(rows[0]["status"]) if rows else None


def _listening(url: str) -> bool:
    return bool(
        query(
            url,
            """SELECT 1 FROM pg_stat_activity
               WHERE datname = current_database() AND query LIKE 'LISTEN %%'""",
        )
    )


def test_workers_behind_pgbouncer_index_wake_on_enqueue_and_recover_a_kill_9(
    database_url: str, tmp_path: Path, embed_server: FakeEmbedServer
) -> None:
    docs = tmp_path / "docs"
    write_corpus(docs, sentences=3)
    first_doc, second_doc = sorted(docs.glob("*.txt"))[:2]
    with running_pgbouncer(database_url) as bouncer_url:
        common = {
            **FAST_WORKER,
            "TRIOINDEX_DATABASE_URL": bouncer_url,
            "TRIOINDEX_DATABASE_POOLER": "transaction",
            "TRIOINDEX_STORAGE_URL": (tmp_path / "blobs").as_uri(),
            "TRIOINDEX_EMBEDDING_API": "tei",
            "TRIOINDEX_EMBEDDING_URL": embed_server.url,
            "TRIOINDEX_EMBEDDING_MODEL": "BAAI/bge-m3",
            "TRIOINDEX_EMBEDDING_DIMENSION": "1024",
            "TRIOINDEX_HOME": str(tmp_path / "home"),
        }
        listening = base_env(
            **{
                **common,
                "TRIOINDEX_DATABASE_DIRECT_URL": database_url,
                "TRIOINDEX_WORKER_POLLING_INTERVAL": "60s",
            }
        )
        polling = base_env(**common)
        logs = [tmp_path / "listening.log", tmp_path / "polling.log"]

        first = spawn(listening, "worker", log=logs[0])
        try:
            wait_for(lambda: _listening(database_url), 60, "the worker's LISTEN on PostgreSQL")
            ingest = cli(polling, "ingest", str(first_doc))
            assert ingest.returncode == 0, ingest.stderr
            wait_for(
                lambda: _status(database_url, first_doc.name) == "SUCCEEDED",
                20,
                "the job done long before the next poll (woken by NOTIFY)",
            )
            embed_server.set_fault_rates({"hang": 1.0})
            before = embed_server.stats().embed_requests
            assert cli(polling, "ingest", str(second_doc)).returncode == 0
            wait_for(lambda: embed_server.stats().embed_requests > before, 30, "mid-embedding")
            first.kill()  # SIGKILL: no cleanup at all
            first.wait(timeout=10)
        finally:
            first.kill()
        embed_server.set_fault_rates({})
        second = spawn(polling, "worker", log=logs[1])
        try:
            wait_for(
                lambda: _status(database_url, second_doc.name) == "SUCCEEDED",
                60,
                "the polling worker to finish the expired job",
            )
            second.send_signal(signal.SIGTERM)
            assert second.wait(timeout=30) == 0
        finally:
            second.kill()
        # nothing was left on PgBouncer's server connections for the next client to inherit
        locks = query(
            database_url, "SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory'"
        )
        assert locks == [{"n": 0}]
    attempts = query(
        database_url,
        """SELECT a.status FROM trioindex_job_attempts a
           JOIN embedding_jobs j ON j.id = a.embedding_job_id
           JOIN document_versions v ON v.id = j.document_version_id
           JOIN documents d ON d.id = v.document_id
           WHERE d.external_key LIKE %s ORDER BY a.attempt_no""",
        f"%{second_doc.name}",
    )
    assert [a["status"] for a in attempts] == ["EXPIRED", "SUCCEEDED"]
    duplicates = query(
        database_url,
        "SELECT chunk_id FROM embeddings GROUP BY chunk_id, embedding_model_id HAVING count(*) > 1",
    )
    assert duplicates == []
    # index builds need a session: the worker without a direct URL says it leaves them
    assert "builds no HNSW index" in logs[1].read_text()
    assert "builds no HNSW index" not in logs[0].read_text()
    text = "\n".join(log.read_text() for log in logs)
    assert "prepared statement" not in text
    assert "Traceback" not in text


def test_migrations_through_pgbouncer_from_several_clients_leave_no_lock_behind(
    empty_database_url: str,
) -> None:
    # Each autocommit statement may run on another server connection, and the neighbours take
    # the one a statement just released: a lock held by a session would stay behind on one of
    # them, and the next migration waiting for it would wait for ever.
    stop = threading.Event()

    def neighbour(url: str) -> None:
        with psycopg.connect(url, autocommit=True, prepare_threshold=None) as conn:
            while not stop.is_set():
                conn.execute("SELECT 1")

    # PgBouncer stops before the pool joins its threads: a migration stuck on a lock fails
    with (
        ThreadPoolExecutor(8) as pool,
        running_pgbouncer(empty_database_url, pool_size=4) as bouncer_url,
    ):
        busy = [pool.submit(neighbour, bouncer_url) for _ in range(3)]
        try:
            for _ in range(4):
                rounds = [pool.submit(migrate, bouncer_url) for _ in range(3)]
                applied = [v for f in rounds for v in f.result(timeout=30)]
                assert applied in ([], [m.version for m in available_migrations()])
        finally:
            stop.set()
        for f in busy:
            f.result(timeout=30)
        left = query(
            empty_database_url, "SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory'"
        )
    assert left == [{"n": 0}]
    with psycopg.connect(empty_database_url) as conn:
        assert current_version(conn) == available_migrations()[-1].version


def _hnsw_validity(url: str) -> list[bool]:
    rows = query(
        url,
        """SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
           JOIN pg_am a ON a.oid = c.relam WHERE a.amname = 'hnsw'""",
    )
    return [bool(row["indisvalid"]) for row in rows]


def test_behind_pgbouncer_only_a_worker_with_a_direct_url_builds_the_hnsw_index(
    database_url: str, tmp_path: Path, embed_server: FakeEmbedServer
) -> None:
    docs = tmp_path / "docs"
    write_corpus(docs, sentences=3)
    with running_pgbouncer(database_url) as bouncer_url:
        pooled = tei_env(
            bouncer_url,
            tmp_path,
            embed_server.url,
            TRIOINDEX_DATABASE_POOLER="transaction",
            TRIOINDEX_EMBEDDING_INDEX_MIN_VECTORS="1",
        )
        assert cli(pooled, "ingest", str(docs)).returncode == 0
        without = cli(pooled, "worker", "--drain")
        assert without.returncode == 0, without.stderr[-3000:]
        assert "builds no HNSW index" in without.stderr
        assert _hnsw_validity(database_url) == []
        direct = {**pooled, "TRIOINDEX_DATABASE_DIRECT_URL": database_url}
        with_direct = cli(direct, "worker", "--drain")
        assert with_direct.returncode == 0, with_direct.stderr[-3000:]
        assert "builds no HNSW index" not in with_direct.stderr
    wait_for(lambda: _hnsw_validity(database_url) == [True], 60, "the model's HNSW index")
