"""Query side: rank the chunks of current versions, group them by document.

* :mod:`.ranking` — the ranking queries (vector, text, hybrid by reciprocal rank fusion) and
  the filters (key prefix, content type);
* :mod:`.results` — chunk hits, document hits and their JSON shapes;
* here — :func:`embed_queries`, the one way a query text becomes a vector.

Applications use :class:`trioindex.Index` (:mod:`trioindex.api`), which ties these to an open
database and embedder; the ``search`` command is a thin layer over it.
"""

from __future__ import annotations

from collections.abc import Sequence

from trioindex.db.models import EmbeddingModel
from trioindex.embedding import Embedder
from trioindex.embedding.vectors import validate_vectors
from trioindex.search.ranking import (
    DEFAULT_HNSW,
    DEFAULT_MODE,
    NO_FILTERS,
    RRF_K,
    SEARCH_MODES,
    Filters,
    HnswSettings,
    SearchMode,
    fuse,
    hangul_terms,
    hybrid_ranking,
    match_tiers,
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
    snippet,
)

__all__ = [
    "DEFAULT_HNSW",
    "DEFAULT_MODE",
    "NO_FILTERS",
    "RRF_K",
    "SEARCH_MODES",
    "ChunkHit",
    "DocumentHit",
    "Filters",
    "HnswSettings",
    "RankedChunk",
    "SearchHit",
    "SearchMode",
    "chunk_hits",
    "document_hits",
    "embed_queries",
    "fuse",
    "hangul_terms",
    "hybrid_ranking",
    "match_tiers",
    "snippet",
    "text_ranking",
    "vector_ranking",
]


async def embed_queries(
    embedder: Embedder, model: EmbeddingModel, texts: Sequence[str]
) -> list[list[float]]:
    """One validated vector per query text, in order (the embedder batches them)."""
    if not texts:
        return []
    vectors = await embedder.embed(list(texts))
    return validate_vectors(vectors, expected_count=len(texts), dimension=model.dimension)
