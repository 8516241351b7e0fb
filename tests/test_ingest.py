"""Ingest on real PostgreSQL with the folder store and the S3 server: rows, dedupe, NOTIFY."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest
import trio

from tests import helpers
from trioindex.database import Database
from trioindex.errors import ConfigError
from trioindex.ingest import discover, enqueue_version, ingest_paths, storage_key_for
from trioindex.models import ensure_model
from trioindex.storage import AsyncObjectStore, open_store


def _tree(root: Path) -> Path:
    (root / "docs" / "sub").mkdir(parents=True)
    (root / "docs" / "a.txt").write_text("alpha document", encoding="utf-8")
    (root / "docs" / "sub" / "b.md").write_text("# beta\n\nsecond document", encoding="utf-8")
    (root / "docs" / ".hidden").write_text("skip me", encoding="utf-8")
    return root / "docs"


@pytest.fixture(params=["folder", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncObjectStore:
    url = (
        (tmp_path / "blobs").as_uri()
        if request.param == "folder"
        else request.getfixturevalue("s3_url")
    )
    sync_store = open_store(url)
    sync_store.ensure_ready()
    return AsyncObjectStore(sync_store, trio.CapacityLimiter(4))


def test_discover_walks_folders_and_keys_paths_relative_to_the_argument(tmp_path: Path) -> None:
    docs = _tree(tmp_path)
    single = tmp_path / "single.txt"
    single.write_text("x")
    found = discover([docs, single])
    assert [f.document_key for f in found] == ["a.txt", "sub/b.md", "single.txt"]
    with pytest.raises(FileNotFoundError):
        discover([tmp_path / "nope"])


async def test_ingest_creates_document_version_and_pending_job(
    db: Database, store: AsyncObjectStore, tmp_path: Path
) -> None:
    docs = _tree(tmp_path)
    model = await db.run(ensure_model, "m", 4)
    with trio.fail_after(30):
        results = await ingest_paths([docs], db=db, store=store, model_id=model.id, max_attempts=3)
    assert [(r.document_key, r.status, r.version_no) for r in results] == [
        ("a.txt", "created", 1),
        ("sub/b.md", "created", 1),
    ]
    with db.connection() as conn:
        rows = conn.execute(
            """SELECT d.external_key, v.status AS vs, v.byte_size, v.sha256, v.storage_key,
                      j.status AS js, j.embedding_model_id, j.max_attempts
               FROM documents d JOIN document_versions v ON v.document_id = d.id
               JOIN embedding_jobs j ON j.document_version_id = v.id ORDER BY 1"""
        ).fetchall()
    assert [(r["external_key"], r["vs"], r["js"]) for r in rows] == [
        ("a.txt", "UPLOADED", "PENDING"),
        ("sub/b.md", "UPLOADED", "PENDING"),
    ]
    for row in rows:
        assert row["embedding_model_id"] == model.id and row["max_attempts"] == 3
        assert row["storage_key"] == storage_key_for(row["sha256"])
        info = await store.stat(row["storage_key"])
        assert (info.size, info.sha256) == (row["byte_size"], row["sha256"])


async def test_ingesting_again_creates_nothing_and_a_change_creates_version_two(
    db: Database, store: AsyncObjectStore, tmp_path: Path
) -> None:
    docs = _tree(tmp_path)
    model = await db.run(ensure_model, "m", 4)
    with trio.fail_after(30):
        await ingest_paths([docs], db=db, store=store, model_id=model.id, max_attempts=3)
        again = await ingest_paths([docs], db=db, store=store, model_id=model.id, max_attempts=3)
        assert {r.status for r in again} == {"unchanged"}
        (docs / "a.txt").write_text("alpha document, edited", encoding="utf-8")
        third = await ingest_paths([docs], db=db, store=store, model_id=model.id, max_attempts=3)
    assert [(r.document_key, r.status, r.version_no) for r in third] == [
        ("a.txt", "created", 2),
        ("sub/b.md", "unchanged", 1),
    ]
    with db.connection() as conn:
        assert helpers.count(conn, "SELECT count(*) FROM document_versions") == 3
        assert helpers.count(conn, "SELECT count(*) FROM embedding_jobs") == 3


def test_concurrent_ingests_of_one_key_keep_version_numbers_dense(db: Database) -> None:
    with db.connection() as conn:
        model = helpers.model(conn)
    barrier = threading.Barrier(4)

    def ingest(i: int) -> int:
        with db.connection() as conn:
            barrier.wait()
            return helpers.enqueue(conn, model.id, "same-key", content=f"v{i}".encode()).version_no

    with ThreadPoolExecutor(4) as pool:
        numbers = sorted(pool.map(ingest, range(4)))
    assert numbers == [1, 2, 3, 4]


def test_enqueue_notifies_listening_workers(db: Database, database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute("LISTEN trioindex_jobs")
        with db.connection() as conn:
            model = helpers.model(conn)
            helpers.enqueue(conn, model.id)
        notes = list(listener.notifies(timeout=5, stop_after=1))
    assert [n.channel for n in notes] == ["trioindex_jobs"]


def test_a_model_registered_with_another_dimension_is_a_config_error(db: Database) -> None:
    with db.connection() as conn:
        ensure_model(conn, "BAAI/bge-m3", 1024)
        assert ensure_model(conn, "BAAI/bge-m3", 1024).dimension == 1024
        with pytest.raises(ConfigError, match="1024"):
            ensure_model(conn, "BAAI/bge-m3", 384)


def test_the_first_model_is_active_and_gets_an_hnsw_index(db: Database) -> None:
    with db.connection() as conn:
        first = ensure_model(conn, "first", 384)
        second = ensure_model(conn, "second", 1024)
        indexes = {
            r["indexname"]: r["indexdef"]
            for r in conn.execute(
                "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'embeddings'"
            )
        }
    assert first.is_active and not second.is_active
    assert "hnsw" in indexes[first.index_name] and "vector(384)" in indexes[first.index_name]
    assert "vector_cosine_ops" in indexes[second.index_name]


def test_unchanged_bytes_return_the_existing_version(db: Database) -> None:
    with db.connection() as conn:
        model = helpers.model(conn)
        first = helpers.enqueue(conn, model.id, "k", content=b"same")
        second = enqueue_version(
            conn,
            document_key="k",
            storage_key="x",
            original_name="k",
            content_type=None,
            byte_size=4,
            sha256=first_sha(b"same"),
            model_id=model.id,
            max_attempts=3,
        )
    assert second.status == "unchanged" and second.version_id == first.version_id
    assert second.job_id == first.job_id


def first_sha(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()
