"""Ingest in groups on real PostgreSQL and a real folder store: many files per transaction,
uploads at once, each file's outcome as if alone, and no deadlock between overlapping runs."""

from __future__ import annotations

import functools
import hashlib
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from pathlib import Path
from typing import BinaryIO

import attrs
import psycopg
import pytest
import trio

from testkit.processes import wait_for
from tests import helpers
from trioindex.db.models import ensure_model
from trioindex.db.pool import Database
from trioindex.errors import StorageUnavailable
from trioindex.ingest import (
    FILES_PER_TRANSACTION,
    IngestResult,
    NewVersion,
    enqueue_versions,
    ingest_paths,
)
from trioindex.ingest.files import PreparedFile, enqueue_files
from trioindex.storage import AsyncObjectStore, FolderStore, ObjectInfo, ObjectStore


def _folder(root: Path, count: int) -> Path:
    docs = root / "docs"
    docs.mkdir()
    for i in range(count):
        (docs / f"f{i:04d}.txt").write_text(f"file number {i}")
    return docs


def _store(root: Path, wrap: type[_Wrapped] | None = None) -> AsyncObjectStore:
    inner = FolderStore(root / "blobs")
    inner.ensure_ready()
    return AsyncObjectStore(inner if wrap is None else wrap(inner), trio.CapacityLimiter(4))


async def test_a_run_enqueues_a_group_of_files_per_transaction_each_with_its_own_outcome(
    db: Database, tmp_path: Path
) -> None:
    count = FILES_PER_TRANSACTION + 44
    docs = _folder(tmp_path, count)
    store = _store(tmp_path)
    model = await db.run(ensure_model, "m", 4)
    with trio.fail_after(60):
        first = await ingest_paths([docs], db=db, store=store, model_id=model.id, max_attempts=3)
    assert [(e.document_key, e.status) for e in first] == [
        (f"f{i:04d}.txt", "created") for i in range(count)
    ]
    with db.connection() as conn:
        # rows written by one transaction share its id (xmin): two groups, two transactions
        assert helpers.count(conn, "SELECT count(DISTINCT xmin::text) FROM embedding_jobs") == 2
        assert helpers.count(conn, "SELECT count(*) FROM embedding_jobs") == count
        enqueued = "SELECT count(*) FROM indexing_events WHERE event_type = 'JOB_ENQUEUED'"
        assert helpers.count(conn, enqueued) == count
        events = conn.execute(
            """SELECT e.detail, v.version_no, v.byte_size FROM indexing_events e
               JOIN embedding_jobs j ON j.id = e.embedding_job_id
               JOIN document_versions v ON v.id = e.document_version_id
                                       AND v.id = j.document_version_id"""
        ).fetchall()
        stored = conn.execute(
            """SELECT d.external_key, v.id, v.sha256 FROM documents d
               JOIN document_versions v ON v.document_id = d.id"""
        ).fetchall()
    # every file got its own bytes and its result names its own version
    assert {r["external_key"]: r["sha256"] for r in stored} == {
        f"f{i:04d}.txt": hashlib.sha256(f"file number {i}".encode()).hexdigest()
        for i in range(count)
    }
    assert {r["external_key"]: r["id"] for r in stored} == {
        e.document_key: getattr(e, "version_id", None) for e in first
    }
    assert len(events) == count
    for event in events:
        assert event["detail"] == {"version_no": 1, "byte_size": event["byte_size"]}

    (docs / "f0003.txt").write_text("edited")
    (docs / "new.txt").write_text("a new file")
    with trio.fail_after(60):
        second = await ingest_paths([docs], db=db, store=store, model_id=model.id, max_attempts=3)
    outcomes = {e.document_key: (e.status, getattr(e, "version_no", None)) for e in second}
    assert outcomes["f0003.txt"] == ("created", 2)
    assert outcomes["new.txt"] == ("created", 1)
    assert Counter(status for status, _ in outcomes.values()) == {
        "unchanged": count - 1,
        "created": 2,
    }


@attrs.define(eq=False)
class _Wrapped:
    """A real store whose ``put`` a test can intercept."""

    inner: ObjectStore

    @property
    def description(self) -> str:
        return self.inner.description

    def put(
        self, key: str, data: bytes | BinaryIO, *, size: int, sha256: str, content_type: str | None
    ) -> ObjectInfo:
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


@attrs.define(eq=False)
class _Rendezvous(_Wrapped):
    """The first three uploads each wait until all three have started: only a run that
    uploads several files at once gets past them (one at a time, the barrier breaks)."""

    barrier: threading.Barrier = attrs.Factory(lambda: threading.Barrier(3, timeout=10))
    started: int = 0
    lock: threading.Lock = attrs.Factory(threading.Lock)

    def put(
        self, key: str, data: bytes | BinaryIO, *, size: int, sha256: str, content_type: str | None
    ) -> ObjectInfo:
        with self.lock:
            self.started += 1
            first = self.started <= self.barrier.parties
        if first:
            try:
                self.barrier.wait()
            except threading.BrokenBarrierError:
                raise StorageUnavailable("uploads ran one at a time") from None
        return super().put(key, data, size=size, sha256=sha256, content_type=content_type)


async def test_files_of_a_run_are_uploaded_several_at_once(db: Database, tmp_path: Path) -> None:
    docs = _folder(tmp_path, 5)
    store = _store(tmp_path, _Rendezvous)
    model = await db.run(ensure_model, "m", 4)
    with trio.fail_after(60):
        entries = await ingest_paths([docs], db=db, store=store, model_id=model.id, max_attempts=3)
    assert [e.status for e in entries] == ["created"] * 5


class _Down(_Wrapped):
    """Every upload fails as an unreachable store does."""

    def put(
        self, key: str, data: bytes | BinaryIO, *, size: int, sha256: str, content_type: str | None
    ) -> ObjectInfo:
        raise StorageUnavailable("the store is down")


async def test_a_storage_outage_ends_the_run_with_its_own_error_and_enqueues_nothing(
    db: Database, tmp_path: Path
) -> None:
    docs = _folder(tmp_path, 20)
    model = await db.run(ensure_model, "m", 4)
    with trio.fail_after(60), pytest.raises(StorageUnavailable, match="down"):
        # the error itself, not an exception group: the CLI reports it in one line
        await ingest_paths(
            [docs], db=db, store=_store(tmp_path, _Down), model_id=model.id, max_attempts=3
        )
    with db.connection() as conn:
        assert helpers.count(conn, "SELECT count(*) FROM document_versions") == 0


def _versions(keys: list[str], content: str) -> list[NewVersion]:
    sha = hashlib.sha256(content.encode()).hexdigest()
    return [NewVersion(k, f"sha256/{sha[:2]}/{sha}", k, None, 1, sha, k) for k in keys]


def test_one_transaction_keeps_the_order_given_and_numbers_a_key_given_twice(
    db: Database,
) -> None:
    with db.connection() as conn:
        model = helpers.model(conn)
        versions = [*_versions(["b", "a"], "one"), *_versions(["b"], "two")]
        results = enqueue_versions(conn, versions, model_id=model.id, max_attempts=3)
        again = enqueue_versions(conn, _versions(["a"], "one"), model_id=model.id, max_attempts=3)
    assert [(r.document_key, r.status, r.version_no) for r in results] == [
        ("b", "created", 1),
        ("a", "created", 1),
        ("b", "created", 2),
    ]
    assert [(r.status, r.version_id) for r in again] == [("unchanged", results[1].version_id)]


def test_two_runs_over_the_same_keys_in_opposite_orders_do_not_deadlock(db: Database) -> None:
    with db.connection() as conn:
        model = helpers.model(conn)
    keys = [f"k{i:04d}" for i in range(2000)]
    barrier = threading.Barrier(2)

    def run(order: list[str], content: str) -> list[int]:
        with db.connection() as conn:
            barrier.wait()
            results = enqueue_versions(
                conn, _versions(order, content), model_id=model.id, max_attempts=3
            )
        return [r.version_no for r in results]

    with ThreadPoolExecutor(2) as pool:
        forward = pool.submit(run, keys, "forward")
        backward = pool.submit(run, keys[::-1], "backward")
        numbers = forward.result(timeout=60) + backward.result(timeout=60)
    assert sorted(Counter(numbers).items()) == [(1, 2000), (2, 2000)]


async def test_an_enqueue_chosen_as_a_deadlock_victim_runs_again(
    db: Database, database_url: str
) -> None:
    model = await db.run(ensure_model, "m", 4)
    await db.run(
        functools.partial(enqueue_versions, model_id=model.id, max_attempts=3),
        _versions(["a", "b"], "one"),
    )
    # another transaction (a delete, say) holds "b" and will want "a": the enqueue locks "a",
    # waits for "b", and PostgreSQL breaks the cycle by aborting the enqueue
    holder = await trio.to_thread.run_sync(psycopg.connect, database_url)
    results: list[IngestResult] = []

    async def enqueue() -> None:
        prepared = [PreparedFile(v) for v in _versions(["a", "b"], "two")]
        results.extend(await enqueue_files(prepared, db=db, model_id=model.id, max_attempts=3))

    def lock_waiters() -> int:
        with psycopg.connect(database_url) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE wait_event_type = 'Lock' AND datname = current_database()"
            ).fetchone()
        return int(row[0]) if row else 0

    try:
        # only the enqueue's backend looks for the deadlock in time, so it is the victim: which
        # of two waiting backends PostgreSQL aborts is whichever checks first (deadlock_timeout
        # after it began waiting), and on a loaded machine that was sometimes the holder's
        holder.execute("SET deadlock_timeout = '10min'")
        holder.execute("SELECT 1 FROM documents WHERE external_key = 'b' FOR UPDATE")
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(enqueue)
                await trio.to_thread.run_sync(
                    wait_for, lambda: lock_waiters() == 1, 30, "the enqueue to wait for 'b'"
                )
                await trio.to_thread.run_sync(
                    holder.execute, "SELECT 1 FROM documents WHERE external_key = 'a' FOR UPDATE"
                )
                await trio.to_thread.run_sync(holder.commit)
    finally:
        holder.close()
    assert [(r.document_key, r.status, r.version_no) for r in results] == [
        ("a", "created", 2),
        ("b", "created", 2),
    ]
