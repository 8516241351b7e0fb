"""The embedding step on real PostgreSQL + pgvector against the fault-injecting HTTP server,
through the worker's own steps (:class:`trioindex.worker.wiring.PipelineSteps`, run by
``helpers.run_claim``: embed, then complete, which stores the vectors in slices of
``SLICE_ROWS`` and completes the job with the last); the SQL contract of the vector writes
(fencing, refusals, partial sets, converging commits) through :mod:`trioindex.db.steps`.

The claims here find their chunk set stored (``chunks_ready``): they run embed and complete."""

from __future__ import annotations

import hashlib
import threading
import uuid
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio

from testkit.embed_server import FakeEmbedServer, fake_vector
from tests import helpers
from trioindex.db import jobs as lifecycle
from trioindex.db.pool import Connection, Database
from trioindex.db.steps import (
    ChunkRef,
    EmbeddingCommit,
    EmbeddingDraft,
    EmbedSnapshot,
    StoredSlice,
    begin_embedding,
    store_embeddings_many,
)
from trioindex.embedding import Embedder, open_embedder
from trioindex.embedding.vectors import validate_vectors
from trioindex.errors import (
    OwnershipLost,
    ProviderRejectedInput,
    ProviderUnavailable,
    ResultInvalid,
    StateInconsistent,
)
from trioindex.pipeline.embed_step import (
    HASH_SLICE_ROWS,
    SLICE_ROWS,
    drafts_from_matrix,
)
from trioindex.storage import AsyncObjectStore, FolderStore
from trioindex.values import Claim, CompleteResult
from trioindex.worker.wiring import PipelineSteps

DIM = 1024
TEXTS = [f"chunk number {i}: 색인 문장 {i}." for i in range(7)]


def _claim_staged(
    db: Database, texts: Sequence[str], *, model: str = "BAAI/bge-m3", dimension: int = DIM
) -> Claim:
    """A claim of a job whose version has its chunk set stored (one chunk per text)."""
    with db.connection() as conn:
        model_id = helpers.model(conn, model, dimension).id
        result = helpers.enqueue(conn, model_id)
        helpers.stage_chunks(conn, result.version_id, texts)
        (claimed,) = lifecycle.claim_jobs(conn, helpers.worker(conn), 1, 300)
    assert claimed.chunks_ready
    return claimed


@pytest.fixture
def claim(db: Database) -> Claim:
    return _claim_staged(db, TEXTS)


@pytest.fixture
def store(tmp_path: Path) -> AsyncObjectStore:
    """The worker's object store (never read here: the chunks are stored already)."""
    folder = FolderStore(tmp_path / "blobs")
    folder.ensure_ready()
    return AsyncObjectStore(folder, trio.CapacityLimiter(2))


async def _tei(url: str, *, batch_size: int = 3, max_in_flight: int = 2) -> Embedder:
    return await open_embedder(
        api="tei",
        url=url,
        model="BAAI/bge-m3",
        dimension=DIM,
        batch_size=batch_size,
        max_in_flight=max_in_flight,
        request_timeout=5.0,
    )


@pytest.fixture
async def embedder(embed_server: FakeEmbedServer) -> AsyncIterator[Embedder]:
    client = await _tei(embed_server.url)
    yield client
    await client.aclose()


@pytest.fixture
def steps(db: Database, store: AsyncObjectStore, embedder: Embedder) -> PipelineSteps:
    return helpers.pipeline_steps(db, store, embedder)


def _stored(db: Database, claim: Claim) -> list[dict[str, Any]]:
    with db.connection() as conn:
        return conn.execute(
            """SELECT e.*, c.chunk_index, c.content, c.document_id AS chunk_document
               FROM embeddings e JOIN document_chunks c ON c.id = e.chunk_id
               WHERE e.document_version_id = %s ORDER BY c.chunk_index""",
            (claim.document_version_id,),
        ).fetchall()


def _job(db: Database, claim: Claim) -> dict[str, Any]:
    with db.connection() as conn:
        return helpers.job_row(conn, claim.job_id)


def _served(db: Database, claim: Claim) -> bool:
    with db.connection() as conn:
        return helpers.serves(conn, claim)


def _independent_hash(vector: Any) -> str:
    return hashlib.sha256(np.asarray(vector, dtype=">f4").tobytes()).hexdigest()


def _snapshot(db: Database, claim: Claim) -> EmbedSnapshot:
    with db.connection() as conn:
        return begin_embedding(conn, claim)


def build_drafts(snapshot: EmbedSnapshot, vectors: object) -> list[EmbeddingDraft]:
    """The worker's two steps from an embedder's answer: validate it, then hash each row."""
    matrix = validate_vectors(
        vectors, expected_count=len(snapshot.chunks), dimension=snapshot.dimension
    ).matrix()
    return drafts_from_matrix(snapshot, matrix)


def _commit(
    snapshot: EmbedSnapshot, claim: Claim, start: int = 0, stop: int | None = None
) -> EmbeddingCommit:
    """The slice ``start .. stop`` of the snapshot's vectors (the fake server's), for ``claim``."""
    drafts = build_drafts(
        snapshot, [fake_vector(c.text, snapshot.dimension) for c in snapshot.chunks]
    )
    return EmbeddingCommit(claim, snapshot, drafts[start:stop], start)


def _store(db: Database, *commits: EmbeddingCommit) -> list[StoredSlice | Exception]:
    with db.connection() as conn:
        return store_embeddings_many(conn, commits)


def _insert_set(db: Database, commit: EmbeddingCommit) -> None:
    """Store the commit's vectors by hand, without completing the job."""
    snapshot = commit.snapshot
    with db.connection() as conn:
        for draft in commit.drafts:
            conn.execute(
                """INSERT INTO embeddings (chunk_id, document_id, document_version_id,
                       embedding_model_id, vector, dimension, vector_sha256)
                   VALUES (%s, %s, %s, %s, %s, %s, %s)""",
                (
                    draft.chunk_id,
                    snapshot.document_id,
                    snapshot.version_id,
                    snapshot.model_id,
                    draft.vector.tolist(),
                    snapshot.dimension,
                    draft.vector_sha256,
                ),
            )


# -- the step through the worker's path -----------------------------------------------------------


async def test_vectors_are_stored_with_relations_and_hashes_by_the_completion(
    db: Database, claim: Claim, steps: PipelineSteps
) -> None:
    with trio.fail_after(20):
        assert await helpers.run_claim(steps, claim, "embed") == [len(TEXTS)]
    # the embed step keeps its vectors: they are stored with the completion, in one transaction
    assert _stored(db, claim) == []
    job = _job(db, claim)
    assert (job["status"], job["progress"]) == ("PROCESSING", 50)
    assert not _served(db, claim)
    with trio.fail_after(20):
        assert await helpers.run_claim(steps, claim, "complete") == [CompleteResult(True)]
    rows = _stored(db, claim)
    assert [r["chunk_index"] for r in rows] == list(range(len(TEXTS)))
    for row in rows:
        vector = np.asarray(row["vector"].to_list(), dtype=np.float32)
        expected = np.asarray(fake_vector(row["content"], DIM), dtype=np.float32)
        np.testing.assert_allclose(vector, expected, rtol=1e-6)  # right vector on the right chunk
        assert row["dimension"] == DIM and row["status"] == "ACTIVE"
        assert row["vector_sha256"] == _independent_hash(vector)
        assert row["document_id"] == row["chunk_document"]
        assert row["embedding_model_id"] == claim.embedding_model_id
    job = _job(db, claim)
    assert (job["status"], job["progress"], job["chunk_count"]) == ("SUCCEEDED", 100, len(TEXTS))
    assert _served(db, claim)
    with db.connection() as conn:
        events = helpers.events(conn, claim.job_id)
        attempt = helpers.attempt_row(conn, claim.job_id)
    assert events[-1] == "JOB_SUCCEEDED"
    assert (attempt["embeddings"], attempt["embedding_slices"]) == (len(TEXTS), 1)
    assert attempt["embedding_started_at"] <= attempt["embeddings_stored_at"]


async def test_a_replay_over_a_complete_set_makes_no_request_and_adds_nothing(
    db: Database, claim: Claim, steps: PipelineSteps, embed_server: FakeEmbedServer
) -> None:
    # the model's full set on the chunks, the job not completed yet (what a set stored before
    # its completion leaves): the embed step finds it complete, the completion only completes
    _insert_set(db, _commit(_snapshot(db, claim), claim))
    with db.connection() as conn:
        events_before = helpers.events(conn, claim.job_id)
    embed_server.reset_stats()
    with trio.fail_after(20):
        assert await helpers.run_claim(steps, claim) == [len(TEXTS), CompleteResult(True)]
    assert embed_server.stats().requests == 0
    assert len(_stored(db, claim)) == len(TEXTS)
    with db.connection() as conn:
        assert helpers.events(conn, claim.job_id) == [*events_before, "JOB_SUCCEEDED"]
        attempt = helpers.attempt_row(conn, claim.job_id)
    # this attempt stored no vector: it records none
    assert (attempt["status"], attempt["embeddings"], attempt["embeddings_stored_at"]) == (
        "SUCCEEDED",
        None,
        None,
    )
    assert _served(db, claim)


@pytest.mark.parametrize(
    ("mode", "error"),
    [
        ("status_503", ProviderUnavailable),
        ("status_500", ProviderUnavailable),
        ("status_429", ProviderUnavailable),
        ("status_424", ProviderUnavailable),
        ("status_413", ProviderRejectedInput),
        ("status_422", ProviderRejectedInput),
        ("malformed", ResultInvalid),
        ("null_vector", ResultInvalid),
        ("wrong_count", ResultInvalid),
        ("wrong_dimension", ResultInvalid),
        ("nan", ResultInvalid),
        ("infinity", ResultInvalid),
        ("disconnect", ProviderUnavailable),
    ],
)
async def test_each_fault_maps_to_its_type_and_stores_nothing(
    db: Database,
    claim: Claim,
    steps: PipelineSteps,
    embed_server: FakeEmbedServer,
    mode: str,
    error: type[Exception],
) -> None:
    embed_server.set_mode(mode)
    with trio.fail_after(30), pytest.raises(error):
        await helpers.run_claim(steps, claim)
    assert _stored(db, claim) == []
    assert _job(db, claim)["status"] == "PROCESSING"  # the runner reports the failure
    assert not _served(db, claim)


async def test_a_wrong_dimension_model_is_refused_before_storing(
    db: Database, claim: Claim, store: AsyncObjectStore, embed_server: FakeEmbedServer
) -> None:
    embed_server.configure(dimension=384)
    client = await open_embedder(
        api="openai",
        url=embed_server.url,
        model="BAAI/bge-m3",
        dimension=DIM,
        batch_size=8,
        max_in_flight=1,
        request_timeout=5.0,
    )
    try:
        with trio.fail_after(20), pytest.raises(ResultInvalid):
            await helpers.run_claim(helpers.pipeline_steps(db, store, client), claim)
    finally:
        await client.aclose()
    assert _stored(db, claim) == []


async def test_the_chunks_changed_since_embedding_began_are_refused(
    db: Database, claim: Claim, steps: PipelineSteps
) -> None:
    with trio.fail_after(20):
        await helpers.run_claim(steps, claim, "embed")
    with db.connection() as conn:  # the set is not the one the vectors were made for
        conn.execute(
            """UPDATE document_chunks SET id = gen_random_uuid()
               WHERE document_version_id = %s AND chunk_index = 3""",
            (claim.document_version_id,),
        )
    with trio.fail_after(20), pytest.raises(StateInconsistent, match="chunks changed"):
        await helpers.run_claim(steps, claim, "complete")
    assert _stored(db, claim) == []
    assert _job(db, claim)["status"] == "PROCESSING"
    assert not _served(db, claim)


async def test_a_document_embedded_in_several_requests_keeps_vectors_on_their_chunks(
    db: Database, store: AsyncObjectStore, embed_server: FakeEmbedServer
) -> None:
    texts = [f"slice test chunk {i}" for i in range(20)]  # batch 1: 20 requests
    claimed = _claim_staged(db, texts)
    client = await _tei(embed_server.url, batch_size=1, max_in_flight=4)
    try:
        with trio.fail_after(30):
            result = await helpers.run_claim(helpers.pipeline_steps(db, store, client), claimed)
    finally:
        await client.aclose()
    assert result == [20, CompleteResult(True)]
    assert embed_server.stats().embed_requests == 20
    rows = _stored(db, claimed)
    assert len(rows) == 20
    for row in rows:
        expected = np.asarray(fake_vector(row["content"], DIM), dtype=np.float32)
        np.testing.assert_allclose(np.asarray(row["vector"].to_list(), dtype=np.float32), expected)


async def test_a_large_document_is_stored_in_slices_and_served_only_after_the_last(
    db: Database, store: AsyncObjectStore
) -> None:
    size = SLICE_ROWS + 5  # two slices: SLICE_ROWS vectors, then 5
    texts = [f"large document chunk {i}" for i in range(size)]
    claimed = _claim_staged(db, texts, model="tiny-model", dimension=8)
    embedder = helpers.FakeEmbedder(dimension=8, model="tiny-model")
    steps = helpers.pipeline_steps(db, store, embedder)
    seen: list[tuple[list[tuple[int, int]], list[StoredSlice | Exception], str, bool, int]] = []
    write = steps.store_embeddings.write_group

    def watched(conn: Connection, commits: Sequence[EmbeddingCommit]) -> list[Any]:
        """The production group function, then what its transaction left (read in it)."""
        results = write(conn, commits)
        seen.append(
            (
                [(c.offset, len(c.drafts)) for c in commits],
                results,
                helpers.job_row(conn, claimed.job_id)["status"],
                helpers.serves(conn, claimed),
                helpers.count(
                    conn,
                    "SELECT count(*) FROM embeddings WHERE document_version_id = %s",
                    claimed.document_version_id,
                ),
            )
        )
        return results

    steps.store_embeddings.write_group = watched
    with trio.fail_after(60):
        result = await helpers.run_claim(steps, claimed)
    assert result == [size, CompleteResult(True)]
    assert embedder.texts == size
    assert seen == [
        ([(0, SLICE_ROWS)], [StoredSlice(None)], "PROCESSING", False, SLICE_ROWS),
        ([(SLICE_ROWS, 5)], [StoredSlice(CompleteResult(True))], "SUCCEEDED", True, size),
    ]
    rows = _stored(db, claimed)
    assert [r["content"] for r in rows] == texts
    expected = np.array([fake_vector(t, 8) for t in texts], dtype=np.float32)
    got = np.array([r["vector"].to_list() for r in rows], dtype=np.float32)
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    with db.connection() as conn:
        attempt = helpers.attempt_row(conn, claimed.job_id)
    assert (attempt["embeddings"], attempt["embedding_slices"]) == (size, 2)
    assert _job(db, claimed)["chunk_count"] == size


# -- the SQL contract of the vector writes ---------------------------------------------------------


def test_two_threads_committing_one_claim_store_one_set_and_complete_once(
    db: Database, claim: Claim
) -> None:
    commit = _commit(_snapshot(db, claim), claim)
    barrier = threading.Barrier(2)

    def store(_: int) -> StoredSlice | Exception:
        with db.connection() as conn:
            barrier.wait()
            (result,) = store_embeddings_many(conn, [commit])
            return result

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(store, range(2)))
    # one stored the set and completed the job; the late one found the job finished: refused
    assert [r for r in results if isinstance(r, StoredSlice)] == [StoredSlice(CompleteResult(True))]
    assert [type(r) for r in results if not isinstance(r, StoredSlice)] == [OwnershipLost]
    assert len(_stored(db, claim)) == len(TEXTS)
    with db.connection() as conn:
        events = helpers.events(conn, claim.job_id)
        attempt = helpers.attempt_row(conn, claim.job_id)
    assert events.count("JOB_SUCCEEDED") == 1
    assert (attempt["embeddings"], attempt["embedding_slices"]) == (len(TEXTS), 1)


def test_a_complete_set_stored_again_is_not_written_and_the_job_still_completes(
    db: Database, claim: Claim
) -> None:
    commit = _commit(_snapshot(db, claim), claim)
    _insert_set(db, commit)
    ids = {row["id"] for row in _stored(db, claim)}
    assert _store(db, commit) == [StoredSlice(CompleteResult(True))]
    assert {row["id"] for row in _stored(db, claim)} == ids
    with db.connection() as conn:
        events = helpers.events(conn, claim.job_id)
        attempt = helpers.attempt_row(conn, claim.job_id)
    assert events[-1] == "JOB_SUCCEEDED" and attempt["embeddings"] is None
    assert _served(db, claim)


def test_the_last_slice_twice_in_one_group_completes_the_job_once(
    db: Database, claim: Claim
) -> None:
    snapshot = _snapshot(db, claim)
    first, rest = _commit(snapshot, claim, 0, 3), _commit(snapshot, claim, 3)
    assert _store(db, first) == [StoredSlice(None)]
    # the first completes the job; the second is refused by the fence (the job is finished)
    done, late = _store(db, rest, rest)
    assert done == StoredSlice(CompleteResult(True))
    assert isinstance(late, OwnershipLost)
    assert len(_stored(db, claim)) == len(TEXTS)
    with db.connection() as conn:
        events = helpers.events(conn, claim.job_id)
        attempt = helpers.attempt_row(conn, claim.job_id)
    assert events.count("JOB_SUCCEEDED") == 1
    assert (attempt["embeddings"], attempt["embedding_slices"]) == (len(TEXTS), 2)


@pytest.mark.parametrize("forgery", helpers.FORGERIES)
def test_a_lapsed_or_forged_claim_stores_nothing(db: Database, claim: Claim, forgery: str) -> None:
    snapshot = _snapshot(db, claim)
    with db.connection() as conn:
        forged = helpers.forge(conn, claim, forgery)
        (refused,) = store_embeddings_many(conn, [_commit(snapshot, forged)])
        assert isinstance(refused, OwnershipLost)
        with pytest.raises(OwnershipLost):
            begin_embedding(conn, forged)
    assert _stored(db, claim) == []
    assert not _served(db, claim)


def test_a_slice_that_does_not_follow_the_stored_part_is_refused(
    db: Database, claim: Claim
) -> None:
    snapshot = _snapshot(db, claim)
    assert _store(db, _commit(snapshot, claim, 0, 3)) == [StoredSlice(None)]
    job = _job(db, claim)
    assert (job["status"], len(_stored(db, claim))) == ("PROCESSING", 3)  # a partial set
    assert not _served(db, claim)
    for start, stop in ((5, None), (0, 3), (1, 4)):  # a gap, a repeat, an overlap
        (refused,) = _store(db, _commit(snapshot, claim, start, stop))
        assert isinstance(refused, StateInconsistent)
        assert "partial embedding set" in str(refused)
    with db.connection() as conn, pytest.raises(StateInconsistent, match="cannot complete"):
        lifecycle.complete_job(conn, claim)
    assert len(_stored(db, claim)) == 3
    # the slice that follows ends the set and completes the job
    assert _store(db, _commit(snapshot, claim, 3)) == [StoredSlice(CompleteResult(True))]
    assert _served(db, claim)


def test_drafts_that_do_not_match_the_set_are_refused_before_the_database(
    db: Database, claim: Claim
) -> None:
    snapshot = _snapshot(db, claim)
    commit = _commit(snapshot, claim)
    swapped = EmbeddingCommit(claim, snapshot, [commit.drafts[1], commit.drafts[0]])
    short = EmbeddingCommit(claim, snapshot, commit.drafts[:3], 2)  # at the wrong offset
    for wrong in (swapped, short):
        (refused,) = _store(db, wrong)
        assert isinstance(refused, StateInconsistent) and "do not match" in str(refused)
    assert _stored(db, claim) == []


async def test_a_crash_between_slices_is_embedded_again_whole_by_the_next_attempt(
    db: Database, claim: Claim, steps: PipelineSteps, embed_server: FakeEmbedServer
) -> None:
    snapshot = _snapshot(db, claim)
    assert _store(db, _commit(snapshot, claim, 0, 3)) == [StoredSlice(None)]
    partial = {row["id"] for row in _stored(db, claim)}
    with db.connection() as conn:  # then the worker died before the next slice
        helpers.expire_lease(conn, claim.job_id)
        lifecycle.recover_expired(conn, helpers.BACKOFF)
        helpers.make_available(conn, claim.job_id)
        (again,) = lifecycle.claim_jobs(conn, claim.worker_id, 1, 300)
    assert again.chunks_ready and again.attempt_no == 2
    embed_server.reset_stats()
    with trio.fail_after(20):
        # the next attempt's begin_embedding clears the partial set; every chunk is embedded
        assert await helpers.run_claim(steps, again) == [len(TEXTS), CompleteResult(True)]
    assert embed_server.stats().inputs == len(TEXTS)
    rows = _stored(db, again)
    assert len(rows) == len(TEXTS) and not partial & {row["id"] for row in rows}
    for row in rows:
        expected = np.asarray(fake_vector(row["content"], DIM), dtype=np.float32)
        np.testing.assert_allclose(np.asarray(row["vector"].to_list(), dtype=np.float32), expected)
    job = _job(db, again)
    assert (job["status"], job["chunk_count"]) == ("SUCCEEDED", len(TEXTS))
    assert _served(db, again)


def test_begin_embedding_clears_a_partial_set_and_keeps_a_complete_one(
    db: Database, claim: Claim
) -> None:
    snapshot = _snapshot(db, claim)
    assert not snapshot.complete
    with db.connection() as conn:
        began = helpers.attempt_row(conn, claim.job_id)["embedding_started_at"]
    assert began is not None
    _store(db, _commit(snapshot, claim, 0, 2))
    again = _snapshot(db, claim)  # the partial set belongs to this job alone: it is cleared
    assert not again.complete and _stored(db, claim) == []
    assert [c.id for c in again.chunks] == [c.id for c in snapshot.chunks]
    with db.connection() as conn:
        # embedding began once in this attempt
        assert helpers.attempt_row(conn, claim.job_id)["embedding_started_at"] == began


def test_embedding_uses_the_jobs_pinned_model_not_the_active_one(
    db: Database, claim: Claim
) -> None:
    with db.connection() as conn:
        conn.execute("UPDATE embedding_models SET is_active = false")
        helpers.model(conn, "another-model", 8)
        conn.execute("UPDATE embedding_models SET is_active = (name = 'another-model')")
        snapshot = begin_embedding(conn, claim)
    assert snapshot.model_id == claim.embedding_model_id and snapshot.dimension == DIM


def test_vectors_failing_validation_build_no_drafts(db: Database, claim: Claim) -> None:
    snapshot = _snapshot(db, claim)
    vectors = [fake_vector(c.text, DIM) for c in snapshot.chunks]
    vectors[3] = [float("nan")] * DIM
    with pytest.raises(ResultInvalid):
        build_drafts(snapshot, vectors)
    with pytest.raises(ResultInvalid):
        build_drafts(snapshot, vectors[:-1])


def test_draft_hashes_follow_the_vector_hash_definition(db: Database, claim: Claim) -> None:
    from trioindex.embedding.vectors import vector_sha256

    snapshot = _snapshot(db, claim)
    rng = np.random.default_rng(7)
    vectors = rng.uniform(-1, 1, size=(len(snapshot.chunks), DIM)).tolist()
    drafts = build_drafts(snapshot, vectors)
    assert [d.vector_sha256 for d in drafts] == [vector_sha256(v) for v in vectors]
    assert all(d.vector.dtype == np.float32 and not d.vector.flags.writeable for d in drafts)


def test_draft_hashes_are_right_across_hash_slices() -> None:
    """Vectors are hashed a slice of rows at a time: every row of a set longer than several
    slices gets its own vector's hash."""
    from trioindex.embedding.vectors import vector_sha256
    from trioindex.pipeline.embed_step import drafts_from_matrix

    rows = 2 * HASH_SLICE_ROWS + 5
    snapshot = EmbedSnapshot(
        version_id=uuid.uuid4(),
        document_id=uuid.uuid4(),
        model_id=uuid.uuid4(),
        model_name="m",
        dimension=8,
        chunks=tuple(ChunkRef(uuid.uuid4(), i, f"text {i}") for i in range(rows)),
        complete=False,
    )
    matrix = np.random.default_rng(3).uniform(-1, 1, size=(rows, 8)).astype(np.float32)
    drafts = drafts_from_matrix(snapshot, matrix)
    assert [d.vector_sha256 for d in drafts] == [vector_sha256(v.tolist()) for v in matrix]
    assert [d.chunk_id for d in drafts] == [c.id for c in snapshot.chunks]
    bare = snapshot.without_texts()
    assert [(c.id, c.index, c.text) for c in bare.chunks] == [
        (c.id, c.index, "") for c in snapshot.chunks
    ]
    assert bare.texts() == [""] * rows and snapshot.texts()[-1] == f"text {rows - 1}"
