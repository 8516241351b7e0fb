"""Ranking: chunks of the versions the serving model serves, ranked by vector similarity, by
full-text match, or by both fused with reciprocal rank fusion (RRF). The queries themselves
are :mod:`trioindex.db.search`'s; here is what they are asked (the query's terms and tiers)
and how their rankings are fused.

* **vector**: cosine similarity ``1 - (vector <=> query)`` over the model's own partial HNSW
  index (``vector::vector(dim)``), with pgvector's iterative scan (``strict_order``) so that
  the filters (served version, key prefix, content type) still fill the list.
* **text**: BM25 over ``document_chunks.search_vector`` (``simple`` ⊕ ``english`` lexemes, GIN
  index) for the query's terms: its English lexemes (stemmed, stop words dropped) and its
  Hangul words as prefixes (``서울:*`` matches ``서울은``, ``서울입니다``: Korean attaches
  particles to the word) — see :func:`hangul_terms`. A chunk scores
  ``Σ idf · tf·(k1 + 1) / (tf + k1·(1 - b + b·len / avglen))`` over the terms it holds
  (``trioindex_bm25``, Lucene's form; :class:`Bm25`: k1 = 1.2, b = 0.75 by default): tf is
  the term's positions in the chunk's vector (a prefix term: of every lexeme it starts), len
  the chunk's length in characters, and N, the average length and each term's document
  frequency count the chunks the model serves (``served_text_statistics``, the GIN index;
  ANALYZE's estimate for a term it lists as common).
  Candidates come by tiers — chunks matching every term, then every term but one, ... down to
  any term (:func:`match_tiers`) — a tier read only while the list is short, so BM25 scores a
  few hundred matches, not every chunk sharing one common word with the query (scoring every
  OR match cost ~10x more at 100k chunks; docs/test-results/search.md); the candidates are
  then ordered by BM25 alone. The text is prepared and its terms bounded by
  :mod:`trioindex.search.query`.
* **hybrid**: both lists (each as deep as the requested candidates), fused by
  ``score = 1 / (HYBRID_K + vector rank) + HYBRID_TEXT_WEIGHT / (HYBRID_K + text rank)``
  (:func:`hybrid_fusion`: k = 10, text weight 1.5, tuned on `just eval`'s two sets).
  :func:`hybrid_ranking` runs both on one connection; :class:`trioindex.Index` runs them
  concurrently and calls :func:`hybrid_fusion` itself.

Only chunks of the version the ranking model serves for each document (``served_versions``)
are ranked, and of that version only the model's own chunk set (a version may hold one set per
chunking): every served version has the model's full vector set on it, so the three modes
search the same chunks.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Sequence
from typing import Any, Literal, get_args

import attrs

from trioindex.db import search as db_search
from trioindex.db.models import EmbeddingModel
from trioindex.db.pool import Connection
from trioindex.db.search import (
    DEFAULT_BM25,
    DEFAULT_HNSW,
    NO_FILTERS,
    Bm25,
    Filters,
    HnswSettings,
    TextTerm,
)
from trioindex.search.query import check_terms, prepare_query
from trioindex.search.results import RankedChunk, ranked_chunks

SearchMode = Literal["vector", "text", "hybrid"]
SEARCH_MODES: tuple[SearchMode, ...] = get_args(SearchMode)
DEFAULT_MODE: SearchMode = "hybrid"
#: The constant of reciprocal rank fusion (Cormack et al. 2009): large enough that the first
#: few ranks of one list do not drown the other list.
RRF_K = 60
#: Hybrid's fusion: RRF's k and the text ranking's weight (the vector ranking's is 1), tuned on
#: `just eval`'s two labelled sets (docs/test-results/search.md).
HYBRID_K = 10
HYBRID_TEXT_WEIGHT = 1.5


def vector_ranking(
    conn: Connection,
    model: EmbeddingModel,
    vector: Sequence[float],
    limit: int,
    *,
    filters: Filters = NO_FILTERS,
    hnsw: HnswSettings = DEFAULT_HNSW,
) -> list[RankedChunk]:
    """The ``limit`` chunks closest to ``vector`` (cosine), best first."""
    return ranked_chunks(
        db_search.nearest_chunks(conn, model, vector, limit, filters=filters, hnsw=hnsw)
    )


def text_ranking(
    conn: Connection,
    model: EmbeddingModel,
    text: str,
    limit: int,
    *,
    filters: Filters = NO_FILTERS,
    bm25: Bm25 = DEFAULT_BM25,
) -> list[RankedChunk]:
    """The ``limit`` chunks of the versions ``model`` serves, in its chunk sets (the chunks it
    has vectors for: a version may hold one set per chunking), that best match ``text`` by BM25,
    best first. Candidates come by tiers (chunks matching all the query's terms, then all but
    one, ...: :func:`match_tiers`), each tier's best by ``ts_rank`` read only while the ones
    before it leave the list short; the list is then ordered by BM25 alone. ``text`` goes through
    :func:`prepare_query` and its terms through :func:`check_terms`: either may raise
    :class:`~trioindex.search.query.QueryRefused`."""
    terms = query_terms(conn, text)
    if not terms:
        return []
    tiers = match_tiers([t.query for t in terms])
    return ranked_chunks(
        db_search.matching_chunks(conn, model, terms, tiers, limit, filters=filters, bm25=bm25)
    )


def query_terms(conn: Connection, text: str) -> list[TextTerm]:
    """``text``'s search terms, prepared and bounded: its English lexemes (stemmed, stop words
    dropped), then its Hangul words as prefixes (:func:`hangul_terms`)."""
    text = prepare_query(text)
    english = [
        TextTerm(_quoted(lexeme), lexeme)
        for lexeme in db_search.english_lexemes(conn, text)
        # Hangul words are hangul_terms' (as prefixes): counted once, not twice, in a tier
        if not _HANGUL_WORD.search(lexeme)
    ]
    terms = english + [
        TextTerm(operand, stem or word, prefix=True) for word, stem, operand in _hangul_words(text)
    ]
    check_terms([t.query for t in terms])
    return terms


#: The most AND-clauses one tier may OR (``C(terms, k)``); past it the next tier is "any term".
MAX_TIER_CLAUSES = 64
#: The longest tier, in bytes of ``tsquery`` text; past it the next tier is "any term".
#: PostgreSQL refuses a ``tsquery`` whose operands add up to 1 MB ("value is too big").
MAX_TIER_BYTES = 256 * 1024


def match_tiers(terms: Sequence[str]) -> list[str]:
    """``tsquery`` texts, one per tier: "all ``terms``", "all but one", ... down to "any term",
    each OR-ing the AND of every ``k``-subset. Tiers whose subsets exceed
    :data:`MAX_TIER_CLAUSES` or whose text exceeds :data:`MAX_TIER_BYTES` are skipped (a long
    query goes from its last affordable tier straight to "any term"). A term is a ``tsquery``
    operand, possibly itself an OR group."""
    tiers = []
    for k in range(len(terms), 1, -1):
        if math.comb(len(terms), k) > MAX_TIER_CLAUSES:
            break
        tier = " | ".join(
            "(" + " & ".join(subset) + ")" for subset in itertools.combinations(terms, k)
        )
        if len(tier.encode()) > MAX_TIER_BYTES:
            break
        tiers.append(tier)
    tiers.append(" | ".join(terms))
    return tiers


def _quoted(lexeme: str) -> str:
    # tsquery syntax: a quoted operand doubles its quotes and escapes its backslashes
    return "'" + lexeme.replace("\\", "\\\\").replace("'", "''") + "'"


def hybrid_ranking(
    conn: Connection,
    model: EmbeddingModel,
    text: str,
    vector: Sequence[float],
    limit: int,
    *,
    filters: Filters = NO_FILTERS,
    hnsw: HnswSettings = DEFAULT_HNSW,
    bm25: Bm25 = DEFAULT_BM25,
) -> list[RankedChunk]:
    """Vector and text rankings, ``limit`` deep each, fused by RRF; the ``limit`` best."""
    by_vector = vector_ranking(conn, model, vector, limit, filters=filters, hnsw=hnsw)
    by_text = text_ranking(conn, model, text, limit, filters=filters, bm25=bm25)
    return hybrid_fusion(by_vector, by_text)[:limit]


def hybrid_fusion(
    by_vector: Sequence[RankedChunk], by_text: Sequence[RankedChunk]
) -> list[RankedChunk]:
    """What hybrid search returns: the two rankings fused by :func:`fuse` with
    :data:`HYBRID_K` and the text ranking weighted :data:`HYBRID_TEXT_WEIGHT`."""
    return fuse([by_vector, by_text], k=HYBRID_K, weights=(1.0, HYBRID_TEXT_WEIGHT))


def fuse(
    rankings: Sequence[Sequence[RankedChunk]],
    *,
    k: int = RRF_K,
    weights: Sequence[float] | None = None,
) -> list[RankedChunk]:
    """Weighted reciprocal rank fusion: each chunk scores ``Σ weight / (k + rank)`` over the
    rankings it is in (every weight 1 unless given); best first (ties: the order of first
    appearance)."""
    weights = [1.0] * len(rankings) if weights is None else weights
    scores: dict[Any, float] = {}
    first: dict[Any, RankedChunk] = {}
    for ranking, weight in zip(rankings, weights, strict=True):
        for rank, chunk in enumerate(ranking, start=1):
            scores[chunk.chunk_id] = scores.get(chunk.chunk_id, 0.0) + weight / (k + rank)
            first.setdefault(chunk.chunk_id, chunk)
    order = sorted(first, key=lambda cid: -scores[cid])
    return [attrs.evolve(first[cid], score=scores[cid]) for cid in order]


# -- Korean -------------------------------------------------------------------------------------

_HANGUL_WORD = re.compile(r"[\uac00-\ud7a3]+")
# PostgreSQL's longest word, in UTF-8 bytes (MAXSTRLEN): to_tsvector drops longer words, so no
# chunk holds one, and a tsquery refuses them. A Hangul syllable is 3 bytes.
_MAX_WORD_BYTES = 2047
# Particles and endings Korean attaches to a word, longest first: a query word is also searched
# without them ("서울에서" → "서울:*"), as long as two syllables stay.
_PARTICLES = sorted(
    ("은", "는", "이", "가", "을", "를", "의", "에", "도", "로", "와", "과", "만", "에서",
     "으로", "에게", "까지", "부터", "처럼", "보다", "하고", "이다", "입니다", "합니다",
     "하는", "한다", "했다", "된다", "되는"),
    key=len,
    reverse=True,
)  # fmt: skip


def hangul_terms(text: str) -> list[str]:
    """One ``tsquery`` operand per distinct Hangul word of ``text``: the word as a prefix,
    OR-ed with the word without a trailing particle when two syllables stay. A word longer than
    PostgreSQL's longest word matches nothing and is left out."""
    return [operand for _, _, operand in _hangul_words(text)]


def _hangul_words(text: str) -> list[tuple[str, str | None, str]]:
    """``(word, stem or None, tsquery operand)`` per distinct operand (:func:`hangul_terms`)."""
    found: list[tuple[str, str | None, str]] = []
    for word in _HANGUL_WORD.findall(text):
        if 3 * len(word) > _MAX_WORD_BYTES:
            continue
        stem = _without_particle(word)
        operand = f"('{word}':* | '{stem}':*)" if stem else f"'{word}':*"
        if all(operand != seen for _, _, seen in found):
            found.append((word, stem, operand))
    return found


def _without_particle(word: str) -> str | None:
    for particle in _PARTICLES:
        if word.endswith(particle) and len(word) - len(particle) >= 2:
            return word[: -len(particle)]
    return None
