"""The parse + chunk step on real PostgreSQL with a real folder store.

The step reads through :class:`AsyncObjectStore`, whichever store is behind it; reads from a
real S3 server are tested in tests/storage/test_storage.py and, through this step, end to end in
tests/test_cli.py (whose worker stores its documents on S3).
"""

from __future__ import annotations

import functools
import hashlib
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from uuid import UUID

import attrs
import psutil
import pytest
import trio

from testkit.documents import docx_bytes
from tests import helpers
from tests import hostile_documents as hostile
from trioindex.config import default_settings
from trioindex.db import jobs as lifecycle
from trioindex.db.pool import Database
from trioindex.errors import ContentInvalid, ObjectNotFound, OwnershipLost, StorageUnavailable
from trioindex.ingest import storage_key_for
from trioindex.pipeline.chunking import Chunker, ChunkingPolicy
from trioindex.pipeline.parse_step import (
    commit_chunks,
    parse_and_chunk_bytes,
    prepare_parse,
    run_parse_step,
)
from trioindex.storage import AsyncObjectStore, FolderStore
from trioindex.values import BackoffPolicy, Claim, CompleteResult
from trioindex.worker.queue import JobQueue
from trioindex.worker.runtime import Worker

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


async def test_parse_step_stores_contiguous_chunks_and_starts_embedding(
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
        # one job's commit is the group function's: chunks stored and embedding begun at once
        assert version == {"status": "EMBEDDING", "chunk_count": count}
        assert helpers.events(conn, claim.job_id)[-3:] == [
            "PARSING_STARTED",
            "CHUNKS_STORED",
            "EMBEDDING_STARTED",
        ]
        assert helpers.job_row(conn, claim.job_id)["progress"] == 50


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


# -- almost-right text is indexed, and the repair recorded (issue 11 §5) ------------------------


def _chunks_stored_detail(db: Database, claim: Claim) -> dict[str, Any]:
    with db.connection() as conn:
        row = conn.execute(
            """SELECT detail FROM indexing_events
               WHERE embedding_job_id = %s AND event_type = 'CHUNKS_STORED'""",
            (claim.job_id,),
        ).fetchone()
    assert row is not None
    return dict(row["detail"])


async def test_truncated_korean_text_is_indexed_with_the_replacement_recorded(
    db: Database, store: AsyncObjectStore
) -> None:
    text = ("대한민국의 수도는 서울입니다. 한글은 세종대왕이 만들었습니다. " * 200).strip() + " 끝"
    data = text.encode("utf-8")[:-1]  # cut inside the last character
    claim = _claim(db, store, data, "korean.txt")
    with trio.fail_after(30):
        count = await run_parse_step(
            claim, db=db, store=store, chunker=CHUNKER, max_bytes=MAX_BYTES
        )
    chunks = _chunks(db, claim)
    assert count == len(chunks) > 1
    assert chunks[-1]["content"].endswith("\ufffd")
    detail = _chunks_stored_detail(db, claim)
    assert detail["replaced_sequences"] == 1
    assert set(detail) == {"chunks", "characters", "chunking", "replaced_sequences"}  # no text
    clean = _claim(db, store, TEXT, "clean.txt")
    with trio.fail_after(30):
        await run_parse_step(clean, db=db, store=store, chunker=CHUNKER, max_bytes=MAX_BYTES)
    assert "replaced_sequences" not in _chunks_stored_detail(db, clean)


# -- parsing runs in a process that is killed on timeout or cancellation (issue 11 §4) ----------


@functools.cache
def slow_pdf() -> bytes:
    """Inside every content limit, yet about a second of pypdf work per page (10 pages): only
    the time limit (or cancellation) stops it."""
    return hostile.slow_pdf(pages=10)


def parse_processes() -> set[int]:
    """PIDs of this test process's trio-parallel worker processes (idle or busy)."""
    found = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if any("spawn_main" in part for part in child.cmdline()):
                found.add(child.pid)
        except psutil.Error:
            continue
    return found


async def test_a_parse_over_the_time_limit_is_killed_and_fails_naming_the_limit(
    db: Database, store: AsyncObjectStore
) -> None:
    claim = _claim(db, store, slow_pdf(), "slow.pdf")
    before = parse_processes()
    started = time.perf_counter()
    with (
        trio.fail_after(30),
        pytest.raises(
            ContentInvalid,
            match=r"^parsing took longer than indexing\.parsing\.timeout \(1\.5 s\)$",
        ),
    ):
        await run_parse_step(
            claim, db=db, store=store, chunker=CHUNKER, max_bytes=MAX_BYTES * 4, parse_timeout=1.5
        )
    elapsed = time.perf_counter() - started
    # ~10 s of work stopped at the limit (plus a process start-up); the process that ran it is
    # gone: every parse process alive now was there, idle, before.
    assert elapsed < 1.5 + 3.0
    assert parse_processes() <= before
    assert _chunks(db, claim) == []


async def test_a_cancelled_parse_stops_its_process_at_once(
    db: Database, store: AsyncObjectStore
) -> None:
    claim = _claim(db, store, slow_pdf(), "slow.pdf")
    before = parse_processes()
    started = time.perf_counter()
    with trio.move_on_after(1.5) as scope:  # as a shutdown or a lost lease cancels a job
        await run_parse_step(claim, db=db, store=store, chunker=CHUNKER, max_bytes=MAX_BYTES * 4)
    elapsed = time.perf_counter() - started
    assert scope.cancelled_caught
    assert elapsed < 1.5 + 1.5, "the parse was killed, not waited for"
    assert parse_processes() <= before
    with db.connection() as conn:
        version = conn.execute(
            "SELECT status FROM document_versions WHERE id = %s", (claim.document_version_id,)
        ).fetchone()
    assert version == {"status": "PARSING"} and _chunks(db, claim) == []


@attrs.define(eq=False)
class ParseThenStage:
    """The real parse step; embedding stands in (stores a full embedding set, fenced)."""

    db: Database
    store: AsyncObjectStore
    parse_timeout: float
    cpu_limiter: trio.CapacityLimiter = attrs.field(factory=lambda: trio.CapacityLimiter(2))

    async def parse(self, claim: Claim) -> int:
        return await run_parse_step(
            claim,
            db=self.db,
            store=self.store,
            chunker=CHUNKER,
            max_bytes=MAX_BYTES * 4,
            parse_timeout=self.parse_timeout,
            cpu_limiter=self.cpu_limiter,
        )

    async def embed(self, claim: Claim) -> int:
        def stage(conn: Any, claim: Claim) -> int:
            with conn.transaction():
                lifecycle.lock_owned_job(conn, claim)
                stored = conn.execute(
                    """INSERT INTO embeddings (chunk_id, document_id, document_version_id,
                           embedding_model_id, vector, dimension, vector_sha256)
                       SELECT id, document_id, document_version_id, %s, '[0.5,0.5,0.5,0.5]',
                           4, repeat('c', 64)
                       FROM document_chunks WHERE document_version_id = %s""",
                    (claim.embedding_model_id, claim.document_version_id),
                ).rowcount
                conn.execute(
                    "UPDATE document_versions SET status = 'EMBEDDING' WHERE id = %s",
                    (claim.document_version_id,),
                )
            return int(stored)

        return await self.db.run(stage, claim)

    async def complete(self, claim: Claim) -> CompleteResult:
        return await self.db.run(lifecycle.complete_job, claim)

    def forget(self, claim: Claim) -> None:
        pass

    async def serve(self) -> None:
        await trio.sleep_forever()


def _enqueue_stored(db: Database, store: AsyncObjectStore, data: bytes, priority: int) -> UUID:
    sha = hashlib.sha256(data).hexdigest()
    store.store.put(storage_key_for(sha), data, size=len(data), sha256=sha, content_type=None)
    with db.connection() as conn:
        model = helpers.model(conn)
        result = helpers.enqueue(conn, model.id, content=data, priority=priority, max_attempts=1)
    return result.job_id


async def test_the_worker_indexes_a_normal_document_while_a_hostile_one_parses(
    db: Database, store: AsyncObjectStore
) -> None:
    hostile_job = _enqueue_stored(db, store, slow_pdf(), priority=1)  # claimed first
    normal_job = _enqueue_stored(db, store, TEXT, priority=0)
    finished: list[tuple[UUID, str]] = []
    worker = Worker(
        queue=JobQueue(db, lease_seconds=30, backoff=BackoffPolicy(0.05, 0.2, 0.0)),
        steps=ParseThenStage(db, store, parse_timeout=6.0),
        settings=attrs.evolve(default_settings().worker, max_concurrency=2, polling_interval=0.05),
        on_job_done=lambda claim, outcome: finished.append((claim.job_id, str(outcome))),
    )
    with trio.fail_after(60):
        await worker.serve(drain=True)
    assert [job for job, _ in finished] == [normal_job, hostile_job]
    assert finished[0][1] == "succeeded"
    with db.connection() as conn:
        hostile_row = helpers.job_row(conn, hostile_job)
    assert (hostile_row["status"], hostile_row["last_failure_type"]) == (
        "FAILED",
        "DOCUMENT_CONTENT_INVALID",
    )
    assert hostile_row["last_failure_message"] == (
        "parsing took longer than indexing.parsing.timeout (6 s)"
    )


WORKER_LOGS = """
import logging, sys
import trio, trio_parallel
from trioindex.logs import configure_logging
from trioindex.pipeline import parse_process

def noisy() -> int:
    print("stray stderr noise", file=sys.stderr)
    logging.getLogger("trioindex.pipeline.formats").warning("a warning from a parser")
    logging.getLogger("pypdf._reader").warning("a repair pypdf made")  # DEBUG for the worker
    return 1

async def main() -> None:
    parse_process._configure_workers()  # what the first parse does
    assert await trio_parallel.run_sync(noisy) == 1

if __name__ == "__main__":
    configure_logging("text", logging.INFO)
    trio.run(main)
"""


def test_parse_processes_log_like_the_worker_and_write_nothing_else(tmp_path: Path) -> None:
    # A worker killed (-9) while handing a document over left its parse process printing an
    # "end of file during message" traceback into the worker's log (the chaos run saw it).
    script = tmp_path / "worker.py"
    script.write_text(WORKER_LOGS)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=True
    )
    lines = done.stderr.splitlines()
    assert any(
        line.endswith("WARNING trioindex.pipeline.formats: a warning from a parser")
        for line in lines
    ), done.stderr
    assert "a repair pypdf made" not in done.stderr
    assert "stray stderr noise" not in done.stderr
