"""The worker's pipeline steps (worker/wiring.py PipelineSteps) on real PostgreSQL + pgvector and
the fake HTTP embedding server: a set larger than a slice is stored in slices of
:data:`~trioindex.pipeline.embed_step.SLICE_ROWS` through the group committer, the last slice
completing the job, with every vector on its own chunk although the step drops the chunk texts
as it embeds; the set is served only once whole, and a partial set a lost lease left is cleared
by the next attempt."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
import trio

from testkit.embed_server import FakeEmbedServer, fake_vector
from tests import helpers
from trioindex.db import jobs as lifecycle
from trioindex.db.pool import Connection, Database
from trioindex.db.steps import EmbeddingCommit, StoredSlice, store_embeddings_many
from trioindex.embedding import Embedder, open_embedder
from trioindex.errors import OwnershipLost
from trioindex.pipeline.chunk_values import ChunkingPolicy
from trioindex.pipeline.chunking import Chunker
from trioindex.pipeline.embed_step import SLICE_ROWS
from trioindex.storage import AsyncObjectStore, open_store
from trioindex.values import BackoffPolicy, Claim
from trioindex.worker.wiring import PipelineSteps

DIM = 8
BIG = SLICE_ROWS + 3  # two slices: SLICE_ROWS vectors, then 3


@pytest.fixture
def small_server() -> Iterator[FakeEmbedServer]:
    with FakeEmbedServer(dimension=DIM, shuffle=False) as server:
        yield server


@pytest.fixture
async def embedder(small_server: FakeEmbedServer) -> AsyncIterator[Embedder]:
    client = await open_embedder(
        api="tei",
        url=small_server.url,
        model="BAAI/bge-m3",
        dimension=DIM,
        batch_size=256,
        max_in_flight=4,
        request_timeout=30.0,
    )
    yield client
    await client.aclose()


def big_claim(db: Database) -> tuple[Claim, list[str]]:
    texts = [f"big set chunk {i}" for i in range(BIG)]
    with db.connection() as conn:
        model = helpers.model(conn, "BAAI/bge-m3", DIM)
        helpers.enqueue(conn, model.id)
        (claim,) = lifecycle.claim_jobs(conn, helpers.worker(conn), 1, 300)
        helpers.stage_chunked(conn, claim, texts)
    return claim, texts


def steps_for(db: Database, embedder: Embedder, tmp_path: Path) -> PipelineSteps:
    return PipelineSteps(
        db=db,
        store=AsyncObjectStore(open_store(tmp_path.as_uri()), trio.CapacityLimiter(2)),
        chunker=Chunker(ChunkingPolicy(max_size=1500, overlap=150)),
        embedder=embedder,
        max_document_bytes=1024 * 1024,
    )


def stored(db: Database, claim: Claim) -> list[tuple[str, list[float]]]:
    with db.connection() as conn:
        rows = conn.execute(
            """SELECT c.content, e.vector FROM embeddings e
               JOIN document_chunks c ON c.id = e.chunk_id
               WHERE e.document_version_id = %s ORDER BY c.chunk_index""",
            (claim.document_version_id,),
        ).fetchall()
    return [(row["content"], row["vector"].to_list()) for row in rows]


def served(db: Database, claim: Claim) -> list[dict[str, object]]:
    """The served_versions rows naming the claim's version (for any model)."""
    with db.connection() as conn:
        return conn.execute(
            """SELECT embedding_model_id, document_version_id FROM served_versions
               WHERE document_version_id = %s""",
            (claim.document_version_id,),
        ).fetchall()


def slices_recorded(db: Database, claim: Claim) -> dict[str, object] | None:
    """The vectors and slices the claim's attempt recorded."""
    with db.connection() as conn:
        return conn.execute(
            """SELECT embeddings, embedding_slices FROM trioindex_job_attempts
               WHERE id = %s""",
            (claim.attempt_id,),
        ).fetchone()


def assert_each_vector_on_its_chunk(db: Database, claim: Claim, texts: list[str]) -> None:
    rows = stored(db, claim)
    assert [content for content, _ in rows] == texts
    expected = np.array([fake_vector(t, DIM) for t in texts], dtype=np.float32)
    assert np.array_equal(np.array([v for _, v in rows], dtype=np.float32), expected)


async def test_a_big_set_is_stored_in_slices_the_last_completing_the_job_each_vector_on_its_chunk(
    db: Database, embedder: Embedder, tmp_path: Path
) -> None:
    claim, texts = big_claim(db)
    steps = steps_for(db, embedder, tmp_path)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(steps.serve)
        assert await steps.embed(claim) == BIG
        result = await steps.complete(claim)
        nursery.cancel_scope.cancel()
    assert result.became_current
    assert steps.store_embeddings.groups == 2  # one group per slice, in order
    assert slices_recorded(db, claim) == {"embeddings": SLICE_ROWS + 3, "embedding_slices": 2}
    assert_each_vector_on_its_chunk(db, claim, texts)
    with db.connection() as conn:
        job = helpers.job_row(conn, claim.job_id)
        assert (job["status"], job["chunk_count"]) == ("SUCCEEDED", BIG)
        assert helpers.events(conn, claim.job_id).count("JOB_SUCCEEDED") == 1
    assert served(db, claim) == [
        {
            "embedding_model_id": claim.embedding_model_id,
            "document_version_id": claim.document_version_id,
        }
    ]


async def test_a_big_set_whose_lease_was_lost_stores_nothing(
    db: Database, embedder: Embedder, tmp_path: Path
) -> None:
    claim, _ = big_claim(db)
    steps = steps_for(db, embedder, tmp_path)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(steps.serve)
        assert await steps.embed(claim) == BIG
        with db.connection() as conn:
            helpers.expire_lease(conn, claim.job_id)
        with pytest.raises(OwnershipLost):
            await steps.complete(claim)
        nursery.cancel_scope.cancel()
    assert stored(db, claim) == []
    assert served(db, claim) == []


async def test_a_partial_set_left_between_slices_is_never_served_and_the_next_attempt_clears_it(
    db: Database, embedder: Embedder, tmp_path: Path
) -> None:
    """The lease is lost after the first slice committed: the second is refused, the partial
    set stays unserved, and the next attempt deletes it and stores the whole set again."""
    claim, texts = big_claim(db)
    steps = steps_for(db, embedder, tmp_path)

    def then_lose_the_lease(
        conn: Connection, commits: Sequence[EmbeddingCommit]
    ) -> list[StoredSlice | Exception]:
        results = store_embeddings_many(conn, commits)
        if any(commit.offset == 0 for commit in commits):
            helpers.expire_lease(conn, claim.job_id)  # as if the worker paused past its lease
        return results

    steps.store_embeddings.write_group = then_lose_the_lease
    async with trio.open_nursery() as nursery:
        nursery.start_soon(steps.serve)
        assert await steps.embed(claim) == BIG
        with pytest.raises(OwnershipLost):
            await steps.complete(claim)
        nursery.cancel_scope.cancel()
    assert len(stored(db, claim)) == SLICE_ROWS  # the first slice only
    assert served(db, claim) == []
    with db.connection() as conn:
        assert helpers.job_row(conn, claim.job_id)["status"] == "PROCESSING"
        (recovered,) = lifecycle.recover_expired(conn, BackoffPolicy(0.0, 0.0, 0.0))
        assert recovered.job_id == claim.job_id
        (again,) = lifecycle.claim_jobs(conn, claim.worker_id, 1, 300)
    assert again.job_id == claim.job_id and again.chunks_ready
    steps = steps_for(db, embedder, tmp_path)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(steps.serve)
        assert await steps.embed(again) == BIG  # begin_embedding drops the partial set
        result = await steps.complete(again)
        nursery.cancel_scope.cancel()
    assert result.became_current
    assert_each_vector_on_its_chunk(db, claim, texts)
    with db.connection() as conn:
        job = helpers.job_row(conn, claim.job_id)
        assert (job["status"], job["chunk_count"]) == ("SUCCEEDED", BIG)
    assert len(served(db, claim)) == 1
