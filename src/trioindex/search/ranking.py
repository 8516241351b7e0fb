"""Ranking queries: chunks of the versions the serving model serves, ranked by vector
similarity, by full-text match, or by both fused with reciprocal rank fusion (RRF).

* **vector**: cosine similarity ``1 - (vector <=> query)`` over the model's own partial HNSW
  index (``vector::vector(dim)``), with pgvector's iterative scan (``strict_order``) so that
  the filters (served version, key prefix, content type) still fill the list.
* **text**: ``document_chunks.search_vector`` (``simple`` ⊕ ``english`` lexemes, GIN index)
  against the query's terms: its English lexemes (stemmed, stop words dropped) and its Hangul
  words as prefixes (``서울:*`` matches ``서울은``, ``서울입니다``: Korean attaches
  particles to the word) — see :func:`hangul_terms`. Chunks matching every term come first,
  then every term but one, and so on down to any term (:func:`match_tiers`); within a tier
  ``ts_rank`` normalised by document length (flag 1) orders them. A tier is read only while
  the list is short, so ``ts_rank`` scores a few hundred matches, not every chunk sharing one
  common word with the query (OR-ing every term and ranking all matches cost ~10x more at
  100k chunks; docs/test-results/search.md). The text is prepared and its terms bounded by
  :mod:`trioindex.search.query`.
* **hybrid**: both lists (each as deep as the requested candidates), fused by
  ``score = Σ 1 / (RRF_K + rank)`` over the lists a chunk appears in. :func:`hybrid_ranking`
  runs both on one connection; :class:`trioindex.Index` runs them concurrently and calls
  :func:`fuse` itself.

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
import numpy as np
import psycopg

from trioindex.db.models import EmbeddingModel
from trioindex.db.pool import Connection
from trioindex.search.query import check_terms, prepare_query
from trioindex.search.results import RankedChunk, ranked_chunks

SearchMode = Literal["vector", "text", "hybrid"]
SEARCH_MODES: tuple[SearchMode, ...] = get_args(SearchMode)
DEFAULT_MODE: SearchMode = "hybrid"
#: The constant of reciprocal rank fusion (Cormack et al. 2009): large enough that the first
#: few ranks of one list do not drown the other list.
RRF_K = 60
IterativeScan = Literal["strict_order", "relaxed_order", "off"]


@attrs.frozen
class Filters:
    """Which documents a search may return: a key prefix (a folder: ``"papers/"``) and content
    types as ingest recorded them (``"text/markdown"``, or a family: ``"text"``)."""

    key_prefix: str | None = None
    content_types: tuple[str, ...] = ()

    def sql(self) -> tuple[str, dict[str, Any]]:
        """``AND ...`` conditions over ``d`` (documents) and ``v`` (versions), and their params."""
        where, params = "", dict[str, Any]()
        if self.key_prefix:
            where += " AND starts_with(d.external_key, %(key_prefix)s)"
            params["key_prefix"] = self.key_prefix
        if self.content_types:
            where += (
                " AND (v.content_type = ANY(%(content_types)s)"
                " OR split_part(v.content_type, '/', 1) = ANY(%(content_types)s))"
            )
            params["content_types"] = list(self.content_types)
        return where, params


@attrs.frozen
class HnswSettings:
    """pgvector's query-time HNSW settings (``None`` keeps the server's: ef_search 40)."""

    ef_search: int | None = None
    iterative_scan: IterativeScan = "strict_order"


NO_FILTERS = Filters()
DEFAULT_HNSW = HnswSettings()

_COLUMNS = """c.id AS chunk_id, d.external_key, d.id AS document_id, v.version_no,
              v.content_type, c.chunk_index, c.content"""


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
    dim = int(model.dimension)
    where, params = filters.sql()
    with conn.transaction():
        _set_hnsw(conn, hnsw)
        rows = conn.execute(
            f"""SELECT {_COLUMNS},
                       1 - (e.vector::vector({dim}) <=> %(q)s::vector({dim})) AS score
                FROM embeddings e
                JOIN served_versions s ON s.document_version_id = e.document_version_id
                                      AND s.embedding_model_id = %(model)s
                JOIN documents d ON d.id = s.document_id
                JOIN document_versions v ON v.id = e.document_version_id
                JOIN document_chunks c ON c.id = e.chunk_id
                WHERE e.embedding_model_id = %(model)s{where}
                ORDER BY e.vector::vector({dim}) <=> %(q)s::vector({dim})
                LIMIT %(limit)s""",
            {"q": np.asarray(vector, dtype=np.float32), "model": model.id, "limit": limit} | params,
        ).fetchall()
    return ranked_chunks(rows)


def _set_hnsw(conn: Connection, hnsw: HnswSettings) -> None:
    if hnsw.ef_search is not None:
        conn.execute(f"SET LOCAL hnsw.ef_search = {int(hnsw.ef_search)}")
    try:
        with conn.transaction():
            conn.execute(f"SET LOCAL hnsw.iterative_scan = {hnsw.iterative_scan}")
    except psycopg.errors.UndefinedObject:
        pass  # pgvector < 0.8: plain index scan


def text_ranking(
    conn: Connection,
    model: EmbeddingModel,
    text: str,
    limit: int,
    *,
    filters: Filters = NO_FILTERS,
) -> list[RankedChunk]:
    """The ``limit`` chunks of the versions ``model`` serves, in its chunk sets (the chunks it
    has vectors for: a version may hold one set per chunking), that best match ``text`` by full-text
    search, best first: chunks
    matching more of the query's terms first (all of them, then all but one, ...), each tier
    ordered by ``ts_rank``; a tier is read only while the ones before it leave the list short
    (see :func:`match_tiers`). ``text`` goes through :func:`prepare_query` and its terms
    through :func:`check_terms`: either may raise :class:`~trioindex.search.query.QueryRefused`."""
    where, params = filters.sql()
    text = prepare_query(text)
    terms = check_terms([*_english_terms(conn, text), *hangul_terms(text)])
    if not terms:
        return []
    tiers = match_tiers(terms)
    # Each tier is one branch of a UNION ALL under the LIMIT: PostgreSQL starts a branch only
    # when the ones before it returned fewer than LIMIT rows, so ts_rank scores the matches
    # of the tiers read, not every chunk sharing one word with the query.
    branches = [
        f"""(SELECT {_COLUMNS}, ts_rank(c.search_vector, %(any)s::tsquery, 1) AS score
             FROM document_chunks c
             JOIN served_versions s ON s.document_version_id = c.document_version_id
                                   AND s.embedding_model_id = %(model)s
             JOIN documents d ON d.id = s.document_id
             JOIN document_versions v ON v.id = c.document_version_id
             WHERE c.search_vector @@ %(tier{i})s::tsquery{_not_above(i)}{where}
               AND EXISTS (SELECT 1 FROM embeddings e
                           WHERE e.chunk_id = c.id AND e.embedding_model_id = %(model)s)
             ORDER BY score DESC, c.id
             LIMIT %(limit)s)"""
        for i in range(len(tiers))
    ]
    tier_params = {f"tier{i}": tier for i, tier in enumerate(tiers)}
    with conn.transaction():
        # a plain Append runs its branches in order; a Parallel Append would not
        conn.execute("SET LOCAL max_parallel_workers_per_gather = 0")
        rows = conn.execute(
            f"SELECT * FROM ({' UNION ALL '.join(branches)}) AS tiers LIMIT %(limit)s",
            {"any": tiers[-1], "limit": limit, "model": model.id} | tier_params | params,
        ).fetchall()
    return ranked_chunks(rows)


def _not_above(tier: int) -> str:
    # tier i matches at least as many terms as tier i - 1 asks: leave its rows to tier i - 1
    return f" AND NOT c.search_vector @@ %(tier{tier - 1})s::tsquery" if tier else ""


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


def _english_terms(conn: Connection, text: str) -> list[str]:
    """The query's English lexemes (stemmed, stop words dropped) as quoted tsquery operands."""
    row = conn.execute(
        "SELECT array(SELECT lexeme FROM unnest(to_tsvector('english', %s)) ORDER BY lexeme)"
        " AS lexemes",
        (text,),
    ).fetchone()
    lexemes: list[str] = row["lexemes"] if row else []
    # Hangul words are hangul_terms' (as prefixes): counted once, not twice, in a tier
    return [_quoted(lexeme) for lexeme in lexemes if not _HANGUL_WORD.search(lexeme)]


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
) -> list[RankedChunk]:
    """Vector and text rankings, ``limit`` deep each, fused by RRF; the ``limit`` best."""
    by_vector = vector_ranking(conn, model, vector, limit, filters=filters, hnsw=hnsw)
    by_text = text_ranking(conn, model, text, limit, filters=filters)
    return fuse([by_vector, by_text])[:limit]


def fuse(rankings: Sequence[Sequence[RankedChunk]]) -> list[RankedChunk]:
    """Reciprocal rank fusion: each chunk scores ``Σ 1/(RRF_K + rank)``; best first (ties:
    the order of first appearance)."""
    scores: dict[Any, float] = {}
    first: dict[Any, RankedChunk] = {}
    for ranking in rankings:
        for rank, chunk in enumerate(ranking, start=1):
            scores[chunk.chunk_id] = scores.get(chunk.chunk_id, 0.0) + 1.0 / (RRF_K + rank)
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
    terms: list[str] = []
    for word in _HANGUL_WORD.findall(text):
        if 3 * len(word) > _MAX_WORD_BYTES:
            continue
        stem = _without_particle(word)
        term = f"('{word}':* | '{stem}':*)" if stem else f"'{word}':*"
        if term not in terms:
            terms.append(term)
    return terms


def _without_particle(word: str) -> str | None:
    for particle in _PARTICLES:
        if word.endswith(particle) and len(word) - len(particle) >= 2:
            return word[: -len(particle)]
    return None
