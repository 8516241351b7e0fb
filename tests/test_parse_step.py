"""The parse + chunk step on real PostgreSQL with a real folder store and S3 server."""

from __future__ import annotations

import hashlib
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from tests import helpers
from tests.documents import docx_bytes
from trioindex import lifecycle
from trioindex.chunking import Chunker, ChunkingPolicy
from trioindex.database import Database
from trioindex.errors import ContentInvalid, ObjectNotFound, OwnershipLost, StorageUnavailable
from trioindex.ingest import storage_key_for
from trioindex.steps.parse_chunk import (
    commit_chunks,
    parse_and_chunk_bytes,
    prepare_parse,
    run_parse_step,
)
from trioindex.storage import AsyncObjectStore, FolderStore
from trioindex.values import Claim

CHUNKER = Chunker(ChunkingPolicy(max_size=200, overlap=20))
MAX_BYTES = 1_000_000
TEXT = "\n\n".join(
    f"Paragraph {i}. Workers claim jobs with SKIP LOCKED. 문장 {i}이 끝났습니다." for i in range(30)
).encode()


class CountingStore(FolderStore):
    """A real folder store that counts reads (the step under test must skip them on replay)."""

    reads: int = 0

    def get(self, key: str, *, max_bytes: int) -> bytes:
        type(self).reads += 1
        return super().get(key, max_bytes=max_bytes)


@pytest.fixture
def store(tmp_path: Path) -> AsyncObjectStore:
    CountingStore.reads = 0
    folder = CountingStore(tmp_path / "blobs")
    folder.ensure_ready()
    return AsyncObjectStore(folder, trio.CapacityLimiter(4))


def _claim(db: Database, store: AsyncObjectStore, data: bytes, name: str = "doc.txt") -> Claim:
    sha = hashlib.sha256(data).hexdigest()
    store.store.put(storage_key_for(sha), data, size=len(data), sha256=sha, content_type=None)
    with db.connection() as conn:
        model = helpers.model(conn)
        result = helpers.enqueue(conn, model.id, name, content=data)
        conn.execute(
            "UPDATE document_versions SET original_name = %s WHERE id = %s",
            (name, result.version_id),
        )
        worker = helpers.worker(conn)
        (claim,) = lifecycle.claim_jobs(conn, worker, 1, 300)
    return claim


def _chunks(db: Database, claim: Claim) -> list[dict[str, Any]]:
    with db.connection() as conn:
        return conn.execute(
            """SELECT chunk_index, content, char_start, char_end, token_count, content_sha256
               FROM document_chunks WHERE document_version_id = %s ORDER BY chunk_index""",
            (claim.document_version_id,),
        ).fetchall()


async def test_parse_step_stores_contiguous_chunks_and_moves_to_chunked(
    db: Database, store: AsyncObjectStore
) -> None:
    claim = _claim(db, store, TEXT)
    with trio.fail_after(30):
        count = await run_parse_step(
            claim, db=db, store=store, chunker=CHUNKER, max_bytes=MAX_BYTES
        )
    chunks = _chunks(db, claim)
    assert count == len(chunks) > 1
    assert [c["chunk_index"] for c in chunks] == list(range(count))
    source = TEXT.decode()
    for chunk in chunks:
        assert source[chunk["char_start"] : chunk["char_end"]] == chunk["content"]
        assert chunk["content_sha256"] == hashlib.sha256(chunk["content"].encode()).hexdigest()
    with db.connection() as conn:
        version = conn.execute(
            "SELECT status, chunk_count FROM document_versions WHERE id = %s",
            (claim.document_version_id,),
        ).fetchone()
        assert version == {"status": "CHUNKED", "chunk_count": count}
        assert helpers.events(conn, claim.job_id)[-2:] == ["PARSING_STARTED", "CHUNKS_STORED"]
        assert helpers.job_row(conn, claim.job_id)["progress"] == 40


async def test_a_replay_after_chunked_does_no_storage_read(
    db: Database, store: AsyncObjectStore
) -> None:
    claim = _claim(db, store, TEXT)
    with trio.fail_after(30):
        first = await run_parse_step(
            claim, db=db, store=store, chunker=CHUNKER, max_bytes=MAX_BYTES
        )
        reads = CountingStore.reads
        with db.connection() as conn:
            events = helpers.events(conn, claim.job_id)
        second = await run_parse_step(
            claim, db=db, store=store, chunker=CHUNKER, max_bytes=MAX_BYTES
        )
    assert second == first and CountingStore.reads == reads == 1
    with db.connection() as conn:
        assert helpers.events(conn, claim.job_id) == events


async def test_a_crash_between_prepare_and_commit_resumes_from_parsing(
    db: Database, store: AsyncObjectStore
) -> None:
    claim = _claim(db, store, TEXT)
    with db.connection() as conn:
        prepare_parse(conn, claim)  # then the worker died before committing
        helpers.expire_lease(conn, claim.job_id)
        lifecycle.recover_expired(conn, helpers.BACKOFF)
        helpers.make_available(conn, claim.job_id)
        (again,) = lifecycle.claim_jobs(conn, claim.worker_id, 1, 300)
    assert again.version_status == "PARSING"
    with trio.fail_after(30):
        count = await run_parse_step(
            again, db=db, store=store, chunker=CHUNKER, max_bytes=MAX_BYTES
        )
    assert len(_chunks(db, again)) == count


def test_a_stale_token_commit_is_refused_and_leaves_nothing(
    db: Database, store: AsyncObjectStore
) -> None:
    claim = _claim(db, store, TEXT)
    with db.connection() as conn:
        snapshot = prepare_parse(conn, claim)
    chunks = parse_and_chunk_bytes(TEXT, snapshot, CHUNKER, MAX_BYTES)
    stale = attrs.evolve(claim, claim_token=uuid.uuid4())
    with db.connection() as conn, pytest.raises(OwnershipLost):
        commit_chunks(conn, stale, snapshot, chunks)
    assert _chunks(db, claim) == []
    with db.connection() as conn:
        helpers.expire_lease(conn, claim.job_id)
        with pytest.raises(OwnershipLost):
            commit_chunks(conn, claim, snapshot, chunks)
    assert _chunks(db, claim) == []


def test_two_concurrent_commits_for_one_claim_converge_on_one_chunk_set(
    db: Database, store: AsyncObjectStore
) -> None:
    claim = _claim(db, store, TEXT)
    with db.connection() as conn:
        snapshot = prepare_parse(conn, claim)
    chunks = parse_and_chunk_bytes(TEXT, snapshot, CHUNKER, MAX_BYTES)
    barrier = threading.Barrier(2)

    def commit(_: int) -> int:
        with db.connection() as conn:
            barrier.wait()
            return commit_chunks(conn, claim, snapshot, chunks)

    with ThreadPoolExecutor(2) as pool:
        assert list(pool.map(commit, range(2))) == [len(chunks)] * 2
    stored = _chunks(db, claim)
    assert [c["content"] for c in stored] == [c.text for c in chunks]
    with db.connection() as conn:
        assert helpers.events(conn, claim.job_id).count("CHUNKS_STORED") == 1


@pytest.mark.parametrize(
    ("data", "name", "error", "message"),
    [
        (b"   \n\t  ", "blank.txt", ContentInvalid, "empty"),
        (b"\x00\x01\x02\xff" * 64, "blob.bin", ContentInvalid, "unsupported"),
        (b"%PDF-1.7 broken", "broken.pdf", ContentInvalid, "PDF"),
        (docx_bytes("t", ["x"])[:200], "cut.docx", ContentInvalid, "corrupt DOCX"),
    ],
)
async def test_bad_content_is_document_content_invalid_and_stores_nothing(
    db: Database,
    store: AsyncObjectStore,
    data: bytes,
    name: str,
    error: type[Exception],
    message: str,
) -> None:
    claim = _claim(db, store, data, name)
    with trio.fail_after(30), pytest.raises(error, match=message):
        await run_parse_step(claim, db=db, store=store, chunker=CHUNKER, max_bytes=MAX_BYTES)
    assert _chunks(db, claim) == []


async def test_a_file_over_the_maximum_size_is_refused_before_reading(
    db: Database, store: AsyncObjectStore
) -> None:
    claim = _claim(db, store, TEXT)
    with trio.fail_after(30), pytest.raises(ContentInvalid, match="maximum size"):
        await run_parse_step(claim, db=db, store=store, chunker=CHUNKER, max_bytes=100)
    assert CountingStore.reads == 0


async def test_a_checksum_mismatch_is_not_accepted(
    db: Database, store: AsyncObjectStore, tmp_path: Path
) -> None:
    claim = _claim(db, store, TEXT)
    with db.connection() as conn:
        conn.execute(
            "UPDATE document_versions SET sha256 = %s WHERE id = %s",
            ("0" * 64, claim.document_version_id),
        )
        conn.execute(
            "UPDATE document_versions SET storage_key = %s WHERE id = %s",
            (storage_key_for(hashlib.sha256(TEXT).hexdigest()), claim.document_version_id),
        )
    with trio.fail_after(30), pytest.raises(StorageUnavailable, match="sha256"):
        await run_parse_step(claim, db=db, store=store, chunker=CHUNKER, max_bytes=MAX_BYTES)
    assert _chunks(db, claim) == []


async def test_a_missing_object_is_storage_unavailable(
    db: Database, store: AsyncObjectStore
) -> None:
    claim = _claim(db, store, TEXT)
    with db.connection() as conn:
        conn.execute(
            "UPDATE document_versions SET storage_key = 'sha256/00/missing' WHERE id = %s",
            (claim.document_version_id,),
        )
    with trio.fail_after(30), pytest.raises(ObjectNotFound):
        await run_parse_step(claim, db=db, store=store, chunker=CHUNKER, max_bytes=MAX_BYTES)
