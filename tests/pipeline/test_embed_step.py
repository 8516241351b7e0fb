"""The embedding step on real PostgreSQL + pgvector against the fault-injecting HTTP server."""

from __future__ import annotations

import hashlib
import threading
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import trio

from testkit.embed_server import FakeEmbedServer, fake_vector
from tests import helpers
from trioindex.db import jobs as lifecycle
from trioindex.db.pool import Database
from trioindex.embedding import Embedder, open_embedder
from trioindex.errors import (
    OwnershipLost,
    ProviderRejectedInput,
    ProviderUnavailable,
    ResultInvalid,
    StateInconsistent,
)
from trioindex.pipeline.embed_step import (
    build_drafts,
    commit_embeddings,
    prepare_embedding,
    run_embed_step,
)
from trioindex.values import Claim

DIM = 1024
TEXTS = [f"chunk number {i}: 색인 문장 {i}." for i in range(7)]


@pytest.fixture
def claim(db: Database) -> Claim:
    with db.connection() as conn:
        model = helpers.model(conn, "BAAI/bge-m3", DIM)
        helpers.enqueue(conn, model.id)
        worker = helpers.worker(conn)
        (claimed,) = lifecycle.claim_jobs(conn, worker, 1, 300)
        helpers.stage_chunked(conn, claimed, TEXTS)
    return claimed


@pytest.fixture
async def embedder(embed_server: FakeEmbedServer) -> AsyncIterator[Embedder]:
    client = await open_embedder(
        api="tei",
        url=embed_server.url,
        model="BAAI/bge-m3",
        dimension=DIM,
        batch_size=3,
        max_in_flight=2,
        request_timeout=5.0,
    )
    yield client
    await client.aclose()


def _stored(db: Database, claim: Claim) -> list[dict[str, Any]]:
    with db.connection() as conn:
        return conn.execute(
            """SELECT e.*, c.chunk_index, c.content, c.document_id AS chunk_document
               FROM embeddings e JOIN document_chunks c ON c.id = e.chunk_id
               WHERE e.document_version_id = %s ORDER BY c.chunk_index""",
            (claim.document_version_id,),
        ).fetchall()


def _independent_hash(vector: Any) -> str:
    return hashlib.sha256(np.asarray(vector, dtype=">f4").tobytes()).hexdigest()


async def test_vectors_are_stored_with_relations_and_hashes(
    db: Database, claim: Claim, embedder: Embedder
) -> None:
    with trio.fail_after(20):
        assert await run_embed_step(claim, db=db, embedder=embedder) == len(TEXTS)
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
    with db.connection() as conn:
        version = conn.execute(
            "SELECT status FROM document_versions WHERE id = %s", (claim.document_version_id,)
        ).fetchone()
        assert version == {"status": "EMBEDDING"}  # completion belongs to the complete step
        assert helpers.events(conn, claim.job_id).count("EMBEDDING_STARTED") == 1


async def test_a_repeat_call_makes_no_request_and_adds_nothing(
    db: Database, claim: Claim, embedder: Embedder, embed_server: FakeEmbedServer
) -> None:
    with trio.fail_after(20):
        await run_embed_step(claim, db=db, embedder=embedder)
        embed_server.reset_stats()
        with db.connection() as conn:
            events_before = helpers.events(conn, claim.job_id)
        assert await run_embed_step(claim, db=db, embedder=embedder) == len(TEXTS)
    assert embed_server.stats().requests == 0
    assert len(_stored(db, claim)) == len(TEXTS)
    with db.connection() as conn:
        assert helpers.events(conn, claim.job_id) == events_before


def test_two_threads_committing_one_claim_converge_on_one_set(db: Database, claim: Claim) -> None:
    with db.connection() as conn:
        snapshot = prepare_embedding(conn, claim)
    drafts = build_drafts(snapshot, [fake_vector(c.text, DIM) for c in snapshot.chunks])
    barrier = threading.Barrier(2)

    def commit(_: int) -> bool:
        with db.connection() as conn:
            barrier.wait()
            return commit_embeddings(conn, claim, snapshot, drafts)

    with ThreadPoolExecutor(2) as pool:
        results = sorted(pool.map(commit, range(2)))
    assert results == [False, True]  # one stored, the late one replayed
    assert len(_stored(db, claim)) == len(TEXTS)
    with db.connection() as conn:
        assert helpers.events(conn, claim.job_id).count("EMBEDDINGS_STORED") == 1


@pytest.mark.parametrize("forgery", helpers.FORGERIES)
def test_a_lapsed_or_forged_claim_stores_nothing(db: Database, claim: Claim, forgery: str) -> None:
    with db.connection() as conn:
        snapshot = prepare_embedding(conn, claim)
    drafts = build_drafts(snapshot, [fake_vector(c.text, DIM) for c in snapshot.chunks])
    with db.connection() as conn:
        forged = helpers.forge(conn, claim, forgery)
        with pytest.raises(OwnershipLost):
            commit_embeddings(conn, forged, snapshot, drafts)
    assert _stored(db, claim) == []


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
    embedder: Embedder,
    embed_server: FakeEmbedServer,
    mode: str,
    error: type[Exception],
) -> None:
    embed_server.set_mode(mode)
    with trio.fail_after(30), pytest.raises(error):
        await run_embed_step(claim, db=db, embedder=embedder)
    assert _stored(db, claim) == []


async def test_a_wrong_dimension_model_is_refused_before_storing(
    db: Database, claim: Claim, embed_server: FakeEmbedServer
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
            await run_embed_step(claim, db=db, embedder=client)
    finally:
        await client.aclose()
    assert _stored(db, claim) == []


def test_a_partial_set_is_inconsistent(db: Database, claim: Claim) -> None:
    with db.connection() as conn:
        snapshot = prepare_embedding(conn, claim)
        drafts = build_drafts(snapshot, [fake_vector(c.text, DIM) for c in snapshot.chunks])
        commit_embeddings(conn, claim, snapshot, drafts)
        conn.execute(
            "DELETE FROM embeddings WHERE id IN (SELECT id FROM embeddings WHERE document_version_id = %s LIMIT 2)",
            (claim.document_version_id,),
        )
        with pytest.raises(StateInconsistent):
            prepare_embedding(conn, claim)


def test_embedding_uses_the_jobs_pinned_model_not_the_active_one(
    db: Database, claim: Claim
) -> None:
    with db.connection() as conn:
        conn.execute("UPDATE embedding_models SET is_active = false")
        helpers.model(conn, "another-model", 8)
        conn.execute("UPDATE embedding_models SET is_active = (name = 'another-model')")
        snapshot = prepare_embedding(conn, claim)
    assert snapshot.model_id == claim.embedding_model_id and snapshot.dimension == DIM


def test_vectors_failing_validation_build_no_drafts(db: Database, claim: Claim) -> None:
    with db.connection() as conn:
        snapshot = prepare_embedding(conn, claim)
    vectors = [fake_vector(c.text, DIM) for c in snapshot.chunks]
    vectors[3] = [float("nan")] * DIM
    with pytest.raises(ResultInvalid):
        build_drafts(snapshot, vectors)
    with pytest.raises(ResultInvalid):
        build_drafts(snapshot, vectors[:-1])


def test_draft_hashes_follow_the_vector_hash_definition(db: Database, claim: Claim) -> None:
    from trioindex.embedding.vectors import vector_sha256

    with db.connection() as conn:
        snapshot = prepare_embedding(conn, claim)
    rng = np.random.default_rng(7)
    vectors = rng.uniform(-1, 1, size=(len(snapshot.chunks), DIM)).tolist()
    drafts = build_drafts(snapshot, vectors)
    assert [d.vector_sha256 for d in drafts] == [vector_sha256(v) for v in vectors]
    assert all(d.vector.dtype == np.float32 and not d.vector.flags.writeable for d in drafts)


async def test_a_document_embedded_in_several_slices_keeps_vectors_on_their_chunks(
    db: Database, embed_server: FakeEmbedServer
) -> None:
    texts = [f"slice test chunk {i}" for i in range(20)]  # batch 1 → slices of 8, 8 and 4
    with db.connection() as conn:
        model = helpers.model(conn, "BAAI/bge-m3", DIM)
        helpers.enqueue(conn, model.id)
        (claimed,) = lifecycle.claim_jobs(conn, helpers.worker(conn), 1, 300)
        helpers.stage_chunked(conn, claimed, texts)
    client = await open_embedder(
        api="tei",
        url=embed_server.url,
        model="BAAI/bge-m3",
        dimension=DIM,
        batch_size=1,
        max_in_flight=4,
        request_timeout=5.0,
    )
    try:
        with trio.fail_after(30):
            assert await run_embed_step(claimed, db=db, embedder=client) == 20
    finally:
        await client.aclose()
    assert embed_server.stats().embed_requests == 20
    for row in _stored(db, claimed):
        expected = np.asarray(fake_vector(row["content"], DIM), dtype=np.float32)
        np.testing.assert_allclose(np.asarray(row["vector"].to_list(), dtype=np.float32), expected)


def test_draft_hashes_are_right_across_hash_slices() -> None:
    """Vectors are hashed a slice of rows at a time: every row of a set longer than several
    slices gets its own vector's hash."""
    from trioindex.embedding.vectors import vector_sha256
    from trioindex.pipeline.embed_step import (
        HASH_SLICE_ROWS,
        ChunkRef,
        EmbedSnapshot,
        drafts_from_matrix,
    )

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
