"""``search.rerank-url`` through :class:`trioindex.Index`: hybrid searches are re-ordered by the
re-ranker (testkit's fake TEI ``/rerank``), vector and text searches are not, and a re-ranker
that does not answer leaves the fused order."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import trioindex
from testkit.embed_server import FakeEmbedServer, fake_vector
from testkit.rerank_server import FakeRerankServer
from testkit.search_corpus import IndexedDocument, store_indexed
from trioindex.config import load_settings
from trioindex.db.models import ensure_model
from trioindex.db.pool import Database
from trioindex.search import HYBRID_K, HYBRID_TEXT_WEIGHT

MODEL, DIM = "test/rerank-8", 8
DOCUMENTS = {
    "a.txt": ["lease"],
    "b.txt": ["lease renewal by workers"],
    "c.txt": ["the renewal"],
}


@pytest.fixture
def servers() -> Iterator[tuple[FakeEmbedServer, FakeRerankServer]]:
    with FakeEmbedServer(dimension=DIM) as embed, FakeRerankServer() as rerank:
        yield embed, rerank


def settings_for(
    database_url: str, db: Database, servers: tuple[FakeEmbedServer, FakeRerankServer], home: Path
) -> trioindex.config.Settings:
    embed, rerank = servers
    with db.connection() as conn:
        store_indexed(
            conn,
            ensure_model(conn, MODEL, DIM),
            [IndexedDocument(k, t, [fake_vector(x, DIM) for x in t]) for k, t in DOCUMENTS.items()],
        )
    env = {
        "TRIOINDEX_DATABASE_URL": database_url,
        "TRIOINDEX_HOME": str(home),
        "TRIOINDEX_EMBEDDING_API": "tei",
        "TRIOINDEX_EMBEDDING_URL": embed.url,
        "TRIOINDEX_EMBEDDING_MODEL": MODEL,
        "TRIOINDEX_EMBEDDING_DIMENSION": str(DIM),
        "TRIOINDEX_SEARCH_RERANK_URL": rerank.url,
        "TRIOINDEX_SEARCH_RERANK_TIMEOUT": "60s",
    }
    return load_settings(environ=env, cwd=home)


@pytest.fixture
def reranking(
    database_url: str,
    db: Database,
    servers: tuple[FakeEmbedServer, FakeRerankServer],
    tmp_path: Path,
) -> tuple[trioindex.config.Settings, FakeRerankServer]:
    """The settings of an index with the documents above and a re-ranker, and the re-ranker."""
    return settings_for(database_url, db, servers, tmp_path), servers[1]


async def test_hybrid_is_reranked_and_the_other_modes_are_not(
    reranking: tuple[trioindex.config.Settings, FakeRerankServer],
) -> None:
    settings, rerank = reranking
    async with trioindex.Index.open(settings) as index:
        # the fake re-ranker scores the share of the query's words a chunk holds
        hits = await index.search("renewal by workers lease", top_k=3)
        assert [h.document_key for h in hits][:1] == ["b.txt"]
        assert hits[0].score == pytest.approx(1.0)  # every word, not in the query's order
        assert len(rerank.requests) == 1
        await index.search("renewal by workers lease", mode="text")
        await index.search("renewal by workers lease", mode="vector")
        assert len(rerank.requests) == 1
        rerank.set_mode("status_503")
        fused = await index.search("renewal by workers lease", top_k=3)
        # the fused sum, not a re-ranker score
        assert fused[0].score <= (1 + HYBRID_TEXT_WEIGHT) / (HYBRID_K + 1)


async def test_a_reranked_chunk_search_gives_the_reranker_its_top_n_chunks(
    db: Database, reranking: tuple[trioindex.config.Settings, FakeRerankServer]
) -> None:
    # without a re-ranker a chunk search fuses lists a few times top_k deep; with one, the
    # fused list still holds the re-ranker's top_n (20) chunks when that many match
    settings, rerank = reranking
    texts = [f"lease number {i}" for i in range(30)]
    with db.connection() as conn:
        store_indexed(
            conn,
            ensure_model(conn, MODEL, DIM),
            [
                IndexedDocument(f"many/{i:02}", [t], [fake_vector(t, DIM)])
                for i, t in enumerate(texts)
            ],
        )
    async with trioindex.Index.open(settings) as index:
        hits = await index.search_chunks("lease", top_k=2)
    assert len(hits) == 2
    assert rerank.requests == [20]
