"""Ingest on real PostgreSQL with the folder store and the S3 server: rows, dedupe, NOTIFY."""

from __future__ import annotations

import hashlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, BinaryIO

import attrs
import psycopg
import pytest
import trio

from tests import helpers
from trioindex.db import jobs as lifecycle
from trioindex.db.models import ensure_model
from trioindex.db.pool import Database
from trioindex.errors import ConfigError, FailureType, ObjectNotFound
from trioindex.ingest import (
    IngestResult,
    NewVersion,
    SkippedFile,
    discover,
    enqueue_version,
    ingest_paths,
    storage_key_for,
)
from trioindex.storage import AsyncObjectStore, FolderStore, ObjectInfo, ObjectStore, open_store


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


@pytest.fixture
def folder_store(tmp_path: Path) -> AsyncObjectStore:
    sync_store = FolderStore(tmp_path / "blobs")
    sync_store.ensure_ready()
    return AsyncObjectStore(sync_store, trio.CapacityLimiter(4))


def test_discover_walks_folders_and_keys_paths_relative_to_the_argument(tmp_path: Path) -> None:
    docs = _tree(tmp_path)
    single = tmp_path / "single.txt"
    single.write_text("x")
    found = discover([docs, single])
    assert [f.document_key for f in found.files] == ["a.txt", "sub/b.md", "single.txt"]
    assert found.skipped == []
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
            """SELECT d.external_key, j.progress, v.byte_size, v.sha256, v.storage_key,
                      j.status AS js, j.embedding_model_id, j.max_attempts
               FROM documents d JOIN document_versions v ON v.document_id = d.id
               JOIN embedding_jobs j ON j.document_version_id = v.id ORDER BY 1"""
        ).fetchall()
    assert [(r["external_key"], r["progress"], r["js"]) for r in rows] == [
        ("a.txt", 0, "PENDING"),
        ("sub/b.md", 0, "PENDING"),
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


def test_the_first_model_is_active_and_gets_no_hnsw_index_yet(db: Database) -> None:
    """The index comes once the model has vectors enough (tests/db/test_vector_index.py)."""
    with db.connection() as conn:
        first = ensure_model(conn, "first", 384)
        second = ensure_model(conn, "second", 1024)
        indexes = {
            r["indexname"]
            for r in conn.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'embeddings'")
        }
    assert first.is_active and not second.is_active
    assert first.index_name not in indexes and second.index_name not in indexes


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


# --- ingest keeps going and stays inside what it was given ---------------------------------------


def _outcomes(entries: list[IngestResult | SkippedFile]) -> list[tuple[str, str]]:
    return [(e.document_key or e.path, e.status) for e in entries]


def _write_raw_name(folder: Path, raw_name: bytes, data: bytes) -> None:
    """Create a file whose name is raw bytes (not valid UTF-8), as another program would."""
    fd = os.open(os.fsencode(folder) + b"/" + raw_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


async def test_a_file_name_that_is_not_utf8_is_refused_and_the_rest_is_ingested(
    db: Database, folder_store: AsyncObjectStore, tmp_path: Path
) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("first")
    _write_raw_name(docs, b"bad\xff.txt", b"latin-1 named file")
    (docs / "z.txt").write_text("last")
    model = await db.run(ensure_model, "m", 4)
    with trio.fail_after(30):
        entries = await ingest_paths(
            [docs], db=db, store=folder_store, model_id=model.id, max_attempts=3
        )
    assert _outcomes(entries) == [
        ("a.txt", "created"),
        (f"{docs}/bad\\xff.txt", "error"),  # shown with the bad byte escaped
        ("z.txt", "created"),
    ]
    refused = entries[1]
    assert isinstance(refused, SkippedFile) and "not valid UTF-8" in refused.reason
    assert refused.as_json() == {
        "path": f"{docs}/bad\\xff.txt",
        "document_key": None,
        "status": "error",
        "reason": refused.reason,
    }
    with db.connection() as conn:
        keys = [r["external_key"] for r in conn.execute("SELECT external_key FROM documents")]
    assert sorted(keys) == ["a.txt", "z.txt"]


@attrs.define(eq=False)
class WriterDuringUpload:
    """A real store, and a writer that rewrites ``victim`` in place (same inode) just before
    each of the first ``times`` uploads start: a file edited between hashing and upload."""

    inner: ObjectStore
    victim: Path
    times: int
    rewrites: int = 0
    # ingest stores several files at once: two puts that read the same count would write the
    # same bytes, and a hash taken between them would then match the upload.
    _rewriting: threading.Lock = attrs.field(factory=threading.Lock, init=False)

    @property
    def description(self) -> str:
        return self.inner.description

    def put(
        self, key: str, data: bytes | BinaryIO, *, size: int, sha256: str, content_type: str | None
    ) -> ObjectInfo:
        with self._rewriting:
            if self.rewrites < self.times:
                with self.victim.open("r+b") as handle:
                    handle.write(f"rewrite {self.rewrites:04d}".encode())
                self.rewrites += 1
        return self.inner.put(key, data, size=size, sha256=sha256, content_type=content_type)

    def get(self, key: str, *, max_bytes: int) -> bytes:
        return self.inner.get(key, max_bytes=max_bytes)

    def stat(self, key: str) -> ObjectInfo:
        return self.inner.stat(key)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def ensure_ready(self) -> None:
        self.inner.ensure_ready()

    def deferred_sync(self) -> AbstractContextManager[None]:
        return self.inner.deferred_sync()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def test_a_file_changed_between_hashing_and_upload_is_read_again_from_the_start(
    db: Database, store: AsyncObjectStore, tmp_path: Path
) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    victim = docs / "changing.txt"
    original = b"the original content of a file that someone is editing"
    victim.write_bytes(original)
    writer = WriterDuringUpload(store.store, victim, times=1)
    racing = AsyncObjectStore(writer, store.limiter)
    model = await db.run(ensure_model, "m", 4)
    with trio.fail_after(30):
        entries = await ingest_paths([docs], db=db, store=racing, model_id=model.id, max_attempts=3)
    assert _outcomes(entries) == [("changing.txt", "created")]
    edited = victim.read_bytes()
    assert edited != original and writer.rewrites == 1
    with db.connection() as conn:
        (version,) = conn.execute("SELECT sha256, byte_size FROM document_versions").fetchall()
    # the version is the bytes of the second, complete read, and the store holds exactly them
    assert (version["sha256"], version["byte_size"]) == (_sha(edited), len(edited))
    info = await store.stat(storage_key_for(_sha(edited)))
    assert (info.sha256, info.size) == (_sha(edited), len(edited))
    with pytest.raises(ObjectNotFound):
        await store.stat(storage_key_for(_sha(original)))


async def test_a_file_that_keeps_changing_is_reported_never_stored_and_the_run_goes_on(
    db: Database, store: AsyncObjectStore, tmp_path: Path
) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("before")
    victim = docs / "changing.txt"
    victim.write_bytes(b"a log file that is written to all the time")
    (docs / "z.txt").write_text("after")
    writer = WriterDuringUpload(store.store, victim, times=1000)
    racing = AsyncObjectStore(writer, store.limiter)
    model = await db.run(ensure_model, "m", 4)
    with trio.fail_after(30):
        entries = await ingest_paths([docs], db=db, store=racing, model_id=model.id, max_attempts=3)
    assert _outcomes(entries) == [
        ("a.txt", "created"),
        ("changing.txt", "error"),
        ("z.txt", "created"),
    ]
    refused = entries[1]
    assert isinstance(refused, SkippedFile) and "changed while" in refused.reason
    with db.connection() as conn:
        versions = conn.execute(
            "SELECT d.external_key, v.sha256, v.storage_key FROM document_versions v"
            " JOIN documents d ON d.id = v.document_id ORDER BY 1"
        ).fetchall()
    assert [v["external_key"] for v in versions] == ["a.txt", "z.txt"]
    for version in versions:  # every stored blob has the hash its version records
        info = await store.stat(version["storage_key"])
        assert info.sha256 == version["sha256"]


def _symlinked_tree(tmp_path: Path) -> Path:
    """docs/ with links inside and outside it, a link to a folder outside, and a loop."""
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "a.txt").write_text("alpha")
    (docs / "sub" / "b.txt").write_text("beta")
    (tmp_path / "secret.txt").write_text("outside the folder")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "e.txt").write_text("a folder outside")
    (tmp_path / "elsewhere" / "back").symlink_to(docs)  # a loop through the outside folder
    (docs / "inside.txt").symlink_to("sub/b.txt")
    (docs / "outside.txt").symlink_to(tmp_path / "secret.txt")
    (docs / "outdir").symlink_to(tmp_path / "elsewhere")
    (docs / "sub" / "up").symlink_to("..")  # a loop inside the folder
    return docs


async def test_symlinks_are_followed_only_when_their_target_is_inside_the_folder(
    db: Database, folder_store: AsyncObjectStore, tmp_path: Path
) -> None:
    docs = _symlinked_tree(tmp_path)
    model = await db.run(ensure_model, "m", 4)
    with trio.fail_after(30):
        entries = await ingest_paths(
            [docs], db=db, store=folder_store, model_id=model.id, max_attempts=3
        )
    assert _outcomes(entries) == [
        ("a.txt", "created"),
        ("inside.txt", "created"),
        ("outdir", "skipped"),
        ("outside.txt", "skipped"),
        ("sub/b.txt", "created"),
        ("sub/up", "skipped"),
    ]
    reasons = {e.document_key: e.reason for e in entries if isinstance(e, SkippedFile)}
    assert "outside" in reasons["outside.txt"] and "--follow-symlinks" in reasons["outside.txt"]
    assert "outside" in reasons["outdir"]
    assert "already" in reasons["sub/up"]
    with db.connection() as conn:
        stored = conn.execute("SELECT sha256 FROM document_versions").fetchall()
    assert _sha(b"outside the folder") not in {r["sha256"] for r in stored}


async def test_follow_symlinks_takes_links_outside_and_still_walks_each_folder_once(
    db: Database, folder_store: AsyncObjectStore, tmp_path: Path
) -> None:
    docs = _symlinked_tree(tmp_path)
    model = await db.run(ensure_model, "m", 4)
    with trio.fail_after(30):
        entries = await ingest_paths(
            [docs],
            db=db,
            store=folder_store,
            model_id=model.id,
            max_attempts=3,
            follow_symlinks=True,
        )
    assert _outcomes(entries) == [
        ("a.txt", "created"),
        ("inside.txt", "created"),
        ("outdir/back", "skipped"),
        ("outdir/e.txt", "created"),
        ("outside.txt", "created"),
        ("sub/b.txt", "created"),
        ("sub/up", "skipped"),
    ]


def _lose_blob(request: pytest.FixtureRequest, store: ObjectStore, key: str) -> None:
    """Delete an object behind the index's back, as a lifecycle rule or an operator would."""
    if isinstance(store, FolderStore):
        store.root.joinpath(*key.split("/")).unlink()
    else:
        bucket = getattr(store, "bucket")  # noqa: B009  # S3Store; tests only
        request.getfixturevalue("s3_server").client().remove_object(bucket, key)


def _fail_on_missing_blob(db: Database, store: AsyncObjectStore, model_id: object) -> None:
    """Claim the job and fail it as the worker does when its blob cannot be read."""
    with db.connection() as conn:
        worker = helpers.worker(conn)
        (claim,) = lifecycle.claim_jobs(conn, worker, 1, 300, model_id=model_id)  # type: ignore[arg-type]
        version = conn.execute(
            "SELECT storage_key FROM document_versions WHERE id = %s",
            (claim.document_version_id,),
        ).fetchone()
        assert version is not None
        with pytest.raises(ObjectNotFound) as lost:
            store.store.get(version["storage_key"], max_bytes=1 << 20)
        lifecycle.fail_job(
            conn, claim, FailureType.STORAGE_UNAVAILABLE, str(lost.value), helpers.BACKOFF
        )


async def test_reingesting_restores_a_lost_blob_and_requeues_its_failed_job(
    db: Database,
    store: AsyncObjectStore,
    tmp_path: Path,
    database_url: str,
    request: pytest.FixtureRequest,
) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    data = b"a document whose stored copy is lost"
    (docs / "doc.txt").write_bytes(data)
    key = storage_key_for(_sha(data))
    model = await db.run(ensure_model, "m", 4)
    with trio.fail_after(30):
        (first,) = await ingest_paths([docs], db=db, store=store, model_id=model.id, max_attempts=1)
    assert isinstance(first, IngestResult) and first.job_id is not None

    def snapshot() -> tuple[object, ...]:
        with db.connection() as conn:
            job = helpers.job_row(conn, first.job_id)  # type: ignore[arg-type]
            events = helpers.count(conn, "SELECT count(*) FROM indexing_events")
        return job["status"], job["updated_at"], job["max_attempts"], events

    # blob intact: a re-ingest is "unchanged" and writes nothing
    before = snapshot()
    with trio.fail_after(30):
        (again,) = await ingest_paths([docs], db=db, store=store, model_id=model.id, max_attempts=3)
    assert again.status == "unchanged" and snapshot() == before

    # the blob is lost; the worker's attempt fails STORAGE_UNAVAILABLE and, being the last, the job
    # ends FAILED
    _lose_blob(request, store.store, key)
    _fail_on_missing_blob(db, store, model.id)
    with db.connection() as conn:
        assert helpers.job_row(conn, first.job_id)["status"] == "FAILED"  # type: ignore[arg-type]

    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute("LISTEN trioindex_jobs")
        with trio.fail_after(30):
            (repaired,) = await ingest_paths(
                [docs], db=db, store=store, model_id=model.id, max_attempts=3
            )
        notes = list(listener.notifies(timeout=5, stop_after=1))
    assert isinstance(repaired, IngestResult)
    assert repaired.status == "repaired" and repaired.requeued
    assert repaired.as_json()["status"] == "repaired"
    assert (repaired.version_id, repaired.job_id) == (first.version_id, first.job_id)
    assert [n.channel for n in notes] == ["trioindex_jobs"]
    info = await store.stat(key)
    assert (info.sha256, info.size) == (_sha(data), len(data))
    with db.connection() as conn:
        job = helpers.job_row(conn, first.job_id)  # type: ignore[arg-type]
        assert helpers.events(conn, first.job_id)[-1] == "JOB_RETRY_REQUESTED"  # type: ignore[arg-type]
        # a fresh budget of max-attempts, and a worker can take it now
        assert (job["status"], job["attempt_count"], job["max_attempts"]) == ("PENDING", 1, 4)
        (claim,) = lifecycle.claim_jobs(conn, helpers.worker(conn), 1, 300, model_id=model.id)
    assert claim.job_id == first.job_id
    assert await store.get(key, max_bytes=1 << 20) == data


async def test_every_blob_of_a_run_is_on_disk_before_its_version_is_enqueued(
    db: Database, folder_store: AsyncObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run defers the folder store's fsyncs to the end of each slice of files: still, no
    version is enqueued before its blob and the blob's folder have been fsynced."""
    from trioindex.ingest import files as ingest_files

    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(40):
        (docs / f"doc-{i:02d}.txt").write_text(f"document number {i}")
    synced: set[tuple[int, bool]] = set()
    real_fsync = os.fsync

    def logged_fsync(fd: int) -> None:
        real_fsync(fd)
        synced.add((os.fstat(fd).st_ino, os.path.isdir(f"/proc/self/fd/{fd}")))

    unsynced_at_enqueue: list[str] = []
    real_enqueue = ingest_files.enqueue_versions

    def checked_enqueue(
        conn: psycopg.Connection[Any], versions: list[NewVersion], **kwargs: Any
    ) -> Any:
        assert isinstance(folder_store.store, FolderStore)
        for version in versions:
            blob = folder_store.store.root / version.storage_key
            if (blob.stat().st_ino, False) not in synced or (
                blob.parent.stat().st_ino,
                True,
            ) not in synced:
                unsynced_at_enqueue.append(version.document_key)
        return real_enqueue(conn, versions, **kwargs)

    monkeypatch.setattr(os, "fsync", logged_fsync)
    monkeypatch.setattr(ingest_files, "enqueue_versions", checked_enqueue)
    model = await db.run(ensure_model, "m", 4)
    with trio.fail_after(30):
        entries = await ingest_paths(
            [docs], db=db, store=folder_store, model_id=model.id, max_attempts=3
        )
    assert [e.status for e in entries] == ["created"] * 40
    assert unsynced_at_enqueue == []
    # and the fsyncs were deferred, not skipped: each blob once, each folder once
    folders = {_sha(f.read_bytes())[:2] for f in docs.iterdir()}
    assert len(synced) == 40 + len(folders)
