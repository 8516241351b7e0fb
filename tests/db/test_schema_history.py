"""A database migrated from an earlier release ends up identical to one created fresh.

The earlier releases' migration texts come from the repository's history (``git show``): the
first release (version 1) and the last release before per-model state (version 8), whose
files still held every function body. Each is applied as that release applied it, then
today's :func:`migrate` runs; the catalogue (tables, columns, constraints, indexes, storage
options, functions, triggers) must equal that of a fresh database, and the data the old
release wrote must be converted: each model serves what it completed.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import psycopg
import pytest

from testkit.postgres import fresh_database
from trioindex.db.migrations import available_migrations, migrate

REPO = Path(__file__).resolve().parents[2]
# the last commit whose migrations 0001-0008 still defined every function in place
OLD_RELEASE = "6d473b3"
MIGRATIONS = "src/trioindex/db/migrations"


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True
    ).stdout


def _old_migrations(upto: int) -> list[tuple[int, str, str]]:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs the repository's git history (git and .git)")
    try:
        names = _git("ls-tree", "--name-only", f"{OLD_RELEASE}:{MIGRATIONS}").split()
    except subprocess.CalledProcessError:
        pytest.skip(f"commit {OLD_RELEASE} is not in this clone's history (shallow clone?)")
    found = []
    for name in sorted(n for n in names if n[:4].isdigit() and n.endswith(".sql")):
        version = int(name[:4])
        if version <= upto:
            text = _git("show", f"{OLD_RELEASE}:{MIGRATIONS}/{name}")
            found.append((version, name[5:-4], text))
    assert [v for v, _, _ in found] == list(range(1, upto + 1))
    return found


def _apply_old(url: str, upto: int) -> None:
    """What the old release's ``migrate`` did: each file in its own transaction, recorded."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            """CREATE TABLE trioindex_schema_migrations (
                   version integer PRIMARY KEY, name text NOT NULL,
                   applied_at timestamptz NOT NULL DEFAULT now())"""
        )
        for version, name, text in _old_migrations(upto):
            with conn.transaction():
                conn.execute(text.encode())
                conn.execute(
                    "INSERT INTO trioindex_schema_migrations (version, name) VALUES (%s, %s)",
                    (version, name),
                )


_CATALOGUE = {
    "columns": """
        SELECT table_name, column_name, data_type, is_nullable, column_default,
               is_generated, generation_expression
        FROM information_schema.columns WHERE table_schema = 'public'
        ORDER BY 1, 2""",
    "constraints": """
        SELECT c.conrelid::regclass::text, c.conname, pg_get_constraintdef(c.oid)
        FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace
        WHERE n.nspname = 'public' ORDER BY 1, 2""",
    "indexes": """
        SELECT tablename, indexname, indexdef FROM pg_indexes
        WHERE schemaname = 'public' ORDER BY 1, 2""",
    "storage": """
        SELECT c.relname, c.relkind, coalesce(c.reloptions, '{}')
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'public' AND c.relkind IN ('r', 'i') ORDER BY 1""",
    "functions": """
        SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid), p.proconfig
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = 'public' AND p.proname LIKE 'trioindex%%' ORDER BY 1""",
    "triggers": """
        SELECT tgrelid::regclass::text, tgname, pg_get_triggerdef(t.oid)
        FROM pg_trigger t WHERE NOT tgisinternal ORDER BY 1, 2""",
}


def _catalogue(url: str) -> dict[str, list[tuple[Any, ...]]]:
    with psycopg.connect(url) as conn:
        return {name: conn.execute(sql).fetchall() for name, sql in _CATALOGUE.items()}


def _seed_old_release(url: str) -> dict[str, Any]:
    """A document with two versions indexed by model A (v2 current), and v2 failed for B."""
    with psycopg.connect(url, autocommit=True) as conn:
        a, b = (
            conn.execute(
                "INSERT INTO embedding_models (name, dimension, is_active)"
                " VALUES (%s, 2, %s) RETURNING id",
                (name, name == "a"),
            ).fetchone()[0]  # type: ignore[index]
            for name in ("a", "b")
        )
        doc = conn.execute(
            "INSERT INTO documents (external_key) VALUES ('k') RETURNING id"
        ).fetchone()[0]  # type: ignore[index]
        versions = []
        for no in (1, 2):
            version = conn.execute(
                """INSERT INTO document_versions (document_id, version_no, storage_key,
                       original_name, byte_size, sha256, status, chunk_count)
                   VALUES (%s, %s, 'sha256/x', 'k', 1, %s, 'INDEXED', 1) RETURNING id""",
                (doc, no, "a" * 64),
            ).fetchone()[0]  # type: ignore[index]
            chunk = conn.execute(
                """INSERT INTO document_chunks (document_id, document_version_id, chunk_index,
                       content, char_start, char_end, token_count, content_sha256)
                   VALUES (%s, %s, 0, 'x', 0, 1, 1, %s) RETURNING id""",
                (doc, version, "b" * 64),
            ).fetchone()[0]  # type: ignore[index]
            conn.execute(
                """INSERT INTO embeddings (chunk_id, document_id, document_version_id,
                       embedding_model_id, vector, dimension, vector_sha256)
                   VALUES (%s, %s, %s, %s, '[1,0]', 2, %s)""",
                (chunk, doc, version, a, "c" * 64),
            )
            conn.execute(
                """INSERT INTO embedding_jobs (document_version_id, embedding_model_id,
                       status, attempt_count, max_attempts, finished_at)
                   VALUES (%s, %s, 'SUCCEEDED', 1, 3, now())""",
                (version, a),
            )
            versions.append(version)
        conn.execute(
            """INSERT INTO embedding_jobs (document_version_id, embedding_model_id, status,
                   attempt_count, max_attempts, finished_at, last_failure_type)
               VALUES (%s, %s, 'FAILED', 1, 1, now(), 'EMBEDDING_RESULT_INVALID')""",
            (versions[1], b),
        )
        conn.execute(
            "UPDATE documents SET current_version_id = %s WHERE id = %s", (versions[1], doc)
        )
    return {"a": a, "b": b, "doc": doc, "v2": versions[1]}


@pytest.mark.parametrize("release", [1, 8], ids=["first release", "version 8"])
def test_a_database_migrated_from_an_earlier_release_equals_a_fresh_one(
    pg_server_url: str, release: int
) -> None:
    with (
        fresh_database(pg_server_url, "trioindex_fresh") as fresh,
        fresh_database(pg_server_url, "trioindex_old") as old,
    ):
        migrate(fresh)
        _apply_old(old, release)
        seeded = _seed_old_release(old) if release == 8 else None
        migrate(old)
        assert _catalogue(old) == _catalogue(fresh)
        if seeded is not None:
            with psycopg.connect(old) as conn:
                served = conn.execute(
                    "SELECT embedding_model_id, document_version_id FROM served_versions"
                ).fetchall()
                counts = conn.execute(
                    "SELECT status, chunk_count FROM embedding_jobs ORDER BY status, chunk_count"
                ).fetchall()
            assert served == [(seeded["a"], seeded["v2"])]  # B completed nothing: serves none
            assert counts == [("FAILED", None), ("SUCCEEDED", 1), ("SUCCEEDED", 1)]


def test_functions_are_applied_again_only_when_their_text_changes(empty_database_url: str) -> None:
    migrate(empty_database_url)
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        first = conn.execute("SELECT sha256, applied_at FROM trioindex_schema_functions").fetchone()
        # an operator's stray function of ours is dropped when the file is applied again
        conn.execute("CREATE FUNCTION trioindex_stray() RETURNS int LANGUAGE sql AS 'SELECT 1'")
    migrate(empty_database_url)
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        assert (
            conn.execute("SELECT sha256, applied_at FROM trioindex_schema_functions").fetchone()
            == first
        )
        conn.execute("UPDATE trioindex_schema_functions SET sha256 = 'changed'")
    migrate(empty_database_url)
    with psycopg.connect(empty_database_url) as conn:
        row = conn.execute("SELECT sha256 FROM trioindex_schema_functions").fetchone()
        stray = conn.execute("SELECT to_regproc('trioindex_stray')").fetchone()
    assert row is not None and first is not None and row[0] == first[0]
    assert stray == (None,)


def _migrate_to(conn: psycopg.Connection[Any], version: int) -> None:
    """Today's migrations up to ``version``, each recorded as ``migrate`` records it."""
    conn.execute(
        """CREATE TABLE trioindex_schema_migrations (
               version integer PRIMARY KEY, name text NOT NULL,
               applied_at timestamptz NOT NULL DEFAULT now())"""
    )
    for migration in available_migrations():
        if migration.version <= version:
            with conn.transaction():
                conn.execute(migration.sql.encode())
                conn.execute(
                    "INSERT INTO trioindex_schema_migrations (version, name) VALUES (%s, %s)",
                    (migration.version, migration.name),
                )


# A model (m), a RUNNING worker (w) and a document (d), for a test's later CTEs to build on.
_MODEL_WORKER_DOCUMENT = """WITH
    m AS (INSERT INTO embedding_models (name, dimension, is_active)
          VALUES ('m', 4, true) RETURNING id),
    w AS (INSERT INTO indexing_workers (hostname, pid, version, status, max_concurrency)
          VALUES ('h', 1, 'v', 'RUNNING', 1) RETURNING id),
    d AS (INSERT INTO documents (external_key) VALUES ('a.txt') RETURNING id),"""


def _versions(count: int) -> str:
    """A CTE ``v``: versions 1 to ``count`` of the document ``d``, for a test's later CTEs."""
    return f"""
    v AS (INSERT INTO document_versions (document_id, version_no, storage_key, original_name,
                                         byte_size, sha256)
          SELECT d.id, n, 'k' || n, 'a.txt', 3, repeat(n::text, 64)
          FROM d, generate_series(1, {int(count)}) AS n RETURNING id, version_no),"""


def test_version_15_folds_the_step_events_into_their_attempts(pg_server_url: str) -> None:
    """A database at version 14 with a job's step events: version 15 records them on the
    attempt (times, counts, slices) and deletes them; the other events stay."""
    with fresh_database(pg_server_url, "trioindex_v14") as url:
        with psycopg.connect(url, autocommit=True) as conn:
            _migrate_to(conn, 14)
            ids = conn.execute(
                _MODEL_WORKER_DOCUMENT
                + """
                   v AS (INSERT INTO document_versions (document_id, version_no, storage_key,
                                                        original_name, byte_size, sha256)
                         SELECT d.id, 1, 'k', 'a.txt', 3, repeat('0', 64) FROM d
                         RETURNING id),
                   j AS (INSERT INTO embedding_jobs
                             (document_version_id, embedding_model_id, max_attempts)
                         SELECT v.id, m.id, 3 FROM v, m RETURNING id, document_version_id)
                   INSERT INTO embedding_job_attempts (embedding_job_id, attempt_no, worker_id)
                   SELECT j.id, 1, w.id FROM j, w RETURNING id, embedding_job_id"""
            ).fetchone()
            assert ids is not None
            attempt, job = ids
            conn.execute(
                """INSERT INTO indexing_events
                       (event_type, embedding_job_id, attempt_id, detail, created_at)
                   SELECT e, %s, %s, x::jsonb, '2026-01-01 00:00:00+00'::timestamptz + s
                   FROM (VALUES
                       ('JOB_RETRY_REQUESTED', '{"extra_attempts": 1}', interval '0 s'),
                       ('PARSING_STARTED', '{}', interval '1 s'),
                       ('CHUNKS_STORED', '{"chunks": 5, "characters": 900,
                                           "replaced_sequences": 2}', interval '2 s'),
                       ('EMBEDDING_STARTED', '{"chunks": 5}', interval '3 s'),
                       ('EMBEDDINGS_STORED', '{"embeddings": 3}', interval '4 s'),
                       ('EMBEDDINGS_STORED', '{"embeddings": 2}', interval '5 s'))
                       AS u(e, x, s)""",
                (job, attempt),
            )
        assert migrate(url)[:3] == [15, 16, 17]
        with psycopg.connect(url) as conn:
            row = conn.execute(
                """SELECT extract(epoch FROM parse_started_at - started_at) IS NOT NULL AS t,
                          to_char(parse_started_at AT TIME ZONE 'UTC', 'SS') AS parse,
                          to_char(chunks_stored_at AT TIME ZONE 'UTC', 'SS') AS chunks_at,
                          to_char(embedding_started_at AT TIME ZONE 'UTC', 'SS') AS embed,
                          to_char(embeddings_stored_at AT TIME ZONE 'UTC', 'SS') AS stored,
                          chunks, characters, replaced_sequences, embeddings, embedding_slices
                   FROM embedding_job_attempts WHERE id = %s""",
                (attempt,),
            ).fetchone()
            events = conn.execute("SELECT event_type FROM indexing_events").fetchall()
    assert row == (True, "01", "02", "03", "05", 5, 900, 2, 5, 2)
    assert events == [("JOB_RETRY_REQUESTED",)]


def test_version_16_moves_statistics_onto_served_rows_and_claims_onto_attempts(
    pg_server_url: str,
) -> None:
    """A database at version 15 serving a document of two chunks (and holding a stale
    statistics row), with a job's claim and success events: version 16 counts each served
    row's chunks with the model's vectors on its version, and their length, onto the row, and
    drops the table; it records the success's became_current on the attempt and deletes the
    claim and success events (the other events stay)."""
    with fresh_database(pg_server_url, "trioindex_v15") as url:
        with psycopg.connect(url, autocommit=True) as conn:
            _migrate_to(conn, 15)
            conn.execute(
                """WITH m AS (INSERT INTO embedding_models (name, dimension, is_active)
                              VALUES ('m', 2, true) RETURNING id),
                   d AS (INSERT INTO documents (external_key) VALUES ('a.txt') RETURNING id),
                   v AS (INSERT INTO document_versions (document_id, version_no, storage_key,
                                                        original_name, byte_size, sha256)
                         SELECT d.id, 1, 'k', 'a.txt', 3, repeat('0', 64) FROM d
                         RETURNING id, document_id),
                   c AS (INSERT INTO document_chunks (document_id, document_version_id,
                             chunk_index, content, char_start, char_end, token_count,
                             content_sha256)
                         SELECT v.document_id, v.id, i, repeat('x', 3 + i), 0, 3 + i, 1,
                                repeat('0', 64)
                         FROM v, generate_series(0, 2) AS i RETURNING id, document_id,
                                                                      document_version_id,
                                                                      chunk_index),
                   e AS (INSERT INTO embeddings (chunk_id, document_id, document_version_id,
                             embedding_model_id, vector, dimension, vector_sha256)
                         SELECT c.id, c.document_id, c.document_version_id, m.id, '[1,0]', 2,
                                repeat('0', 64)
                         FROM c, m WHERE c.chunk_index < 2),
                   s AS (INSERT INTO served_versions (document_id, embedding_model_id,
                                                      document_version_id)
                         SELECT v.document_id, m.id, v.id FROM v, m)
                   INSERT INTO served_text_statistics (embedding_model_id, document_id, chunks,
                                                       text_length)
                   SELECT m.id, d.id, 9, 99 FROM m, d"""
            )
            conn.execute(
                """WITH w AS (INSERT INTO indexing_workers (hostname, pid, version, status,
                                                           max_concurrency)
                             VALUES ('h', 1, 'v', 'RUNNING', 1) RETURNING id),
                   j AS (INSERT INTO embedding_jobs
                             (document_version_id, embedding_model_id, max_attempts)
                         SELECT v.id, m.id, 3 FROM document_versions v, embedding_models m
                         RETURNING id),
                   a AS (INSERT INTO embedding_job_attempts
                             (embedding_job_id, attempt_no, worker_id, status, finished_at)
                         SELECT j.id, 1, w.id, 'SUCCEEDED', now() FROM j, w
                         RETURNING id, embedding_job_id)
                   INSERT INTO indexing_events (event_type, embedding_job_id, attempt_id, detail)
                   SELECT e, a.embedding_job_id, a.id, x::jsonb FROM a, (VALUES
                       ('JOB_ENQUEUED', '{}'),
                       ('JOB_CLAIMED', '{"attempt_no": 1}'),
                       ('JOB_SUCCEEDED', '{"attempt_no": 1, "chunks": 2,
                                           "became_current": false}')) AS u(e, x)"""
            )
        assert migrate(url)[:2] == [16, 17]
        with psycopg.connect(url) as conn:
            served = conn.execute("SELECT chunks, text_length FROM served_versions").fetchall()
            table = conn.execute("SELECT to_regclass('served_text_statistics')").fetchone()
            folded = conn.execute("SELECT became_current FROM embedding_job_attempts").fetchall()
            events = conn.execute("SELECT event_type FROM indexing_events").fetchall()
    assert served == [(2, 3 + 4)]  # chunks 0 and 1 have the model's vectors; 2 has none
    assert table == (None,)
    # the claim and the success are read from the attempt now
    assert folded == [(False,)]
    assert events == [("JOB_ENQUEUED",)]


def test_version_17_folds_each_running_attempt_into_its_job_row(pg_server_url: str) -> None:
    """A database at version 16 with a claimed job whose STARTED attempt recorded its chunk
    step, and a STARTED attempt no claim runs (its job PENDING): version 17 moves the running
    attempt onto its job row (id, steps) and deletes its row, so the claim's fence still
    passes and readers still see it STARTED; the other attempt is EXPIRED, as recovery would
    have marked it."""
    with fresh_database(pg_server_url, "trioindex_v16") as url:
        with psycopg.connect(url, autocommit=True) as conn:
            _migrate_to(conn, 16)
            claim = conn.execute(
                _MODEL_WORKER_DOCUMENT
                + _versions(count=2)
                + """
                   j AS (INSERT INTO embedding_jobs
                             (document_version_id, embedding_model_id, max_attempts, status,
                              attempt_count, worker_id, claim_token, locked_at,
                              lease_expires_at)
                         SELECT v.id, m.id, 3,
                                CASE v.version_no WHEN 1 THEN 'PROCESSING' ELSE 'PENDING' END,
                                1, CASE v.version_no WHEN 1 THEN w.id END,
                                CASE v.version_no WHEN 1 THEN gen_random_uuid() END,
                                CASE v.version_no WHEN 1 THEN now() END,
                                CASE v.version_no WHEN 1 THEN now() + interval '1 hour' END
                         FROM v, m, w RETURNING id, worker_id, claim_token),
                   a AS (INSERT INTO embedding_job_attempts
                             (embedding_job_id, attempt_no, worker_id, chunks_stored_at,
                              chunks, characters)
                         SELECT j.id, 1, w.id, now(), 4, 90 FROM j, w
                         RETURNING id, embedding_job_id)
                   SELECT j.id AS job, j.worker_id AS worker, j.claim_token AS token,
                          a.id AS attempt
                   FROM j JOIN a ON a.embedding_job_id = j.id WHERE j.worker_id IS NOT NULL"""
            ).fetchone()
            assert claim is not None
        assert migrate(url)[:1] == [17]
        with psycopg.connect(url) as conn:
            job = conn.execute(
                """SELECT attempt_id, attempt_chunks, attempt_characters
                   FROM embedding_jobs WHERE id = %s""",
                (claim[0],),
            ).fetchone()
            rows = conn.execute(
                "SELECT status FROM embedding_job_attempts ORDER BY status"
            ).fetchall()
            seen = conn.execute(
                "SELECT id, status, chunks FROM trioindex_job_attempts ORDER BY status DESC"
            ).fetchall()
            renewed = conn.execute(
                """SELECT lease_expires_at IS NOT NULL FROM trioindex_renew_leases(
                       ARRAY[%s]::uuid[], ARRAY[%s]::uuid[], ARRAY[%s]::uuid[],
                       ARRAY[%s]::uuid[], 60)""",
                claim,
            ).fetchone()
    assert job == (claim[3], 4, 90)
    assert rows == [("EXPIRED",)]
    assert seen[0] == (claim[3], "STARTED", 4) and seen[1][1] == "EXPIRED"
    assert renewed == (True,)


def test_version_18_indexes_the_open_jobs_of_every_state_in_one_index(pg_server_url: str) -> None:
    """A database at version 17 with a job in each state, the PROCESSING one's lease run out:
    version 18 replaces the lease index and the by-model index with one index of the jobs
    not SUCCEEDED, built over the rows already there, which recovery and the switch read."""
    with fresh_database(pg_server_url, "trioindex_v17") as url:
        with psycopg.connect(url, autocommit=True) as conn:
            _migrate_to(conn, 17)
            model = conn.execute(
                _MODEL_WORKER_DOCUMENT
                + _versions(count=4)
                + """
                   j AS (INSERT INTO embedding_jobs
                             (document_version_id, embedding_model_id, max_attempts, status,
                              attempt_count, worker_id, claim_token, locked_at,
                              lease_expires_at, attempt_id, finished_at, last_failure_type)
                         SELECT v.id, m.id, 3, s.status, 1,
                                CASE WHEN s.claimed THEN w.id END,
                                CASE WHEN s.claimed THEN gen_random_uuid() END,
                                CASE WHEN s.claimed THEN now() - interval '1 hour' END,
                                CASE WHEN s.claimed THEN now() - interval '1 minute' END,
                                CASE WHEN s.claimed THEN gen_random_uuid() END,
                                CASE WHEN s.status IN ('SUCCEEDED', 'FAILED') THEN now() END,
                                CASE WHEN s.status = 'FAILED' THEN 'WORKER_INTERNAL_ERROR' END
                         FROM v JOIN (VALUES (1, 'PENDING', false), (2, 'PROCESSING', true),
                                             (3, 'SUCCEEDED', false), (4, 'FAILED', false))
                                     AS s(no, status, claimed) ON s.no = v.version_no,
                              m, w
                         RETURNING embedding_model_id)
                   SELECT DISTINCT embedding_model_id FROM j"""
            ).fetchone()
            assert model is not None
        assert migrate(url)[:1] == [18]
        with psycopg.connect(url) as conn:
            indexes = conn.execute(
                """SELECT indexname FROM pg_indexes WHERE tablename = 'embedding_jobs'
                   ORDER BY indexname"""
            ).fetchall()
            # read through the new index alone
            conn.execute("SET enable_seqscan = off")
            conn.execute("SET enable_bitmapscan = off")
            open_jobs = conn.execute(
                """SELECT status FROM embedding_jobs
                   WHERE embedding_model_id = %s AND status IN ('PENDING', 'PROCESSING', 'FAILED')
                   ORDER BY status""",
                model,
            ).fetchall()
            plan = conn.execute(
                """EXPLAIN SELECT id FROM embedding_jobs
                   WHERE status = 'PROCESSING' AND lease_expires_at IS NOT NULL
                     AND lease_expires_at <= clock_timestamp()"""
            ).fetchall()
            expired = conn.execute(
                """SELECT status FROM embedding_jobs
                   WHERE status = 'PROCESSING' AND lease_expires_at IS NOT NULL
                     AND lease_expires_at <= clock_timestamp()"""
            ).fetchall()
            owes = conn.execute("SELECT trioindex_switch_jobs_left(%s)", model).fetchone()
    assert indexes == [
        ("embedding_jobs_claim",),
        ("embedding_jobs_document_version_id_embedding_model_id_key",),
        ("embedding_jobs_open_by_model",),
        ("embedding_jobs_pkey",),
    ]
    assert open_jobs == [("FAILED",), ("PENDING",), ("PROCESSING",)]
    assert "embedding_jobs_open_by_model" in str(plan)
    assert expired == [("PROCESSING",)]
    assert owes == (True,)


def test_version_19_keys_the_attempts_by_job_and_number_and_drops_the_worker_keys(
    pg_server_url: str,
) -> None:
    """A database at version 18 with a job's ended attempts and its running one: version 19
    keys the ended attempts by (job, attempt number) and drops the index on their id, which
    keeps its value and stays required; the attempts read as before, and a second row of one
    job's number is refused by the new key. No foreign key names the worker rows any more."""
    with fresh_database(pg_server_url, "trioindex_v18") as url:
        with psycopg.connect(url, autocommit=True) as conn:
            _migrate_to(conn, 18)
            ids = conn.execute(
                _MODEL_WORKER_DOCUMENT
                + _versions(count=1)
                + """
                   j AS (INSERT INTO embedding_jobs
                             (document_version_id, embedding_model_id, max_attempts, status,
                              attempt_count, worker_id, claim_token, locked_at,
                              lease_expires_at, attempt_id)
                         SELECT v.id, m.id, 3, 'PROCESSING', 3, w.id, gen_random_uuid(),
                                now(), now() + interval '1 hour', gen_random_uuid()
                         FROM v, m, w RETURNING id, attempt_id),
                   a AS (INSERT INTO embedding_job_attempts
                             (id, embedding_job_id, attempt_no, worker_id, status,
                              failure_type, started_at, finished_at)
                         SELECT gen_random_uuid(), j.id, n, w.id,
                                CASE n WHEN 1 THEN 'FAILED' ELSE 'EXPIRED' END,
                                CASE n WHEN 1 THEN 'STORAGE_UNAVAILABLE' END, now(), now()
                         FROM j, w, generate_series(1, 2) AS n RETURNING id, attempt_no)
                   SELECT j.id, j.attempt_id, (SELECT array_agg(id ORDER BY attempt_no) FROM a)
                   FROM j"""
            ).fetchone()
            assert ids is not None
            job, running, ended = ids
        assert migrate(url)[:1] == [19]
        with psycopg.connect(url, autocommit=True) as conn:
            key = conn.execute(
                """SELECT a.attname FROM pg_index i
                   JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
                   WHERE i.indrelid = 'embedding_job_attempts'::regclass AND i.indisprimary
                   ORDER BY array_position(i.indkey::int2[], a.attnum)"""
            ).fetchall()
            indexes = conn.execute(
                """SELECT indexname FROM pg_indexes WHERE tablename = 'embedding_job_attempts'"""
            ).fetchall()
            required = conn.execute(
                """SELECT attnotnull FROM pg_attribute
                   WHERE attrelid = 'embedding_job_attempts'::regclass AND attname = 'id'"""
            ).fetchone()
            worker_keys = conn.execute(
                """SELECT count(*) FROM pg_constraint
                   WHERE confrelid = 'indexing_workers'::regclass"""
            ).fetchone()
            seen = conn.execute(
                """SELECT id, attempt_no, status FROM trioindex_job_attempts
                   WHERE embedding_job_id = %s ORDER BY attempt_no""",
                (job,),
            ).fetchall()
            with pytest.raises(psycopg.errors.UniqueViolation):
                conn.execute(
                    """INSERT INTO embedding_job_attempts
                           (id, embedding_job_id, attempt_no, worker_id, status, started_at,
                            finished_at)
                       SELECT gen_random_uuid(), embedding_job_id, 2, worker_id, 'EXPIRED',
                              now(), now()
                       FROM embedding_job_attempts WHERE attempt_no = 2"""
                )
            with pytest.raises(psycopg.errors.NotNullViolation):
                conn.execute(
                    """INSERT INTO embedding_job_attempts
                           (id, embedding_job_id, attempt_no, worker_id, status, started_at,
                            finished_at)
                       SELECT NULL, embedding_job_id, 9, worker_id, 'EXPIRED', now(), now()
                       FROM embedding_job_attempts WHERE attempt_no = 2"""
                )
    assert key == [("embedding_job_id",), ("attempt_no",)]
    assert indexes == [("embedding_job_attempts_pkey",)]
    assert required == (True,)
    assert worker_keys == (0,)  # the claim's own read of the RUNNING worker row checks the ids
    assert seen == [(ended[0], 1, "FAILED"), (ended[1], 2, "EXPIRED"), (running, 3, "STARTED")]


def test_version_20_keeps_only_the_english_lexemes_of_every_chunk(pg_server_url: str) -> None:
    """A database at version 19 whose chunks hold ``simple`` ⊕ ``english`` lexemes: version 20
    recomputes every chunk's column as ``english`` alone (stems, no stop words, Hangul words as
    written, each once), rebuilds its GIN index and leaves the column analysed; a chunk written
    after it gets the same column."""
    text = "The workers 서울입니다"
    with fresh_database(pg_server_url, "trioindex_v19") as url:
        with psycopg.connect(url, autocommit=True) as conn:
            _migrate_to(conn, 19)
            conn.execute(
                _MODEL_WORKER_DOCUMENT
                + _versions(count=1)
                + """
                   c AS (INSERT INTO document_chunks (document_id, document_version_id,
                             chunk_index, content, char_start, char_end, token_count,
                             content_sha256)
                         SELECT d.id, v.id, 0, %s, 0, 1, 1, repeat('c', 64) FROM d, v
                         RETURNING id)
                   SELECT count(*) FROM c""",
                (text,),
            )
            before = conn.execute("SELECT search_vector::text FROM document_chunks").fetchone()
        assert migrate(url) == [20]
        with psycopg.connect(url, autocommit=True) as conn:
            after = conn.execute("SELECT search_vector::text FROM document_chunks").fetchone()
            matches = conn.execute(
                """SELECT count(*) FROM document_chunks
                   WHERE search_vector @@ to_tsquery('english', 'worker & 서울:*')"""
            ).fetchone()
            index = conn.execute(
                """SELECT indexdef FROM pg_indexes
                   WHERE indexname = 'document_chunks_search_vector'"""
            ).fetchone()
            analysed = conn.execute(
                """SELECT count(*) FROM pg_stats
                   WHERE tablename = 'document_chunks' AND attname = 'search_vector'"""
            ).fetchone()
            fresh = conn.execute(
                """INSERT INTO document_chunks (document_id, document_version_id, chunk_index,
                       content, char_start, char_end, token_count, content_sha256)
                   SELECT document_id, document_version_id, 1, %s, 1, 2, 1, repeat('d', 64)
                   FROM document_chunks RETURNING search_vector::text""",
                (text,),
            ).fetchone()
    assert before == ("'the':1 'worker':5 'workers':2 '서울입니다':3,6",)
    assert after == fresh == ("'worker':2 '서울입니다':3",)
    assert matches == (1,)
    assert index is not None and "USING gin (search_vector)" in index[0]
    assert analysed == (1,)
