"""Ranking: chunks of the versions the serving model serves, ranked by vector similarity, by
full-text match, or by both fused with reciprocal rank fusion (RRF). The queries themselves
are :mod:`trioindex.db.search`'s; here is what they are asked (the query's terms, BM25's candidates)
and how their rankings are fused.

* **vector**: cosine similarity ``1 - (vector <=> query)`` over the model's own partial HNSW
  index (``vector::vector(dim)``), with pgvector's iterative scan (``strict_order``) so that
  the filters (served version, key prefix, content type) still fill the list.
* **text**: BM25 over ``document_chunks.search_vector`` (``english`` lexemes, GIN index) for
  the query's terms: its English lexemes (stemmed, stop words dropped) and its Hangul words
  as prefixes (``서울:*`` matches ``서울은``, ``서울입니다``: Korean attaches
  particles to the word) — see :func:`hangul_terms`. A chunk scores
  ``Σ idf · tf·(k1 + 1) / (tf + k1·(1 - b + b·len / avglen))`` over the terms it holds
  (Lucene's form; :class:`Bm25`: k1 = 1.2, b = 0.75 by default): tf is
  the term's positions in the chunk's vector (a prefix term: of every lexeme it starts), len
  the chunk's length in characters, and N, the average length and each term's document
  frequency count the chunks the model serves (:mod:`trioindex.search.statistics`).
  BM25 picks its own candidates, rarest terms first (:func:`candidate_branches`): every chunk
  holding a rare term, every chunk holding three common ones, chunks holding two of them
  (the rarest pairs first, a budget per result), and one common term only to fill a short
  list; :func:`bm25_scores` scores them all and the best served ones are kept. When every
  term is rare that is exact BM25 over every matching chunk. The text is prepared and its terms
  bounded by :mod:`trioindex.search.query`.
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
    CandidateBranch,
    Collection,
    Filters,
    HnswSettings,
    TextTerm,
)
from trioindex.search.query import QueryRefused, check_terms, prepare_query
from trioindex.search.results import RankedChunk, ranked_chunks
from trioindex.search.statistics import TermStatistics, term_statistics

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
    candidates_for: int | None = None,
) -> list[RankedChunk]:
    """The ``limit`` chunks closest to ``vector`` (cosine), best first; through the index,
    from the candidates of a list ``candidates_for`` deep (``limit`` when None)."""
    return ranked_chunks(
        db_search.nearest_chunks(
            conn, model, vector, limit, filters=filters, hnsw=hnsw, candidates_for=candidates_for
        )
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
    has vectors for: a version may hold one set per chunking), that best match ``text`` by BM25
    (:func:`terms_ranking` of its :func:`query_terms`), best first. ``text`` goes through
    :func:`prepare_query` and its terms through :func:`check_terms`: either may raise
    :class:`~trioindex.search.query.QueryRefused`."""
    return terms_ranking(conn, model, query_terms(conn, text), limit, filters=filters, bm25=bm25)


def terms_ranking(
    conn: Connection,
    model: EmbeddingModel,
    terms: Sequence[TextTerm],
    limit: int,
    *,
    filters: Filters = NO_FILTERS,
    bm25: Bm25 = DEFAULT_BM25,
    collection: Collection | None = None,
) -> list[RankedChunk]:
    """The ``limit`` chunks of the versions ``model`` serves, in its chunk sets, that best match
    a query's ``terms`` (:func:`queries_terms`) by BM25 (:func:`bm25_scores`), best first,
    chosen from :func:`candidate_branches`' candidates; scored in ``collection`` when given
    (:func:`queries_terms_and_collection`), else in the collection read now."""
    if not terms:
        return []
    statistics = term_statistics(conn, model, terms, collection)
    branches, fill = candidate_branches(terms, statistics.document_frequencies, limit)
    # the whole vector when a prefix term must see every lexeme, else the query's lexemes only
    lexemes = None if any(t.prefix for t in terms) else [t.lexeme for t in terms]
    scores = (
        bm25_scores(terms, statistics, db_search.candidate_vectors(conn, branches, lexemes), bm25)
        if branches
        else {}
    )
    best = served_best(conn, model, _best_first(scores), limit, filters=filters)
    if len(best) < limit and fill is not None:
        scores |= bm25_scores(
            terms, statistics, db_search.candidate_vectors(conn, [fill], lexemes), bm25
        )
        best = served_best(conn, model, _best_first(scores), limit, filters=filters)
    return ranked_chunks(best)


def _best_first(scores: dict[Any, float]) -> list[tuple[Any, float]]:
    return sorted(scores.items(), key=lambda pair: (-pair[1], pair[0]))


def served_best(
    conn: Connection,
    model: EmbeddingModel,
    scored: Sequence[tuple[Any, float]],
    limit: int,
    *,
    filters: Filters,
) -> list[dict[str, Any]]:
    """The first ``limit`` chunks of ``scored`` (best first) that ``model`` serves and
    ``filters`` pass (:func:`db.search.served_chunks`), asked in slices: the first twice
    ``limit`` long, each next one twice the last, until ``limit`` pass or none are left."""
    # sending every candidate's id and score (hundreds) cost more than probing the few that are
    # returned: most lists are full within the first slice
    best: list[dict[str, Any]] = []
    start, size = 0, 2 * limit
    while len(best) < limit and start < len(scored):
        part = scored[start : start + size]
        best += db_search.served_chunks(conn, model, part, limit - len(best), filters=filters)
        start, size = start + size, 2 * size
    return best


#: The candidate budget, in chunks: the query's rarest terms (lowest document frequency) are
#: matched in full while their document frequencies add up to at most this many.
RARE_POSTINGS = 1000
#: The most chunks read for the common terms (the terms past that budget), per index pass.
COMMON_CAP = 1000
#: How many chunks holding two common terms are read per result asked for, rarest pairs first.
PAIR_CANDIDATES_PER_RESULT = 8
#: Up to this many common terms, the chunks holding three of them are read and their pairs
#: one index pass each, rarest first; past it (a long query: 9 terms make 84 triples and 36
#: pairs) the pairs are read in one pass, in the index's order.
MANY_COMMON_TERMS = 8


def candidate_branches(
    terms: Sequence[TextTerm], dfs: Sequence[float], limit: int
) -> tuple[list[CandidateBranch], CandidateBranch | None]:
    """Where BM25's candidates come from, rarest terms first (as MaxScore/WAND do: a rare
    term's matches are where the high scores are): every chunk holding one of the rarest terms
    whose document frequencies add up to at most :data:`RARE_POSTINGS`; of the other, common,
    terms, every chunk holding all of them, every chunk holding three, and chunks holding two,
    the rarest pair's first (the least product of the two dfs: the highest idfs), at most
    :data:`PAIR_CANDIDATES_PER_RESULT` per result asked for (past :data:`MANY_COMMON_TERMS`,
    no triples and the pairs in any order); and, to fill a list those leave
    shorter than ``limit``, chunks holding any common term (the second value, None when every
    term is rare). A branch reads at most :data:`COMMON_CAP` chunks, any version (the served
    ones are picked from the best). When every term is rare (specific words, or a collection
    small enough), the candidates are every matching chunk: exact BM25."""
    order = sorted(range(len(terms)), key=lambda i: (dfs[i], i))
    rare: list[str] = []
    common: list[int] = []
    total = 0.0
    for i in order:
        total += dfs[i]
        if total <= RARE_POSTINGS:
            rare.append(terms[i].query)
        else:
            common.append(i)
    branches = [CandidateBranch(" | ".join(rare))] if rare else []
    names = [terms[i].query for i in common]
    if len(common) > 2:
        # past the cap the chunks read are the first the index gives, not the best: the chunks
        # holding every common term come first, then those holding three
        branches.append(CandidateBranch(" & ".join(names), COMMON_CAP))
    few = len(common) <= MANY_COMMON_TERMS
    if few and len(common) > 3:
        triples = itertools.combinations(names, 3)
        branches.append(
            CandidateBranch(" | ".join(f"({a} & {b} & {c})" for a, b, c in triples), COMMON_CAP)
        )
    if len(common) >= 2:
        pairs = sorted(itertools.combinations(common, 2), key=lambda p: (dfs[p[0]] * dfs[p[1]], p))
        queries = [f"({terms[a].query} & {terms[b].query})" for a, b in pairs]
        if not few:
            queries = [" | ".join(queries)]
        budget = min(COMMON_CAP, PAIR_CANDIDATES_PER_RESULT * limit)
        branches.append(CandidateBranch(queries[0], budget, tuple(queries[1:])))
    fill = CandidateBranch(" | ".join(names), COMMON_CAP) if common else None
    return branches, fill


def bm25_scores(
    terms: Sequence[TextTerm],
    statistics: TermStatistics,
    candidates: Sequence[dict[str, Any]],
    bm25: Bm25,
) -> dict[Any, float]:
    """Candidate id → score, for each candidate holding a term: Lucene's BM25,
    ``Σ idf · tf·(k1 + 1) / (tf + k1·(1 - b + b·length / average length))`` with
    ``idf = ln(1 + (N - df + 0.5) / (df + 0.5))``, tf the term's positions in the candidate's
    vector (a prefix term: of every lexeme it starts) and length its text in characters."""
    n = statistics.chunks
    idf = [
        math.log(1 + (max(n, df) - df + 0.5) / (df + 0.5)) for df in statistics.document_frequencies
    ]
    k1, b, average = bm25.k1, bm25.b, statistics.average_length
    scores = {}
    for row in candidates:
        counts = vector_counts(row["vector"])
        norm = k1 * (1 - b + b * row["length"] / average)
        score = 0.0
        for term, weight in zip(terms, idf, strict=True):
            if term.prefix:
                tf = sum(c for lexeme, c in counts.items() if lexeme.startswith(term.lexeme))
            else:
                tf = counts.get(term.lexeme, 0)
            if tf:
                score += weight * tf * (k1 + 1) / (tf + norm)
        if score > 0:
            scores[row["id"]] = score
    return scores


# a tsvector's text: 'lexeme':1,5A ... (quotes and backslashes in a lexeme doubled)
_TSVECTOR_ENTRY = re.compile(r"'((?:[^']|'')*)'(?::([0-9A-D,]+))?")


def vector_counts(vector: str) -> dict[str, int]:
    """A ``tsvector``'s text as lexeme → positions (1 for a lexeme stored without any)."""
    return {
        lexeme.replace("''", "'").replace("\\\\", "\\"): positions.count(",") + 1
        for lexeme, positions in _TSVECTOR_ENTRY.findall(vector)
    }


def query_terms(conn: Connection, text: str) -> list[TextTerm]:
    """``text``'s search terms, prepared and bounded (:func:`queries_terms`); raises
    :class:`~trioindex.search.query.QueryRefused` for a text it refuses."""
    (terms,) = queries_terms(conn, [text])
    if isinstance(terms, QueryRefused):
        raise terms
    return terms


def queries_terms(conn: Connection, texts: Sequence[str]) -> list[list[TextTerm] | QueryRefused]:
    """Each text's search terms, prepared and bounded: its English lexemes (stemmed, stop words
    dropped), then its Hangul words as prefixes (:func:`hangul_terms`); or why that text is
    refused (:func:`prepare_query`, :func:`check_terms`). One statement for all the texts."""
    terms, _ = queries_terms_and_collection(conn, texts, None)
    return terms


def queries_terms_and_collection(
    conn: Connection, texts: Sequence[str], model: EmbeddingModel | None
) -> tuple[list[list[TextTerm] | QueryRefused], Collection | None]:
    """:func:`queries_terms`, and with ``model`` the collection BM25 scores that model's chunks
    in (:func:`db.search.served_collection`; None without a model), read in the same
    statement: a batch of text queries reads its collection once."""
    prepared: list[str | QueryRefused] = []
    for raw in texts:
        try:
            prepared.append(prepare_query(raw))
        except QueryRefused as refused:
            prepared.append(refused)
    asked = [t for t in prepared if isinstance(t, str)]
    lexemes: list[list[str]] = []
    collection = None
    if asked or model is not None:
        lexemes, collection = db_search.english_lexemes(conn, asked, collection_of=model)
    found: list[list[TextTerm] | QueryRefused] = []
    for text, text_lexemes in zip(prepared, _each_asked(prepared, lexemes), strict=True):
        if isinstance(text, QueryRefused):
            found.append(text)
            continue
        english = [
            TextTerm(_quoted(lexeme), lexeme)
            for lexeme in text_lexemes
            # Hangul words are hangul_terms' (as prefixes): counted once, not twice, in a tier
            if not _HANGUL_WORD.search(lexeme)
        ]
        terms = english + [
            TextTerm(operand, stem or word, prefix=True)
            for word, stem, operand in _hangul_words(text)
        ]
        try:
            check_terms([t.query for t in terms])
        except QueryRefused as refused:
            found.append(refused)
        else:
            found.append(terms)
    return found, collection


def _each_asked(
    prepared: Sequence[str | QueryRefused], lexemes: Sequence[list[str]]
) -> list[list[str]]:
    """The lexemes of each prepared text in turn (none for a refused one)."""
    asked = iter(lexemes)
    return [[] if isinstance(text, QueryRefused) else next(asked) for text in prepared]


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
