"""Deleting documents (db/documents.py, migration 0006) on a real PostgreSQL: what goes, which
blobs are reported unreferenced, and a delete racing a worker's completion in both orders
(forced with row locks seen waiting in pg_stat_activity, not with sleeps)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from uuid import UUID

import pytest

from tests import helpers
from trioindex.db import jobs as lifecycle
from trioindex.db.documents import delete_documents, keys_under
from trioindex.db.pool import Connection, Database
from trioindex.errors import FailureType, JobRemoved
from trioindex.values import Claim


def _counts(conn: Connection) -> dict[str, int]:
    tables = ("documents", "document_versions", "document_chunks", "embeddings")
    tables += ("embedding_jobs", "embedding_job_attempts")
    return {
        t: conn.execute(f"SELECT count(*) AS n FROM {t}").fetchone()["n"]  # type: ignore[index]
        for t in tables
    }


@pytest.fixture
def worker(db: Database) -> UUID:
    with db.connection() as conn:
        return helpers.worker(conn)


def _claimed_and_embedded(db: Database, worker: UUID, key: str) -> Claim:
    with db.connection() as conn:
        model = helpers.model(conn)
        helpers.enqueue(conn, model.id, key)
        (claim,) = lifecycle.claim_jobs(conn, worker, 1, 300)
        helpers.stage_embedded(conn, claim)
    return claim


def test_delete_removes_the_document_with_its_versions_chunks_embeddings_and_jobs(
    db: Database, worker: UUID
) -> None:
    claim = _claimed_and_embedded(db, worker, "a.txt")
    with db.connection() as conn:
        lifecycle.complete_job(conn, claim)
        helpers.enqueue(conn, claim.embedding_model_id, "a.txt", content=b"second version")
        helpers.enqueue(conn, claim.embedding_model_id, "b.txt")
        result = delete_documents(conn, ["a.txt", "nope.txt"])
        assert result.deleted == ("a.txt",) and result.missing == ("nope.txt",)
        assert result.versions == 2
        assert _counts(conn) == {
            "documents": 1,
            "document_versions": 1,
            "document_chunks": 0,
            "embeddings": 0,
            "embedding_jobs": 1,
            "embedding_job_attempts": 0,
        }
        assert keys_under(conn, "") == ["b.txt"]


def test_a_blob_is_reported_unreferenced_only_when_no_remaining_version_names_it(
    db: Database,
) -> None:
    with db.connection() as conn:
        model = helpers.model(conn)
        same = b"the same bytes"
        first = helpers.enqueue(conn, model.id, "one.txt", content=same)
        helpers.enqueue(conn, model.id, "two.txt", content=same)
        blob = conn.execute(
            "SELECT storage_key FROM document_versions WHERE id = %s", (first.version_id,)
        ).fetchone()["storage_key"]  # type: ignore[index]
        assert delete_documents(conn, ["one.txt"]).unreferenced_blobs == ()
        assert delete_documents(conn, ["two.txt"]).unreferenced_blobs == (blob,)


def test_delete_by_prefix_takes_only_keys_that_start_with_it(db: Database) -> None:
    with db.connection() as conn:
        model = helpers.model(conn)
        for key in ("docs/a.txt", "docs/sub/b.txt", "docsx/c.txt", "other.txt"):
            helpers.enqueue(conn, model.id, key)
        assert delete_documents(conn, prefix="docs/").deleted == ("docs/a.txt", "docs/sub/b.txt")
        assert keys_under(conn, "") == ["docsx/c.txt", "other.txt"]
        with pytest.raises(ValueError, match="empty prefix"):
            delete_documents(conn, prefix="")


def test_ingesting_a_deleted_key_again_starts_a_new_history(db: Database) -> None:
    with db.connection() as conn:
        model = helpers.model(conn)
        old = helpers.enqueue(conn, model.id, "a.txt", content=b"v1")
        helpers.enqueue(conn, model.id, "a.txt", content=b"v2")
        delete_documents(conn, ["a.txt"])
        again = helpers.enqueue(conn, model.id, "a.txt", content=b"v2")
    assert again.status == "created" and again.version_no == 1
    assert again.document_id != old.document_id


# --- a delete racing a worker --------------------------------------------------------------


def _first_holds_second_waits(
    db: Database, first: Callable[[Connection], object], second: Callable[[Connection], object]
) -> tuple[object, object]:
    """``first`` in a transaction left open; ``second`` on another connection; commit ``first``
    only once PostgreSQL shows ``second`` waiting on a lock. Errors come back as values."""
    holding, release = threading.Event(), threading.Event()
    pids: list[int] = []

    def hold() -> object:
        with db.connection() as conn, conn.transaction():
            result = first(conn)
            holding.set()
            assert release.wait(30)
            return result

    def wait() -> object:
        assert holding.wait(30)
        with db.connection() as conn:
            pids.append(conn.info.backend_pid)
            try:
                return second(conn)
            except Exception as exc:
                return exc

    with ThreadPoolExecutor(2) as pool:
        held, waiting = pool.submit(hold), pool.submit(wait)
        with db.connection() as conn:
            while not (pids and helpers.waits_on_a_lock(conn, pids[0])):
                assert not waiting.done(), f"did not wait: {waiting.result()!r}"
        release.set()
        return held.result(), waiting.result()


def test_a_delete_waits_for_a_completion_in_progress_then_removes_what_it_wrote(
    db: Database, worker: UUID
) -> None:
    claim = _claimed_and_embedded(db, worker, "racing.txt")
    completed, deleted = _first_holds_second_waits(
        db,
        lambda conn: lifecycle.complete_job(conn, claim),
        lambda conn: delete_documents(conn, ["racing.txt"]),
    )
    assert not isinstance(completed, Exception), completed
    assert not isinstance(deleted, Exception) and deleted.deleted == ("racing.txt",)  # type: ignore[union-attr]
    with db.connection() as conn:
        assert set(_counts(conn).values()) == {0}


def test_a_completion_waiting_on_a_delete_finds_its_job_removed_and_writes_nothing(
    db: Database, worker: UUID
) -> None:
    claim = _claimed_and_embedded(db, worker, "racing.txt")
    deleted, completed = _first_holds_second_waits(
        db,
        lambda conn: delete_documents(conn, ["racing.txt"]),
        lambda conn: lifecycle.complete_job(conn, claim),
    )
    assert not isinstance(deleted, Exception), deleted
    assert isinstance(completed, JobRemoved), completed
    with db.connection() as conn:
        assert set(_counts(conn).values()) == {0}
        events = conn.execute(
            "SELECT event_type FROM indexing_events WHERE embedding_job_id = %s", (claim.job_id,)
        ).fetchall()
    assert "JOB_SUCCEEDED" not in {e["event_type"] for e in events}


WRITES: dict[str, Callable[[Connection, Claim], Any]] = {
    "renew": lambda conn, claim: helpers.renew_one(conn, claim, 300),
    "complete": lifecycle.complete_job,
    "release": lifecycle.release_job,
    "fail": lambda conn, claim: lifecycle.fail_job(
        conn, claim, FailureType.STORAGE_UNAVAILABLE, "blob gone", helpers.BACKOFF
    ),
}


@pytest.mark.parametrize("write", sorted(WRITES))
def test_every_fenced_write_after_a_delete_is_job_removed_not_a_lost_lease(
    db: Database, worker: UUID, write: str
) -> None:
    claim = _claimed_and_embedded(db, worker, "gone.txt")
    with db.connection() as conn:
        delete_documents(conn, ["gone.txt"])
        with pytest.raises(JobRemoved):
            WRITES[write](conn, claim)
        assert set(_counts(conn).values()) == {0}
