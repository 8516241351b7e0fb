"""Answering queries for an open index: :class:`QueryAnswerer` turns a batch of query texts
into document or chunk hits, or a :class:`~trioindex.search.QueryRefused` per query it cannot
answer (too long, too many terms, a vector that cannot be ranked: :mod:`trioindex.search.query`),
and owns how deep each ranking is asked for and the optional re-ranker.

The queries of a batch are embedded together (in the embedder's batches) and ranked
concurrently on the pool; hybrid runs the text rankings while the queries are embedded.
:class:`trioindex.Index` (:mod:`trioindex.api.index`) calls it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

import attrs
import psycopg
import trio

from trioindex.config import SearchSettings
from trioindex.db.models import EmbeddingModel, check_serving, serving_model
from trioindex.db.pool import Connection, Database
from trioindex.db.search import Collection
from trioindex.embedding import Embedder
from trioindex.search import (
    SEARCH_MODES,
    Bm25,
    ChunkHit,
    DocumentHit,
    Filters,
    HnswSettings,
    QueryRefused,
    RankedChunk,
    SearchMode,
    chunk_hits,
    document_hits,
    embed_queries,
    hybrid_fusion,
    prepare_query,
    terms_ranking,
    vector_ranking,
)
from trioindex.search.marking import Terms, mark_chunk_answers, mark_document_answers
from trioindex.search.query import filter_text
from trioindex.search.ranking import queries_terms_and_collection

if TYPE_CHECKING:
    from trioindex.search.rerank import Reranker

H = TypeVar("H")
#: One query's answer from a batch: its hits, or why it was refused.
Answer = list[H] | QueryRefused

#: Ranked chunks fetched per requested document (a document's chunks are grouped from them).
CANDIDATES_PER_DOCUMENT = 4
#: The least depth of each ranking that document search fuses, of a text or re-ranked chunk
#: search, and of per-document grouping.
MIN_CANDIDATES = 50
MAX_CANDIDATES = 1000
#: How deep hybrid's two rankings are per chunk asked for when chunks are searched without a
#: re-ranker: each text result probes its served row; on `just eval`'s known-item set the fused
#: top 10 was the same with text lists 30 and 50 deep, and a vector list 20 deep instead of 50
#: moved one query's hit (docs/test-results/search.md). The vector list is ranked from the
#: candidates of a list as deep as the chunks asked for (20 per chunk:
#: :mod:`trioindex.db.vector_index`), as vector search takes: on 100k chunks the fused top 10
#: was the same for 200 queries of 200, at the vector search's cost instead of twice its
#: candidates'.
HYBRID_VECTOR_DEPTH_PER_CHUNK = 2
HYBRID_TEXT_DEPTH_PER_CHUNK = 3


@attrs.define(eq=False)
class QueryAnswerer:
    """Answers batches of queries over ``db`` with ``model`` (the configured embedding model),
    embedding them with the embedder ``query_embedder`` opens (called only by a search that
    needs vectors) and, when configured, re-ordering hybrid answers with ``reranker``.

    Every method may be called from several tasks at once (database calls share the pool).
    """

    db: Database
    model: EmbeddingModel
    query_embedder: Callable[[], Awaitable[Embedder]]
    bm25: Bm25
    reranker: Reranker | None = None

    @classmethod
    def configured(
        cls,
        search: SearchSettings,
        db: Database,
        model: EmbeddingModel,
        query_embedder: Callable[[], Awaitable[Embedder]],
    ) -> QueryAnswerer:
        """The answerer ``search`` settings describe (BM25 parameters, the re-ranker)."""
        reranker = None
        if search.rerank_url:
            # the HTTP client it brings is imported only by those who rerank
            from trioindex.search.rerank import Reranker

            reranker = Reranker(
                search.rerank_url, top_n=search.rerank_top_n, timeout=search.rerank_timeout
            )
        return cls(db, model, query_embedder, Bm25(search.bm25_k1, search.bm25_b), reranker)

    async def documents(
        self,
        queries: Sequence[str],
        *,
        top_k: int,
        mode: SearchMode,
        key_prefix: str | None,
        content_types: Sequence[str],
        low_confidence: bool | None,
        chunks_per_document: int,
        hnsw: HnswSettings,
    ) -> list[Answer[DocumentHit]]:
        """The ``top_k`` best documents per query, each with its best ``chunks_per_document``
        chunks, or the query's refusal, in the queries' order."""
        if top_k < 1 or chunks_per_document < 1:
            raise ValueError("top_k and chunks_per_document must be at least 1")
        depth = max(MIN_CANDIDATES, top_k * chunks_per_document * CANDIDATES_PER_DOCUMENT)
        filters = _filters(key_prefix, content_types, low_confidence)
        ranked, terms = await self._rank_many(
            queries, min(depth, MAX_CANDIDATES), mode, filters, hnsw
        )
        grouped = [
            r if isinstance(r, QueryRefused) else document_hits(r, top_k, chunks_per_document)
            for r in ranked
        ]
        return await _marked(self.db, mark_document_answers, terms, grouped)

    async def chunks(
        self,
        queries: Sequence[str],
        *,
        top_k: int,
        mode: SearchMode,
        key_prefix: str | None,
        content_types: Sequence[str],
        low_confidence: bool | None,
        hnsw: HnswSettings,
    ) -> list[Answer[ChunkHit]]:
        """The ``top_k`` best chunks per query, however many come from one document, or the
        query's refusal, in the queries' order."""
        if top_k < 1:
            raise ValueError("top_k must be at least 1")
        if mode == "hybrid" and self.reranker is None:
            # a re-ranker re-orders the fused list's first top_n: it keeps both lists deep
            depth, vector_depth = (
                HYBRID_TEXT_DEPTH_PER_CHUNK * top_k,
                HYBRID_VECTOR_DEPTH_PER_CHUNK * top_k,
            )
        else:
            depth = vector_depth = top_k if mode == "vector" else max(top_k, MIN_CANDIDATES)
        filters = _filters(key_prefix, content_types, low_confidence)
        ranked, terms = await self._rank_many(
            queries,
            min(depth, MAX_CANDIDATES),
            mode,
            filters,
            hnsw,
            vector_depth=min(vector_depth, depth, MAX_CANDIDATES),
            vector_candidates_for=top_k if vector_depth > top_k else None,
        )
        return await _marked(
            self.db,
            mark_chunk_answers,
            terms,
            [r if isinstance(r, QueryRefused) else chunk_hits(r, top_k) for r in ranked],
        )

    async def _rank_many(
        self,
        queries: Sequence[str],
        depth: int,
        mode: SearchMode,
        filters: Filters,
        hnsw: HnswSettings,
        *,
        vector_depth: int | None = None,
        vector_candidates_for: int | None = None,
    ) -> tuple[list[Answer[RankedChunk]], list[Terms]]:
        """The ``depth`` best chunks per query in ``mode``, or why that query was refused;
        hybrid fuses both rankings, the text one ``depth`` deep and the vector one
        ``vector_depth`` deep (``depth`` when None), from the candidates of a vector list
        ``vector_candidates_for`` deep (its own depth when None). And each query's text terms
        (:func:`~trioindex.search.ranking.queries_terms`), read once for the batch on the
        connection that checks the serving model: the text ranking's, and what the hits are
        marked with."""
        if mode not in SEARCH_MODES:
            raise ValueError(f"unknown search mode {mode!r}")
        db = self.db
        model, terms, collection = await db.run(self._model_and_terms, mode, queries)
        texts = [_prepared(q) for q in queries]
        prepared = [(i, t) for i, t in enumerate(texts) if isinstance(t, str)]
        by_text: list[Answer[RankedChunk]] = [[] for _ in queries]
        by_vector: list[Answer[RankedChunk]] = [[] for _ in queries]

        async def rank_text(i: int, text_terms: Terms) -> None:
            if isinstance(text_terms, QueryRefused):
                by_text[i] = text_terms
                return
            by_text[i] = await _answer(
                db.run(
                    terms_ranking,
                    model,
                    text_terms,
                    depth,
                    filters=filters,
                    bm25=self.bm25,
                    collection=collection,
                )
            )

        async def rank_vector(i: int, vector: list[float]) -> None:
            by_vector[i] = await _answer(
                db.run(
                    vector_ranking,
                    model,
                    vector,
                    depth if vector_depth is None else vector_depth,
                    filters=filters,
                    hnsw=hnsw,
                    candidates_for=vector_candidates_for,
                )
            )

        async def embed_then_rank(nursery: trio.Nursery) -> None:
            embedder = await self.query_embedder()
            vectors = await embed_queries(embedder, model, [t for _, t in prepared])
            for (i, _), vector in zip(prepared, vectors, strict=True):
                if isinstance(vector, QueryRefused):
                    by_vector[i] = vector
                else:
                    nursery.start_soon(rank_vector, i, vector)

        # hybrid: the text rankings run while the queries are embedded and ranked by vector
        async with trio.open_nursery() as nursery:
            if mode != "vector":
                for i, _ in prepared:
                    nursery.start_soon(rank_text, i, terms[i])
            if mode != "text" and prepared:
                nursery.start_soon(embed_then_rank, nursery)
        answers: list[Answer[RankedChunk]] = []
        for text, by_vec, by_txt in zip(texts, by_vector, by_text, strict=True):
            if isinstance(text, QueryRefused):
                answers.append(text)
            elif isinstance(by_vec, QueryRefused):
                answers.append(by_vec)
            elif isinstance(by_txt, QueryRefused):
                answers.append(by_txt)
            elif mode == "hybrid":
                answers.append(hybrid_fusion(by_vec, by_txt)[:depth])
            else:
                answers.append(by_txt if mode == "text" else by_vec)
        if mode == "hybrid" and self.reranker is not None:
            await self._rerank(queries, answers, self.reranker)
        return answers, terms

    def _model_and_terms(
        self, conn: Connection, mode: SearchMode, queries: Sequence[str]
    ) -> tuple[EmbeddingModel, list[Terms], Collection | None]:
        """The model to rank with, each query's terms and, for a text ranking, the model's
        collection (read with the terms), on one connection."""
        if mode == "text":
            model = serving_model(conn) or self.model
        else:
            # the query is embedded with the configured model: it must be the serving one
            model = check_serving(conn, self.model)
        terms, collection = _queries_terms(conn, queries, None if mode == "vector" else model)
        return model, terms, collection

    async def _rerank(
        self, queries: Sequence[str], answers: list[Answer[RankedChunk]], reranker: Reranker
    ) -> None:
        """Each answered query's fused chunks re-ordered by the re-ranker, concurrently."""

        async def rerank(i: int, fused: list[RankedChunk]) -> None:
            answers[i] = await reranker.rerank(queries[i], fused)

        async with trio.open_nursery() as nursery:
            for i, answer in enumerate(answers):
                if not isinstance(answer, QueryRefused):
                    nursery.start_soon(rerank, i, answer)

    async def aclose(self) -> None:
        if self.reranker is not None:
            await self.reranker.aclose()


def raise_refused(answer: Answer[H]) -> list[H]:
    """``answer``'s hits, or its refusal raised."""
    if isinstance(answer, QueryRefused):
        raise answer
    return answer


def _queries_terms(
    conn: Connection, queries: Sequence[str], model: EmbeddingModel | None
) -> tuple[list[Terms], Collection | None]:
    """Each query's terms and ``model``'s collection
    (:func:`~trioindex.search.ranking.queries_terms_and_collection`, one statement); when the
    database refuses that statement for its input, each query's terms asked alone, so that only
    the query at fault is refused (the rankings then read the collection themselves)."""
    try:
        terms, collection = queries_terms_and_collection(conn, queries, model)
        return list(terms), collection
    except psycopg.Error as exc:
        refused = QueryRefused.for_database(exc)
        if refused is None:
            raise
        if len(queries) == 1:
            return [refused], None
        return [t for query in queries for t in _queries_terms(conn, [query], None)[0]], None


async def _marked(
    db: Database,
    mark: Callable[[Connection, Sequence[tuple[Terms, Sequence[H]]]], list[list[H]]],
    terms: Sequence[Terms],
    answers: Sequence[Answer[H]],
) -> list[Answer[H]]:
    """``answers`` with their hits marked by ``mark`` in one call, refusals in place."""
    hits = [(t, a) for t, a in zip(terms, answers, strict=True) if not isinstance(a, QueryRefused)]
    marked = iter(await db.run(mark, hits) if any(a for _, a in hits) else [a for _, a in hits])
    return [a if isinstance(a, QueryRefused) else next(marked) for a in answers]


def _prepared(query: str) -> str | QueryRefused:
    try:
        return prepare_query(query)
    except QueryRefused as refused:
        return refused


async def _answer(ranking: Awaitable[list[RankedChunk]]) -> Answer[RankedChunk]:
    """One query's ranking, or its refusal: the query's own input refused by the ranking (too
    many terms) or by the database (a value or size its SQL cannot take). A lost connection is
    not this query's fault and fails the whole call."""
    try:
        return await ranking
    except QueryRefused as refused:
        return refused
    except psycopg.Error as exc:
        by_database = QueryRefused.for_database(exc)
        if by_database is None:
            raise
        return by_database


def _filters(
    key_prefix: str | None, content_types: Sequence[str], low_confidence: bool | None = None
) -> Filters:
    """The filters of a search, each value checked (:func:`filter_text`)."""
    return Filters(
        filter_text(key_prefix, "key_prefix") if key_prefix else None,
        tuple(filter_text(t, "content_types") for t in content_types),
        low_confidence,
    )
