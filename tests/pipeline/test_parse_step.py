"""The parse + chunk step on real PostgreSQL with a real folder store, through the worker's own
steps (:class:`trioindex.worker.wiring.PipelineSteps`, run by ``helpers.run_claim``); the
SQL contract of its two writes (fencing, converging commits) through :mod:`trioindex.db.steps`.

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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from uuid import UUID

import attrs
import psutil
import pytest
import trio
from psycopg import sql

from testkit.documents import docx_bytes
from tests import helpers
from tests import hostile_documents as hostile
from trioindex.config import default_settings
from trioindex.db import jobs as lifecycle
from trioindex.db.pool import Database
from trioindex.db.steps import (
    ChunkCommit,
    EmbedSnapshot,
    store_chunks_many,
)
from trioindex.errors import ContentInvalid, ObjectNotFound, OwnershipLost, StorageUnavailable
from trioindex.ingest import storage_key_for
from trioindex.pipeline.chunk_values import ChunkDraft, ChunkingPolicy
from trioindex.pipeline.chunking import Chunker
from trioindex.pipeline.parse_process import ParseRequest, parse_document
from trioindex.storage import AsyncObjectStore, FolderStore
from trioindex.values import BackoffPolicy, Claim, CompleteResult, ParseSnapshot
from trioindex.worker.queue import JobQueue
from trioindex.worker.runtime import Worker
from trioindex.worker.wiring import WHOLE_DOCUMENT_BYTES, PipelineSteps

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


def _steps(
    db: Database,
    store: AsyncObjectStore,
    *,
    max_bytes: int = MAX_BYTES,
    parse_timeout: float | None = None,
    chunks_first: bool = False,
) -> PipelineSteps:
    """The worker's steps with the test chunker; the model's vectors come from a fake embedder
    of the test model's dimension (helpers.model: 4). ``chunks_first``: every document's
    chunks are stored after its parse, as a large document's are (else a small one is stored
    whole after its embed step)."""
    return helpers.pipeline_steps(
        db,
        store,
        helpers.FakeEmbedder(dimension=4),
        chunker=CHUNKER,
        max_document_bytes=max_bytes,
        parse_timeout=parse_timeout,
        whole_document_bytes=0 if chunks_first else WHOLE_DOCUMENT_BYTES,
    )


def _claim(
    db: Database,
    store: AsyncObjectStore,
    data: bytes,
    name: str = "doc.txt",
    version: dict[str, str] | None = None,
) -> Claim:
    """``data`` stored and enqueued as ``name``, and claimed; ``version``: columns of its
    version row changed before the claim (which reads them for the parse)."""
    sha = hashlib.sha256(data).hexdigest()
    store.store.put(storage_key_for(sha), data, size=len(data), sha256=sha, content_type=None)
    with db.connection() as conn:
        model = helpers.model(conn)
        result = helpers.enqueue(conn, model.id, name, content=data)
        conn.execute(
            "UPDATE document_versions SET original_name = %s WHERE id = %s",
            (name, result.version_id),
        )
        for column, value in (version or {}).items():
            conn.execute(
                sql.SQL("UPDATE document_versions SET {} = %s WHERE id = %s").format(
                    sql.Identifier(column)
                ),
                (value, result.version_id),
            )
        worker = helpers.worker(conn)
        (claim,) = lifecycle.claim_jobs(conn, worker, 1, 300)
    assert not claim.chunks_ready  # the claim parses first
    return claim


def _chunks(db: Database, claim: Claim) -> list[dict[str, Any]]:
    with db.connection() as conn:
        return conn.execute(
            """SELECT chunk_index, chunking, content, char_start, char_end, token_count,
                   content_sha256
               FROM document_chunks WHERE document_version_id = %s ORDER BY chunk_index""",
            (claim.document_version_id,),
        ).fetchall()


def _job(db: Database, claim: Claim) -> dict[str, Any]:
    with db.connection() as conn:
        return helpers.job_row(conn, claim.job_id)


def _snapshot(claim: Claim) -> ParseSnapshot:
    assert claim.parse is not None  # the claim of a job that parses carries its snapshot
    return claim.parse


def _parsed(snapshot: ParseSnapshot, data: bytes = TEXT) -> list[ChunkDraft]:
    """The chunks the step's parse makes of ``data`` (what the parse process runs)."""
    request = ParseRequest(
        data=data,
        sha256=snapshot.sha256,
        name=snapshot.original_name,
        content_type=snapshot.content_type,
        max_bytes=MAX_BYTES,
    )
    return parse_document(request, CHUNKER).chunks


async def test_the_parse_step_stores_contiguous_chunks_and_starts_embedding(
    db: Database, store: AsyncObjectStore
) -> None:
    claim = _claim(db, store, TEXT)
    with trio.fail_after(30):
        (count,) = await helpers.run_claim(_steps(db, store, chunks_first=True), claim, "parse")
    chunks = _chunks(db, claim)
    assert count == len(chunks) > 1
    assert [c["chunk_index"] for c in chunks] == list(range(count))
    assert {c["chunking"] for c in chunks} == {"characters"}  # the claim's chunk set
    source = TEXT.decode()
    for chunk in chunks:
        assert source[chunk["char_start"] : chunk["char_end"]] == chunk["content"]
        assert chunk["content_sha256"] == hashlib.sha256(chunk["content"].encode()).hexdigest()
    with db.connection() as conn:
        # one job's commit is the group function's: chunks stored and embedding begun at once,
        # recorded on the attempt (no event row per step)
        assert helpers.steps(conn, claim.job_id) == [
            "parse_started",
            "chunks_stored",
            "embedding_started",
        ]
        attempt = helpers.attempt_row(conn, claim.job_id)
        # the claim's time, carried to the commit (an earlier transaction than the commit's)
        assert attempt["parse_started_at"] < attempt["chunks_stored_at"]
        assert (attempt["chunks"], attempt["characters"]) == (count, len(source))
        assert attempt["replaced_sequences"] is None
        assert helpers.events(conn, claim.job_id) == ["JOB_ENQUEUED", "JOB_CLAIMED"]
        job = helpers.job_row(conn, claim.job_id)
        assert (job["status"], job["progress"], job["chunk_count"]) == ("PROCESSING", 50, None)
        assert not helpers.serves(conn, claim)  # served only once the job completes


async def test_a_small_document_is_stored_whole_after_its_embed_step(
    db: Database, store: AsyncObjectStore
) -> None:
    """Nothing of a small document is written before its vectors are ready: then its chunks,
    vectors and completion in one transaction (progress 0 → 100), every step on its attempt."""
    claim = _claim(db, store, TEXT)
    steps = _steps(db, store)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(steps.serve)
            parsed = await steps.parse(claim)
            assert steps.coalescer.expecting == 1  # its texts are coming: requests wait
            embedded = await steps.embed(claim)
            assert steps.coalescer.expecting == 0
            assert _chunks(db, claim) == []  # parsed and embedded, nothing stored
            assert _job(db, claim)["progress"] == 0
            groups = steps.store_documents.groups
            result = await steps.complete(claim)
            assert steps.store_documents.groups == groups + 1  # one call stored it all
            nursery.cancel_scope.cancel()
        steps.forget(claim)
    assert result == CompleteResult(became_current=True)
    assert parsed == embedded == len(_chunks(db, claim)) > 1
    with db.connection() as conn:
        job = helpers.job_row(conn, claim.job_id)
        assert (job["status"], job["progress"], job["chunk_count"]) == ("SUCCEEDED", 100, parsed)
        assert helpers.steps(conn, claim.job_id) == list(helpers.ATTEMPT_STEPS)
        attempt = helpers.attempt_row(conn, claim.job_id)
        assert (attempt["chunks"], attempt["embeddings"], attempt["embedding_slices"]) == (
            parsed,
            parsed,
            1,
        )
        assert attempt["characters"] == len(TEXT.decode())
        assert attempt["parse_started_at"] < attempt["chunks_stored_at"]
        assert helpers.serves(conn, claim)


@pytest.mark.parametrize("chunks_first", [False, True], ids=["whole", "chunks-first"])
async def test_the_embed_step_gets_the_claims_model_by_name(
    db: Database, store: AsyncObjectStore, chunks_first: bool
) -> None:
    """What the parse hands to the embed step names the claim's model as its row does, whether
    the document is stored whole later or its chunks were stored now."""
    claim = _claim(db, store, TEXT)
    steps = _steps(db, store, chunks_first=chunks_first)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(steps.serve)
            await steps.parse(claim)
            nursery.cancel_scope.cancel()
    snapshot = steps._embed_from[claim.job_id]  # what the embed step continues from
    steps.forget(claim)
    with db.connection() as conn:
        row = conn.execute(
            "SELECT name, dimension FROM embedding_models WHERE id = %s",
            (claim.embedding_model_id,),
        ).fetchone()
    assert row is not None
    assert (snapshot.model_id, snapshot.model_name, snapshot.dimension) == (
        claim.embedding_model_id,
        row["name"],
        row["dimension"],
    )


async def test_the_coalescer_expects_a_small_documents_texts_until_its_job_ends(
    db: Database, store: AsyncObjectStore
) -> None:
    """A parsed small document that ends without its embed step is no longer expected; one
    stored in chunks first (a large one, whose parse may take long) never is."""
    claim = _claim(db, store, TEXT)
    steps = _steps(db, store)
    await steps.parse(claim)
    assert steps.coalescer.expecting == 1
    steps.forget(claim)
    assert steps.coalescer.expecting == 0
    chunks_first = _steps(db, store, chunks_first=True)
    await helpers.run_claim(chunks_first, _claim(db, store, TEXT, "other.txt"), "parse")
    assert chunks_first.coalescer.expecting == 0


async def test_the_worker_steps_index_a_parsed_document_and_serve_it(
    db: Database, store: AsyncObjectStore
) -> None:
    claim = _claim(db, store, TEXT)
    with trio.fail_after(30):
        parsed, embedded, result = await helpers.run_claim(_steps(db, store), claim)
    assert parsed == embedded == len(_chunks(db, claim))
    assert result == CompleteResult(became_current=True)
    with db.connection() as conn:
        job = helpers.job_row(conn, claim.job_id)
        assert (job["status"], job["progress"], job["chunk_count"]) == ("SUCCEEDED", 100, parsed)
        assert helpers.serves(conn, claim)
        assert (
            helpers.count(
                conn,
                "SELECT count(*) FROM embeddings WHERE document_version_id = %s",
                claim.document_version_id,
            )
            == parsed
        )
        assert helpers.events(conn, claim.job_id)[-1] == "JOB_SUCCEEDED"
        attempt = helpers.attempt_row(conn, claim.job_id)
        assert helpers.steps(conn, claim.job_id) == list(helpers.ATTEMPT_STEPS)
        assert (attempt["status"], attempt["chunks"], attempt["embeddings"]) == (
            "SUCCEEDED",
            parsed,
            parsed,
        )
        assert attempt["embeddings_stored_at"] <= attempt["finished_at"]


async def test_a_claim_after_the_chunks_are_stored_does_no_storage_read(
    db: Database, store: AsyncObjectStore
) -> None:
    claim = _claim(db, store, TEXT)
    with trio.fail_after(30):
        (first,) = await helpers.run_claim(_steps(db, store, chunks_first=True), claim, "parse")
    reads = CountingStore.reads
    with db.connection() as conn:
        lifecycle.release_job(conn, claim)  # handed back after its chunk commit
        (again,) = lifecycle.claim_jobs(conn, claim.worker_id, 1, 300)
    assert again.chunks_ready and again.parse is None  # it embeds the stored set
    with trio.fail_after(30):
        embedded, result = await helpers.run_claim(_steps(db, store), again)
    assert embedded == first and CountingStore.reads == reads == 1
    assert result == CompleteResult(became_current=True)
    with db.connection() as conn:
        attempt = helpers.attempt_row(conn, claim.job_id)
        assert attempt["parse_started_at"] is None and attempt["chunks_stored_at"] is None


async def test_a_repeated_parse_of_one_claim_converges_on_the_stored_set(
    db: Database, store: AsyncObjectStore
) -> None:
    claim = _claim(db, store, TEXT)
    with trio.fail_after(30):
        (first,) = await helpers.run_claim(_steps(db, store, chunks_first=True), claim, "parse")
        with db.connection() as conn:
            events = helpers.events(conn, claim.job_id)
            attempt = helpers.attempt_row(conn, claim.job_id)
        # the same claim's parse again, by a fresh set of steps (nothing kept in memory)
        steps = _steps(db, store, chunks_first=True)
        (second,) = await helpers.run_claim(steps, claim, "parse")
    assert second == first
    with db.connection() as conn:
        assert helpers.events(conn, claim.job_id) == events
        assert helpers.attempt_row(conn, claim.job_id) == attempt  # nothing recorded again
        assert helpers.job_row(conn, claim.job_id)["progress"] == 50


async def test_a_crash_between_claim_and_commit_parses_again_on_the_next_attempt(
    db: Database, store: AsyncObjectStore
) -> None:
    claim = _claim(db, store, TEXT)  # then the worker died before committing its chunks
    assert claim.parse is not None and claim.parse.parse_started_at is not None
    with db.connection() as conn:
        assert helpers.job_row(conn, claim.job_id)["progress"] == 0
        assert helpers.steps(conn, claim.job_id) == []
        helpers.expire_lease(conn, claim.job_id)
        lifecycle.recover_expired(conn, helpers.BACKOFF)
        helpers.make_available(conn, claim.job_id)
        (again,) = lifecycle.claim_jobs(conn, claim.worker_id, 1, 300)
    assert not again.chunks_ready  # no chunk set: the next attempt parses
    with trio.fail_after(30):
        count, _, _ = await helpers.run_claim(_steps(db, store), again)
    assert len(_chunks(db, again)) == count
    with db.connection() as conn:
        # the first attempt committed nothing: no step on it;
        # the second parsed again
        first = conn.execute(
            "SELECT * FROM trioindex_job_attempts WHERE id = %s", (claim.attempt_id,)
        ).fetchone()
        assert first is not None
        assert first["parse_started_at"] is None and first["chunks_stored_at"] is None
        assert helpers.steps(conn, claim.job_id) == list(helpers.ATTEMPT_STEPS)
        assert helpers.job_row(conn, claim.job_id)["status"] == "SUCCEEDED"


@pytest.mark.parametrize("forgery", helpers.FORGERIES)
def test_a_lapsed_or_forged_claim_stores_no_chunks(
    db: Database, store: AsyncObjectStore, forgery: str
) -> None:
    claim = _claim(db, store, TEXT)
    snapshot = _snapshot(claim)
    chunks = _parsed(snapshot)
    with db.connection() as conn:
        forged = helpers.forge(conn, claim, forgery)
        (refused,) = store_chunks_many(conn, [ChunkCommit(forged, snapshot, chunks)])
        assert isinstance(refused, OwnershipLost)
    assert _chunks(db, claim) == []
    assert _job(db, claim)["progress"] == 0
    with db.connection() as conn:
        assert helpers.steps(conn, claim.job_id) == []  # a refused commit records no parse


def test_two_concurrent_commits_for_one_claim_converge_on_one_chunk_set(
    db: Database, store: AsyncObjectStore
) -> None:
    claim = _claim(db, store, TEXT)
    snapshot = _snapshot(claim)
    chunks = _parsed(snapshot)
    barrier = threading.Barrier(2)

    def commit(_: int) -> EmbedSnapshot | int | Exception:
        with db.connection() as conn:
            barrier.wait()
            (result,) = store_chunks_many(conn, [ChunkCommit(claim, snapshot, chunks)])
            return result

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(commit, range(2)))
    # one stored the set and began embedding; the other found it stored and wrote nothing
    started = [r for r in results if isinstance(r, EmbedSnapshot)]
    assert len(started) == 1 and len(started[0].chunks) == len(chunks)
    assert [r for r in results if not isinstance(r, EmbedSnapshot)] == [len(chunks)]
    stored = _chunks(db, claim)
    assert [c["content"] for c in stored] == [c.text for c in chunks]
    with db.connection() as conn:
        attempt = helpers.attempt_row(conn, claim.job_id)
        assert attempt["chunks"] == len(chunks)
        stored_at = attempt["chunks_stored_at"]
        # two commits of one set in one group converge the same way
        again = store_chunks_many(
            conn, [ChunkCommit(claim, snapshot, chunks), ChunkCommit(claim, snapshot, chunks)]
        )
        assert again == [len(chunks), len(chunks)]
        assert helpers.attempt_row(conn, claim.job_id)["chunks_stored_at"] == stored_at
    assert len(_chunks(db, claim)) == len(chunks)


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
        await helpers.run_claim(_steps(db, store), claim)
    assert _chunks(db, claim) == []


async def test_a_file_over_the_maximum_size_is_refused_before_reading(
    db: Database, store: AsyncObjectStore
) -> None:
    claim = _claim(db, store, TEXT)
    with trio.fail_after(30), pytest.raises(ContentInvalid, match="maximum size"):
        await helpers.run_claim(_steps(db, store, max_bytes=100), claim)
    assert CountingStore.reads == 0
    assert _chunks(db, claim) == []


async def test_a_checksum_mismatch_is_not_accepted(
    db: Database, store: AsyncObjectStore, tmp_path: Path
) -> None:
    key = storage_key_for(hashlib.sha256(TEXT).hexdigest())
    claim = _claim(db, store, TEXT, version={"sha256": "0" * 64, "storage_key": key})
    with trio.fail_after(30), pytest.raises(StorageUnavailable, match="sha256"):
        await helpers.run_claim(_steps(db, store), claim)
    assert CountingStore.reads == 1
    assert _chunks(db, claim) == []


async def test_a_missing_object_is_storage_unavailable(
    db: Database, store: AsyncObjectStore
) -> None:
    claim = _claim(db, store, TEXT, version={"storage_key": "sha256/00/missing"})
    with trio.fail_after(30), pytest.raises(ObjectNotFound):
        await helpers.run_claim(_steps(db, store), claim)
    assert _chunks(db, claim) == []


# -- almost-right text is indexed, and the repair recorded (issue 11 §5) ------------------------


def _chunks_stored(db: Database, claim: Claim) -> dict[str, Any]:
    """What the claim's attempt recorded of its stored chunk set."""
    with db.connection() as conn:
        row = conn.execute(
            """SELECT chunks, characters, replaced_sequences FROM trioindex_job_attempts
               WHERE id = %s AND chunks_stored_at IS NOT NULL""",
            (claim.attempt_id,),
        ).fetchone()
    assert row is not None
    return dict(row)


async def test_truncated_korean_text_is_indexed_with_the_replacement_recorded(
    db: Database, store: AsyncObjectStore
) -> None:
    text = ("대한민국의 수도는 서울입니다. 한글은 세종대왕이 만들었습니다. " * 200).strip() + " 끝"
    data = text.encode("utf-8")[:-1]  # cut inside the last character
    claim = _claim(db, store, data, "korean.txt")
    with trio.fail_after(30):
        count, _, _ = await helpers.run_claim(_steps(db, store), claim)
    chunks = _chunks(db, claim)
    assert count == len(chunks) > 1
    assert chunks[-1]["content"].endswith("\ufffd")
    recorded = _chunks_stored(db, claim)
    assert recorded == {"chunks": count, "characters": len(text), "replaced_sequences": 1}
    assert _job(db, claim)["status"] == "SUCCEEDED"
    clean = _claim(db, store, TEXT, "clean.txt")
    with trio.fail_after(30):
        await helpers.run_claim(_steps(db, store), clean)
    assert _chunks_stored(db, clean)["replaced_sequences"] is None


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
    steps = _steps(db, store, max_bytes=MAX_BYTES * 4, parse_timeout=1.5)
    before = parse_processes()
    started = time.perf_counter()
    with (
        trio.fail_after(30),
        pytest.raises(
            ContentInvalid,
            match=r"^parsing took longer than indexing\.parsing\.timeout \(1\.5 s\)$",
        ),
    ):
        await helpers.run_claim(steps, claim)
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
    steps = _steps(db, store, max_bytes=MAX_BYTES * 4)
    before = parse_processes()
    started = time.perf_counter()
    with trio.move_on_after(1.5) as scope:  # as a shutdown or a lost lease cancels a job
        await helpers.run_claim(steps, claim)
    elapsed = time.perf_counter() - started
    assert scope.cancelled_caught
    assert elapsed < 1.5 + 1.5, "the parse was killed, not waited for"
    assert parse_processes() <= before
    job = _job(db, claim)
    # still parsing (the prepare wrote nothing), nothing stored: the claim is the runner's
    # to hand back
    assert (job["status"], job["progress"]) == ("PROCESSING", 0)
    assert _chunks(db, claim) == []


def _enqueue_stored(db: Database, store: AsyncObjectStore, data: bytes, priority: int) -> UUID:
    sha = hashlib.sha256(data).hexdigest()
    store.store.put(storage_key_for(sha), data, size=len(data), sha256=sha, content_type=None)
    with db.connection() as conn:
        model = helpers.model(conn)
        result = helpers.enqueue(conn, model.id, content=data, priority=priority, max_attempts=1)
    assert result.job_id is not None
    return result.job_id


async def test_the_worker_indexes_a_normal_document_while_a_hostile_one_parses(
    db: Database, store: AsyncObjectStore
) -> None:
    hostile_job = _enqueue_stored(db, store, slow_pdf(), priority=1)  # claimed first
    normal_job = _enqueue_stored(db, store, TEXT, priority=0)
    finished: list[tuple[UUID, str]] = []
    worker = Worker(
        queue=JobQueue(db, lease_seconds=30, backoff=BackoffPolicy(0.05, 0.2, 0.0)),
        steps=_steps(db, store, max_bytes=MAX_BYTES * 4, parse_timeout=6.0),
        settings=attrs.evolve(default_settings().worker, max_concurrency=2, polling_interval=0.05),
        on_job_done=lambda claim, outcome: finished.append((claim.job_id, str(outcome))),
    )
    with trio.fail_after(60):
        await worker.serve(drain=True)
    assert [job for job, _ in finished] == [normal_job, hostile_job]
    assert finished[0][1] == "succeeded"
    with db.connection() as conn:
        normal_row = helpers.job_row(conn, normal_job)
        hostile_row = helpers.job_row(conn, hostile_job)
        served = helpers.count(conn, "SELECT count(*) FROM served_versions")
    assert (normal_row["status"], normal_row["progress"]) == ("SUCCEEDED", 100)
    assert served == 1  # the normal document only
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
