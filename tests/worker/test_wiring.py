"""The worker's pipeline steps (worker/wiring.py PipelineSteps) on real PostgreSQL + pgvector and
the fake HTTP embedding server: a set too big for a group goes by its own COPY, all or nothing,
with every vector on its own chunk, although the step drops the chunk texts as it embeds."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import numpy as np
import pytest
import trio

from testkit.embed_server import FakeEmbedServer, fake_vector
from tests import helpers
from trioindex.db import jobs as lifecycle
from trioindex.db.pool import Database
from trioindex.embedding import Embedder, open_embedder
from trioindex.errors import OwnershipLost
from trioindex.pipeline.chunking import Chunker, ChunkingPolicy
from trioindex.storage import AsyncObjectStore, open_store
from trioindex.values import Claim
from trioindex.worker.wiring import GROUP_MAX_ROWS, PipelineSteps

DIM = 8
BIG = GROUP_MAX_ROWS + 3


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


async def test_a_big_set_is_stored_once_by_its_own_copy_each_vector_on_its_chunk(
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
    assert steps.store_embeddings.groups == 0  # not through a group's arrays
    rows = stored(db, claim)
    assert [content for content, _ in rows] == texts
    expected = np.array([fake_vector(t, DIM) for t in texts], dtype=np.float32)
    assert np.array_equal(np.array([v for _, v in rows], dtype=np.float32), expected)
    with db.connection() as conn:
        assert helpers.job_row(conn, claim.job_id)["status"] == "SUCCEEDED"
        assert helpers.events(conn, claim.job_id).count("EMBEDDINGS_STORED") == 1


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
