"""The command line as people use it: subprocesses, their output and exit codes.

Runs against an S3 server on loopback and an HTTP (TEI) embedding server, on a fresh database;
the embedded-defaults path is covered by tests/worker/test_process.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import attrs
import psycopg
import pytest

from testkit.documents import write_corpus
from testkit.embed_server import FakeEmbedServer
from testkit.processes import FAST_WORKER, base_env, cli, query, spawn, wait_for
from tests.fixtures.s3 import S3Server
from trioindex.config import load_settings
from trioindex.db.pool import with_dbname

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


@attrs.frozen
class Indexed:
    """A corpus ingested with ``--wait`` while one worker ran (see :func:`indexed`)."""

    env: dict[str, str]
    database_url: str
    documents: int  # files of the corpus that have text
    ingest: subprocess.CompletedProcess[str]
    worker_log: Path


@pytest.fixture(scope="module")
def indexed(
    pg_server_url: str,
    template_database: str,
    s3_server: S3Server,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Indexed]:
    """Index the corpus (plus one empty file) once for the tests that read what it built: a
    fresh database, an S3 bucket, a fake TEI server and a worker kept running until the module
    ends. Only the last of those tests changes anything (it retries the failed job)."""
    name = f"trioindex_cli_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_database}"')
    database_url = with_dbname(pg_server_url, name)
    bucket = f"test-{uuid.uuid4().hex[:20]}"
    s3_server.client().make_bucket(bucket)
    home = tmp_path_factory.mktemp("indexed")
    docs = home / "docs"
    written = write_corpus(docs, sentences=3)
    (docs / "empty.txt").write_text("   \n")
    with FakeEmbedServer() as server:
        env = base_env(
            TRIOINDEX_DATABASE_URL=database_url,
            TRIOINDEX_STORAGE_URL=s3_server.url(bucket),
            TRIOINDEX_EMBEDDING_API="tei",
            TRIOINDEX_EMBEDDING_URL=server.url,
            TRIOINDEX_EMBEDDING_MODEL="BAAI/bge-m3",
            TRIOINDEX_EMBEDDING_DIMENSION="1024",
            TRIOINDEX_HOME=str(home / "home"),
            **FAST_WORKER,
        )
        log = home / "worker.log"
        worker = spawn(env, "worker", log=log)
        try:
            ingest = cli(env, "ingest", str(docs), "--wait", timeout=180)
            yield Indexed(env, database_url, len(written), ingest, log)
        finally:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=30)
            finally:
                worker.kill()
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_ingest_wait_shows_progress_and_fails_listing_failed_documents(indexed: Indexed) -> None:
    result = indexed.ingest
    assert result.returncode == 1, result.stderr[-2000:]
    assert "FAILED empty.txt: DOCUMENT_CONTENT_INVALID" in result.stderr
    assert "indexing" in result.stdout  # the progress bar's label
    assert "added" in result.stdout  # the summary: added, changed, unchanged
    states = query(
        indexed.database_url, "SELECT status, count(*) AS n FROM embedding_jobs GROUP BY status"
    )
    assert {r["status"]: r["n"] for r in states} == {"SUCCEEDED": indexed.documents, "FAILED": 1}


def test_search_finds_a_stored_chunk_by_its_own_text_first(indexed: Indexed) -> None:
    """Rank, score, key, chunk index. The fake server's vectors carry no meaning, so the query
    is a stored chunk's own text: it must come back first with a cosine score of 1."""
    (chunk,) = query(
        indexed.database_url,
        """SELECT c.content FROM document_chunks c
           JOIN served_versions s ON s.document_version_id = c.document_version_id
           JOIN documents d ON d.id = s.document_id
           WHERE d.external_key = 'lease-0.txt' ORDER BY c.chunk_index LIMIT 1""",
    )
    # the .txt, .md, .html and .docx copies of a topic share paragraphs: any chunk with exactly
    # this text is a correct first hit
    same_text = {
        (r["external_key"], r["chunk_index"])
        for r in query(
            indexed.database_url,
            """SELECT d.external_key, c.chunk_index FROM document_chunks c
               JOIN served_versions s ON s.document_version_id = c.document_version_id
               JOIN documents d ON d.id = s.document_id
               WHERE c.content = %s""",
            chunk["content"],
        )
    }
    found = cli(
        indexed.env, "search", chunk["content"], "--top-k", "3", "--chunks", "--mode", "vector"
    )
    assert found.returncode == 0, found.stderr
    rank, score, key, index = found.stdout.splitlines()[0].split()
    assert (rank, score) == ("1.", "1.0000")
    assert (key, int(index.lstrip("#"))) in same_text
    hit_lines = [re.match(r"\s*(\d+)\. \d\.\d{4}  ", line) for line in found.stdout.splitlines()]
    assert [m.group(1) for m in hit_lines if m] == ["1", "2", "3"]


def test_search_chunks_json_keeps_the_first_release_shape(indexed: Indexed) -> None:
    hits = json.loads(cli(indexed.env, "search", "renewable lease", "--chunks", "--json").stdout)
    assert [h["rank"] for h in hits] == list(range(1, len(hits) + 1))
    assert set(hits[0]) == {
        "rank", "score", "document_key", "document_id", "version_no", "chunk_index", "text",
        "matches", "snippet", "highlights",  # added fields, the first release's kept
    }  # fmt: skip


def test_search_lists_documents_with_their_best_chunks(indexed: Indexed) -> None:
    """Default: one hit per document. Every topic exists as .txt/.md/.html/.docx/.pdf with the
    same paragraphs, so the chunk-level top 10 repeats documents; document hits never do."""
    args = ("search", "worker lease renewal", "--top-k", "4", "--mode", "text")
    docs = json.loads(cli(indexed.env, *args, "--json").stdout)
    assert [d["rank"] for d in docs] == [1, 2, 3, 4]
    assert len({d["document_key"] for d in docs}) == 4
    assert set(docs[0]) == {
        "rank", "score", "document_key", "document_id", "version_no", "content_type", "chunks",
    }  # fmt: skip
    assert set(docs[0]["chunks"][0]) == {"chunk_index", "score", "snippet", "highlights"}
    assert all(1 <= len(d["chunks"]) <= 3 for d in docs)
    assert all(d["score"] == d["chunks"][0]["score"] for d in docs)
    text = cli(indexed.env, *args).stdout.splitlines()
    assert re.match(r"  1\. \d\.\d{4}  \S+  \(v1\)$", text[0])
    assert re.match(r"       #\d+ +\d\.\d{4}  ", text[1])
    # filters: a content type family, and a key prefix
    only_md = json.loads(
        cli(indexed.env, *args, "--content-type", "text/markdown", "--json").stdout
    )
    assert only_md and all(d["document_key"].endswith(".md") for d in only_md)
    assert all(d["content_type"] == "text/markdown" for d in only_md)
    lease = json.loads(cli(indexed.env, *args, "--prefix", "lease-", "--json").stdout)
    assert lease and all(d["document_key"].startswith("lease-") for d in lease)


def test_search_queries_reads_json_lines_and_writes_one_line_per_query(
    indexed: Indexed, tmp_path: Path
) -> None:
    queries = [
        {"id": i, "text": t} for i, t in enumerate(["lease", "claim", "드라이브", "nursery"])
    ]
    path = tmp_path / "queries.jsonl"
    path.write_text("\n".join(json.dumps(q, ensure_ascii=False) for q in queries) + "\n\n")
    run = cli(indexed.env, "search", "--queries", str(path), "--top-k", "2")
    assert run.returncode == 0, run.stderr
    lines = [json.loads(line) for line in run.stdout.splitlines()]
    assert [line["id"] for line in lines] == [0, 1, 2, 3]
    assert all(len(line["results"]) <= 2 for line in lines)
    assert all({"document_key", "chunks"} <= set(r) for line in lines for r in line["results"])
    # the same query alone gives the same documents
    alone = json.loads(cli(indexed.env, "search", "claim", "--top-k", "2", "--json").stdout)
    assert [r["document_key"] for r in lines[1]["results"]] == [r["document_key"] for r in alone]
    path.write_text('{"id": 1, "text": "ok"}\nnot json\n')
    bad = cli(indexed.env, "search", "--queries", str(path))
    assert bad.returncode == 1
    ok, refused = [json.loads(line) for line in bad.stdout.splitlines()]
    assert ok["id"] == 1 and "results" in ok
    assert refused == {
        "id": None,
        "error": {"code": "QUERY_INVALID", "message": "--queries line 2: not JSON"},
    }
    assert bad.stderr.strip() == "trioindex: 1 of 2 queries refused (see their errors)"


def test_status_counts_jobs_failures_and_the_live_worker(indexed: Indexed) -> None:
    status = json.loads(cli(indexed.env, "status", "--json").stdout)
    assert status["jobs_by_status"]["SUCCEEDED"] == indexed.documents
    assert status["failures_by_type"] == {"DOCUMENT_CONTENT_INVALID": 1}
    assert [w["state"] for w in status["workers"]] == ["RUNNING"]
    text = cli(indexed.env, "status").stdout
    assert f"SUCCEEDED {indexed.documents}" in text
    assert "DOCUMENT_CONTENT_INVALID 1" in text


def test_jobs_list_show_and_retry_the_failed_document(indexed: Indexed) -> None:
    env, url = indexed.env, indexed.database_url
    failed = json.loads(cli(env, "jobs", "list", "--status", "FAILED", "--json").stdout)
    assert [j["document_key"] for j in failed] == ["empty.txt"]
    shown = cli(env, "jobs", "show", failed[0]["id"]).stdout
    assert "attempt 1: FAILED" in shown
    assert "DOCUMENT_CONTENT_INVALID" in shown
    retried = cli(env, "jobs", "retry", "--all-failed")
    assert retried.returncode == 0, retried.stderr
    assert "1 job(s) back in the queue" in retried.stdout
    wait_for(
        lambda: query(
            url, "SELECT 1 FROM embedding_jobs WHERE status = 'FAILED' AND attempt_count = 2"
        ),
        30,
        "the retried job to fail again (the file is still empty)",
    )
    assert "healthcheck" not in indexed.worker_log.read_text()


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


def test_ingest_reports_bad_names_and_outside_links_goes_on_and_exits_non_zero(
    env: dict[str, str], tmp_path: Path, database_url: str
) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("a plain document")
    fd = os.open(os.fsencode(docs) + b"/bad\xff.txt", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    os.close(fd)
    (tmp_path / "secret.txt").write_text("not part of the folder")
    (docs / "link.txt").symlink_to(tmp_path / "secret.txt")
    (docs / "z.txt").write_text("the last document")

    result = cli(env, "ingest", str(docs), "--json")
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(line["document_key"], line["status"]) for line in lines] == [
        ("a.txt", "created"),
        (None, "error"),
        ("link.txt", "skipped"),
        ("z.txt", "created"),
    ]
    assert lines[1]["path"] == f"{docs}/bad\\xff.txt" and "UTF-8" in lines[1]["reason"]
    assert "outside" in lines[2]["reason"]
    keys = query(database_url, "SELECT external_key FROM documents ORDER BY 1")
    assert [r["external_key"] for r in keys] == ["a.txt", "z.txt"]

    human = cli(env, "ingest", str(docs))
    assert human.returncode == 1 and "Traceback" not in human.stderr
    out = human.stdout.splitlines()
    assert any(line.startswith("error") and "bad\\xff.txt" in line for line in out), out
    assert any(line.startswith("skipped") and "link.txt" in line for line in out), out
    assert "0 added, 0 changed, 2 unchanged, 1 skipped, 1 error" in human.stdout
    assert "could not be ingested" in human.stderr

    (docs / "bad\udcff.txt").unlink()
    followed = cli(env, "ingest", str(docs), "--follow-symlinks", "--json")
    assert followed.returncode == 0, followed.stderr
    statuses = {
        json.loads(line)["document_key"]: json.loads(line)["status"]
        for line in followed.stdout.splitlines()
    }
    assert statuses == {"a.txt": "unchanged", "link.txt": "created", "z.txt": "unchanged"}


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
    # the configured max-concurrency (derived from the embedder when not set), from the start
    expected = load_settings(environ=env).worker.max_concurrency
    assert f"trioindex_slots_max {float(expected)}" in text
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
