"""The command line as people use it: subprocesses, their output and exit codes.

Runs against an S3 server on loopback and an HTTP (TEI) embedding server, on a fresh database;
the embedded-defaults path is covered by tests/test_process.py.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.documents import write_corpus
from tests.fakes.embed_server import FakeEmbedServer
from tests.test_process import FAST_WORKER, base_env, cli, query, spawn, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def env(
    database_url: str, s3_url: str, embed_server: FakeEmbedServer, tmp_path: Path
) -> dict[str, str]:
    return base_env(
        TRIOINDEX_DATABASE_URL=database_url,
        TRIOINDEX_STORAGE_URL=s3_url,
        TRIOINDEX_EMBEDDING_API="tei",
        TRIOINDEX_EMBEDDING_URL=embed_server.url,
        TRIOINDEX_EMBEDDING_MODEL="BAAI/bge-m3",
        TRIOINDEX_EMBEDDING_DIMENSION="1024",
        TRIOINDEX_HOME=str(tmp_path / "home"),
        **FAST_WORKER,
    )


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    docs = tmp_path / "docs"
    write_corpus(docs, sentences=3)
    (docs / "empty.txt").write_text("   \n")
    return docs


@pytest.fixture
def running_worker(env: dict[str, str], tmp_path: Path) -> Iterator[Path]:
    log = tmp_path / "worker.log"
    proc = spawn(env, "worker", log=log)
    try:
        yield log
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        finally:
            proc.kill()


def test_ingest_wait_shows_progress_and_fails_listing_failed_documents(
    env: dict[str, str], corpus: Path, running_worker: Path, database_url: str
) -> None:
    result = cli(env, "ingest", str(corpus), "--wait", timeout=180)
    assert result.returncode == 1, result.stderr[-2000:]
    assert "FAILED empty.txt: DOCUMENT_CONTENT_INVALID" in result.stderr
    assert "indexing" in result.stdout  # the progress bar's label
    assert "enqueued" in result.stdout
    states = query(database_url, "SELECT status, count(*) AS n FROM embedding_jobs GROUP BY status")
    assert {r["status"]: r["n"] for r in states} == {"SUCCEEDED": 24, "FAILED": 1}

    # search over what the worker built: rank, score, key, chunk index, snippet. The fake
    # server's vectors carry no meaning, so the query is a stored chunk's own text: it must come
    # back first with a cosine score of 1.
    (chunk,) = query(
        database_url,
        """SELECT c.content, c.chunk_index FROM document_chunks c
           JOIN documents d ON d.current_version_id = c.document_version_id
           WHERE d.external_key = 'lease-0.txt' ORDER BY c.chunk_index LIMIT 1""",
    )
    # the .txt, .md, .html and .docx copies of a topic share paragraphs: any chunk with exactly
    # this text is a correct first hit
    same_text = {
        (r["external_key"], r["chunk_index"])
        for r in query(
            database_url,
            """SELECT d.external_key, c.chunk_index FROM document_chunks c
               JOIN documents d ON d.current_version_id = c.document_version_id
               WHERE c.content = %s""",
            chunk["content"],
        )
    }
    found = cli(env, "search", chunk["content"], "--top-k", "3")
    assert found.returncode == 0, found.stderr
    rank, score, key, index = found.stdout.splitlines()[0].split()
    assert (rank, score) == ("1.", "1.0000")
    assert (key, int(index.lstrip("#"))) in same_text
    assert (
        len([line for line in found.stdout.splitlines() if line.lstrip()[:2] in ("2.", "3.")]) == 2
    )
    hits = json.loads(cli(env, "search", "renewable lease", "--json").stdout)
    assert [h["rank"] for h in hits] == list(range(1, len(hits) + 1))
    assert {"score", "document_key", "chunk_index", "text"} <= set(hits[0])

    # status: counts, failures by type, the live worker
    status = json.loads(cli(env, "status", "--json").stdout)
    assert status["jobs_by_status"]["SUCCEEDED"] == 24
    assert status["failures_by_type"] == {"DOCUMENT_CONTENT_INVALID": 1}
    assert [w["state"] for w in status["workers"]] == ["RUNNING"]
    text = cli(env, "status").stdout
    assert "SUCCEEDED 24" in text and "DOCUMENT_CONTENT_INVALID 1" in text

    # jobs list / show / retry
    failed = json.loads(cli(env, "jobs", "list", "--status", "FAILED", "--json").stdout)
    assert [j["document_key"] for j in failed] == ["empty.txt"]
    shown = cli(env, "jobs", "show", failed[0]["id"])
    assert "attempt 1: FAILED" in shown.stdout and "DOCUMENT_CONTENT_INVALID" in shown.stdout
    retried = cli(env, "jobs", "retry", "--all-failed")
    assert retried.returncode == 0 and "1 job(s) back in the queue" in retried.stdout
    wait_for(
        lambda: query(
            database_url,
            "SELECT 1 FROM embedding_jobs WHERE status = 'FAILED' AND attempt_count = 2",
        ),
        30,
        "the retried job to fail again (the file is still empty)",
    )
    assert "healthcheck" not in running_worker.read_text()


def test_healthcheck_follows_the_worker_heartbeat(env: dict[str, str], tmp_path: Path) -> None:
    assert cli(env, "healthcheck").returncode == 1  # no worker on this host yet
    log = tmp_path / "worker.log"
    proc = spawn(env, "worker", log=log)
    try:
        wait_for(lambda: cli(env, "healthcheck").returncode == 0, 60, "a fresh heartbeat")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    assert cli(env, "healthcheck").returncode == 1  # STOPPED is not healthy


def test_a_worker_with_a_stale_heartbeat_is_shown_as_lost(
    env: dict[str, str], database_url: str
) -> None:
    query(
        database_url,
        """INSERT INTO indexing_workers (hostname, pid, version, status, max_concurrency, last_heartbeat_at)
           VALUES ('gone-host', 42, 'x', 'RUNNING', 2, now() - interval '1 hour')""",
    )
    status = json.loads(cli(env, "status", "--json").stdout)
    assert [w["state"] for w in status["workers"]] == ["LOST"]
    assert "LOST" in cli(env, "status").stdout


@pytest.mark.parametrize(
    ("changes", "args", "code", "expected"),
    [
        ({"TRIOINDEX_DATABASE_URL": "mysql://u:hunter2@h/db"}, ["status"], 2, "database.url"),
        (
            {"TRIOINDEX_DATABASE_URL": "postgresql://u:hunter2@127.0.0.1:1/db"},
            ["status"],
            1,
            "cannot connect to PostgreSQL",
        ),
        ({"TRIOINDEX_WORKER_MAX_CONCURRENCY": "0"}, ["status"], 2, "max-concurrency"),
        ({"TRIOINDEX_EMBEDDING_API": "word2vec"}, ["status"], 2, "embedding.api"),
        ({}, ["jobs", "show", "00000000-0000-0000-0000-000000000000"], 1, "no job with id"),
        ({"TRIOINDEX_STORAGE_URL": "ftp://x"}, ["status"], 2, "storage.url"),
    ],
)
def test_errors_for_people_are_one_line_and_a_non_zero_exit(
    env: dict[str, str], changes: dict[str, str], args: list[str], code: int, expected: str
) -> None:
    result = cli({**env, **changes}, *args)
    assert result.returncode == code, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and expected in lines[0], result.stderr
    assert "Traceback" not in result.stderr and "hunter2" not in result.stderr


def test_a_model_dimension_mismatch_is_one_clear_line(env: dict[str, str], corpus: Path) -> None:
    custom = {**env, "TRIOINDEX_EMBEDDING_MODEL": "acme/custom-embedder"}
    first = cli(
        {**custom, "TRIOINDEX_EMBEDDING_DIMENSION": "1024"}, "ingest", str(corpus / "trio-0.txt")
    )
    assert first.returncode == 0, first.stderr
    result = cli({**custom, "TRIOINDEX_EMBEDDING_DIMENSION": "768"}, "ingest", str(corpus))
    assert result.returncode == 2
    assert "registered with dimension 1024" in result.stderr and "Traceback" not in result.stderr
    # a known model's dimension is checked before anything is touched
    known = cli({**env, "TRIOINDEX_EMBEDDING_DIMENSION": "768"}, "status")
    assert known.returncode == 2 and "must be 1024 for BAAI/bge-m3" in known.stderr


def test_ingest_of_a_missing_path_is_one_line(env: dict[str, str], tmp_path: Path) -> None:
    result = cli(env, "ingest", str(tmp_path / "nope"))
    assert result.returncode == 1 and "no such file or folder" in result.stderr
    assert "Traceback" not in result.stderr


def test_migrate_reports_an_up_to_date_schema(env: dict[str, str]) -> None:
    result = cli(env, "migrate")
    assert result.returncode == 0 and "schema is up to date" in result.stdout


def test_metrics_endpoint_counts_jobs_and_leaks_no_ids_or_text(
    env: dict[str, str], corpus: Path, tmp_path: Path, database_url: str
) -> None:
    import socket

    import httpx

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert cli(env, "ingest", str(corpus / "trio-0.txt"), str(corpus / "empty.txt")).returncode == 0
    proc = spawn(env, "worker", "--metrics-port", str(port), log=tmp_path / "worker.log")
    try:
        wait_for(
            lambda: (
                len(
                    query(
                        database_url, "SELECT 1 FROM embedding_jobs WHERE finished_at IS NOT NULL"
                    )
                )
                == 2
            ),
            60,
            "both jobs to finish",
        )
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert 'trioindex_jobs_total{failure_type="",outcome="succeeded"} 1.0' in text
    assert (
        'trioindex_jobs_total{failure_type="DOCUMENT_CONTENT_INVALID",outcome="failed"} 1.0' in text
    )
    assert 'trioindex_step_duration_seconds_count{step="embed"} 1.0' in text
    assert "trioindex_slots_max 2.0" in text
    ids = [str(r["id"]) for r in query(database_url, "SELECT id FROM embedding_jobs")]
    assert not [i for i in ids if i in text]
    assert "marker-trio" not in text


def test_a_connection_lost_mid_command_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    import psycopg
    import typer

    from trioindex.cli import friendly

    @friendly
    def command() -> None:
        raise psycopg.OperationalError("terminating connection due to administrator command")

    with pytest.raises(typer.Exit) as exit_info:
        command()
    assert exit_info.value.exit_code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "trioindex: lost the database connection "
        "(terminating connection due to administrator command); re-run"
    ]
