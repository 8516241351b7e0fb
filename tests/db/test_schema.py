"""The schema's constraints and the migration runner, on a real PostgreSQL + pgvector."""

from __future__ import annotations

import multiprocessing
import uuid

import psycopg
import pytest

from testkit.postgres import admin, drop_database, with_dbname
from trioindex.db import migrations
from trioindex.db.migrations import Migration, available_migrations, current_version, migrate
from trioindex.db.pool import Database
from trioindex.errors import ConfigError


def _model(
    conn: psycopg.Connection[object], name: str = "m", dim: int = 3, active: bool = False
) -> uuid.UUID:
    row = conn.execute(
        "INSERT INTO embedding_models (name, dimension, is_active) VALUES (%s, %s, %s) RETURNING id",
        (name, dim, active),
    ).fetchone()
    assert row is not None
    return row["id"]  # type: ignore[index,no-any-return,call-overload]


def _version(conn: psycopg.Connection[object], key: str = "doc") -> tuple[uuid.UUID, uuid.UUID]:
    doc = conn.execute(
        "INSERT INTO documents (external_key) VALUES (%s) RETURNING id", (key,)
    ).fetchone()["id"]  # type: ignore[index,call-overload]
    ver = conn.execute(
        """INSERT INTO document_versions (document_id, version_no, storage_key, original_name,
               byte_size, sha256) VALUES (%s, 1, 'k', 'a.txt', 1, %s) RETURNING id""",
        (doc, "a" * 64),
    ).fetchone()["id"]  # type: ignore[index,call-overload]
    return doc, ver


def _chunk(
    conn: psycopg.Connection[object], doc: uuid.UUID, ver: uuid.UUID, index: int
) -> uuid.UUID:
    return conn.execute(  # type: ignore[no-any-return]
        """INSERT INTO document_chunks (document_id, document_version_id, chunk_index, content,
               char_start, char_end, token_count, content_sha256)
           VALUES (%s, %s, %s, 'x', 0, 1, 1, %s) RETURNING id""",
        (doc, ver, index, "b" * 64),
    ).fetchone()["id"]  # type: ignore[index,call-overload]


def test_one_job_per_version_and_model(db: Database) -> None:
    with db.connection() as conn:
        model = _model(conn)
        _, ver = _version(conn)
        sql = "INSERT INTO embedding_jobs (document_version_id, embedding_model_id, max_attempts) VALUES (%s, %s, 3)"
        conn.execute(sql, (ver, model))
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute(sql, (ver, model))


def test_unique_chunk_index_per_version(db: Database) -> None:
    with db.connection() as conn:
        doc, ver = _version(conn)
        _chunk(conn, doc, ver, 0)
        with pytest.raises(psycopg.errors.UniqueViolation):
            _chunk(conn, doc, ver, 0)


def test_unique_embedding_per_chunk_and_model(db: Database) -> None:
    with db.connection() as conn:
        model = _model(conn, dim=3)
        doc, ver = _version(conn)
        chunk = _chunk(conn, doc, ver, 0)
        sql = """INSERT INTO embeddings (chunk_id, document_id, document_version_id, embedding_model_id,
                     vector, dimension, vector_sha256) VALUES (%s, %s, %s, %s, '[1,2,3]', 3, %s)"""
        conn.execute(sql, (chunk, doc, ver, model, "c" * 64))
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute(sql, (chunk, doc, ver, model, "c" * 64))


def test_embedding_dimension_must_match_vector_and_model(db: Database) -> None:
    with db.connection() as conn:
        model = _model(conn, dim=3)
        doc, ver = _version(conn)
        chunk = _chunk(conn, doc, ver, 0)
        sql = """INSERT INTO embeddings (chunk_id, document_id, document_version_id, embedding_model_id,
                     vector, dimension, vector_sha256) VALUES (%s, %s, %s, %s, %s, %s, %s)"""
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(sql, (chunk, doc, ver, model, "[1,2]", 3, "c" * 64))
        with pytest.raises(psycopg.errors.ForeignKeyViolation):
            conn.execute(sql, (chunk, doc, ver, model, "[1,2]", 2, "c" * 64))


def test_embedding_denormalised_ids_must_agree_with_chunk(db: Database) -> None:
    with db.connection() as conn:
        model = _model(conn, dim=3)
        doc, ver = _version(conn, "one")
        other_doc, other_ver = _version(conn, "two")
        chunk = _chunk(conn, doc, ver, 0)
        with pytest.raises(psycopg.errors.ForeignKeyViolation):
            conn.execute(
                """INSERT INTO embeddings (chunk_id, document_id, document_version_id,
                       embedding_model_id, vector, dimension, vector_sha256)
                   VALUES (%s, %s, %s, %s, '[1,2,3]', 3, %s)""",
                (chunk, other_doc, other_ver, model, "c" * 64),
            )


def test_at_most_one_active_model(db: Database) -> None:
    with db.connection() as conn:
        _model(conn, "a", active=True)
        _model(conn, "b", active=False)
        with pytest.raises(psycopg.errors.UniqueViolation):
            _model(conn, "c", active=True)


def test_a_served_version_must_belong_to_the_document(db: Database) -> None:
    with db.connection() as conn:
        model = _model(conn)
        doc, _ = _version(conn, "one")
        _, other_ver = _version(conn, "two")
        with pytest.raises(psycopg.errors.ForeignKeyViolation):
            conn.execute(
                """INSERT INTO served_versions
                       (document_id, embedding_model_id, document_version_id, chunks, text_length)
                   VALUES (%s, %s, %s, 0, 0)""",
                (doc, model, other_ver),
            )


def test_processing_requires_every_claim_column(db: Database) -> None:
    with db.connection() as conn:
        model = _model(conn)
        _, ver = _version(conn)
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(
                """INSERT INTO embedding_jobs (document_version_id, embedding_model_id, max_attempts, status)
                   VALUES (%s, %s, 3, 'PROCESSING')""",
                (ver, model),
            )


def test_unknown_status_and_failure_type_are_refused(db: Database) -> None:
    with db.connection() as conn:
        model = _model(conn)
        _, ver = _version(conn)
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(
                """INSERT INTO embedding_jobs (document_version_id, embedding_model_id, max_attempts, status)
                   VALUES (%s, %s, 3, 'DONE')""",
                (ver, model),
            )
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(
                """INSERT INTO embedding_jobs (document_version_id, embedding_model_id, max_attempts,
                       last_failure_type) VALUES (%s, %s, 3, 'OOPS')""",
                (ver, model),
            )


def test_claim_index_is_a_partial_index_on_pending(db: Database) -> None:
    with db.connection() as conn:
        row = conn.execute(
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'embedding_jobs_claim'"
        ).fetchone()
    assert row is not None
    assert "priority DESC, available_at, id" in row["indexdef"]
    assert "WHERE (status = 'PENDING'::text)" in row["indexdef"]


def test_updated_at_moves_on_update(db: Database) -> None:
    with db.connection() as conn:
        doc, _ = _version(conn)
        before = conn.execute("SELECT updated_at FROM documents WHERE id = %s", (doc,)).fetchone()
        conn.execute("UPDATE documents SET external_key = 'renamed' WHERE id = %s", (doc,))
        after = conn.execute("SELECT updated_at FROM documents WHERE id = %s", (doc,)).fetchone()
    assert before is not None and after is not None
    assert after["updated_at"] > before["updated_at"]


def _migrate_in_process(url: str, queue: multiprocessing.Queue[list[int]]) -> None:
    queue.put(migrate(url))


def test_concurrent_migrations_from_several_processes(empty_database_url: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    queue: multiprocessing.Queue[list[int]] = ctx.Queue()
    procs = [
        ctx.Process(target=_migrate_in_process, args=(empty_database_url, queue)) for _ in range(4)
    ]
    for proc in procs:
        proc.start()
    results = [queue.get(timeout=60) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    everything = [m.version for m in available_migrations()]
    # exactly one process applied each migration; the others found nothing to do
    applied = sorted(v for r in results for v in r)
    assert applied == everything
    with psycopg.connect(empty_database_url) as conn:
        assert current_version(conn) == everything[-1]  # type: ignore[arg-type]


def test_migrate_twice_applies_nothing_the_second_time(empty_database_url: str) -> None:
    assert migrate(empty_database_url) == [m.version for m in available_migrations()]
    assert migrate(empty_database_url) == []


def test_a_failing_migration_leaves_the_schema_as_it_was(
    empty_database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    shipped = available_migrations()
    broken = Migration(
        len(shipped) + 1, "broken", "CREATE TABLE trioindex_half (id int); SELECT 1/0"
    )
    monkeypatch.setattr(migrations, "available_migrations", lambda: [*shipped, broken])
    with pytest.raises(psycopg.errors.DivisionByZero):
        migrate(empty_database_url)
    with psycopg.connect(empty_database_url) as conn:
        assert current_version(conn) == 0
        assert conn.execute("SELECT to_regclass('embedding_jobs')").fetchone() == (None,)
    monkeypatch.undo()
    assert migrate(empty_database_url) == [m.version for m in shipped]


def test_migrate_refuses_a_database_that_is_not_utf8(pg_server_url: str) -> None:
    # Under SQL_ASCII every text column comes back as bytes and claims broke far from the cause;
    # the refusal names the encoding and creates nothing.
    name = f"trioindex_ascii_{uuid.uuid4().hex[:8]}"
    admin(pg_server_url, f"CREATE DATABASE \"{name}\" ENCODING 'SQL_ASCII' TEMPLATE template0")
    try:
        url = with_dbname(pg_server_url, name)
        with pytest.raises(ConfigError, match="encoding SQL_ASCII; trioindex needs UTF8"):
            migrate(url)
        with psycopg.connect(url) as conn:
            assert current_version(conn) == 0
    finally:
        drop_database(pg_server_url, name)
