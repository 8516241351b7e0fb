"""Query side: rank the chunks of the versions the serving model serves, group them by document.

* :mod:`.ranking` — the rankings (vector, text, hybrid by reciprocal rank fusion), their queries
  and filters (key prefix, content type) being :mod:`trioindex.db.search`'s;
* :mod:`.results` — chunk hits, document hits and their JSON shapes;
* :mod:`.query` — a query text cleaned, normalised and bounded, or refused (:class:`QueryRefused`);
* :mod:`.answers` — a batch of queries answered: how deep each ranking goes, the re-ranker;
* here — :func:`embed_queries`, the one way a query text becomes a vector.

Applications use :class:`trioindex.Index` (:mod:`trioindex.api.index`), which ties these to an
open database and embedder; the ``search`` command is a thin layer over it.
"""

from __future__ import annotations

from collections.abc import Sequence

import trio

from trioindex.db.models import EmbeddingModel
from trioindex.db.search import (
    DEFAULT_BM25,
    DEFAULT_HNSW,
    NO_FILTERS,
    Bm25,
    Filters,
    HnswSettings,
    TextTerm,
)
from trioindex.embedding import Embedder
from trioindex.errors import ResultInvalid
from trioindex.search.query import (
    MAX_QUERY_CHARS,
    MAX_QUERY_TERMS,
    QUERY_INVALID,
    QueryRefused,
    check_terms,
    prepare_query,
)
from trioindex.search.ranking import (
    DEFAULT_MODE,
    HYBRID_K,
    HYBRID_TEXT_WEIGHT,
    RRF_K,
    SEARCH_MODES,
    SearchMode,
    fuse,
    hangul_terms,
    hybrid_fusion,
    hybrid_ranking,
    queries_terms,
    query_terms,
    terms_ranking,
    text_ranking,
    vector_ranking,
)
from trioindex.search.results import (
    ChunkHit,
    DocumentHit,
    RankedChunk,
    SearchHit,
    chunk_hits,
    document_hits,
    json_text,
    ranked_chunks,
    snippet,
)

__all__ = [
    "DEFAULT_BM25",
    "DEFAULT_HNSW",
    "DEFAULT_MODE",
    "HYBRID_K",
    "HYBRID_TEXT_WEIGHT",
    "MAX_QUERY_CHARS",
    "MAX_QUERY_TERMS",
    "NO_FILTERS",
    "QUERY_INVALID",
    "RRF_K",
    "SEARCH_MODES",
    "Bm25",
    "ChunkHit",
    "DocumentHit",
    "Filters",
    "HnswSettings",
    "QueryRefused",
    "RankedChunk",
    "SearchHit",
    "SearchMode",
    "TextTerm",
    "check_terms",
    "chunk_hits",
    "document_hits",
    "embed_queries",
    "fuse",
    "hangul_terms",
    "hybrid_fusion",
    "hybrid_ranking",
    "json_text",
    "prepare_query",
    "queries_terms",
    "query_terms",
    "ranked_chunks",
    "snippet",
    "terms_ranking",
    "text_ranking",
    "vector_ranking",
]


async def embed_queries(
    embedder: Embedder, model: EmbeddingModel, texts: Sequence[str]
) -> list[list[float] | QueryRefused]:
    """One validated vector per query text, in order (the embedder batches them), or a
    :class:`QueryRefused` in the place of a query whose answer was refused (a zero vector, an
    input the server rejects): when a batch is refused, each of its texts is embedded alone so
    that one query's answer does not cost the others theirs. An embedder that cannot be
    reached still fails the whole call."""
    if not texts:
        return []
    try:
        return list(await _embed_checked(embedder, model, texts))
    except ResultInvalid as exc:
        if len(texts) == 1:
            return [QueryRefused.for_vector(exc)]
    alone: list[list[float] | QueryRefused] = [[] for _ in texts]

    async def embed_alone(i: int) -> None:
        try:
            (alone[i],) = await _embed_checked(embedder, model, [texts[i]])
        except ResultInvalid as exc:
            alone[i] = QueryRefused.for_vector(exc)

    async with trio.open_nursery() as nursery:  # the embedder's in-flight cap bounds them
        for i in range(len(texts)):
            nursery.start_soon(embed_alone, i)
    return alone


async def _embed_checked(
    embedder: Embedder, model: EmbeddingModel, texts: Sequence[str]
) -> list[list[float]]:
    """Each text's vector as the floats a ranking binds; the embedder checked each value and
    norm when it made them (:class:`~trioindex.embedding.vectors.Vectors`), the count and the
    dimension (the serving model's) are checked here."""
    vectors = await embedder.embed(list(texts))
    if len(vectors) != len(texts):
        raise ResultInvalid(
            f"embedding response has {len(vectors)} vectors for {len(texts)} inputs"
        )
    if vectors.dimension != model.dimension:
        raise ResultInvalid(
            f"embedding has dimension {vectors.dimension}, expected {model.dimension}"
        )
    return vectors.tolist()
