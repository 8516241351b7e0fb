"""The search queries: the chunks of the versions a model serves nearest to a vector; for BM25
the served collection's statistics, each term's document frequency, the candidates matching
full-text queries and the best of them a model serves; the query's English lexemes (what
:mod:`trioindex.search.ranking` asks), and the words a query matches in given texts (what
:mod:`trioindex.search.marking` asks). Rows come back as the result columns
``trioindex.search.results`` reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal
from uuid import UUID

import attrs
from pgvector import Vector

from trioindex.db.models import EmbeddingModel
from trioindex.db.pool import Connection
from trioindex.db.vector_index import candidate_count

IterativeScan = Literal["strict_order", "relaxed_order", "off"]


@attrs.frozen
class Filters:
    """Which documents a search may return: a key prefix (a folder: ``"papers/"``), content
    types as ingest recorded them (``"text/markdown"``, or a family: ``"text"``) and, when
    ``low_confidence`` is not None, only the versions OCR marked as of low confidence (True) or
    only the others (False)."""

    key_prefix: str | None = None
    content_types: tuple[str, ...] = ()
    low_confidence: bool | None = None

    def params(self) -> dict[str, Any]:
        """The filters as the parameters of ``trioindex_search_filters_pass`` (``functions.sql``:
        the one text of what they keep), NULL for each filter not given."""
        return {
            "key_prefix": self.key_prefix or None,
            "content_types": list(self.content_types) or None,
            "low_confidence": self.low_confidence,
        }


@attrs.frozen
class HnswSettings:
    """pgvector's query-time HNSW settings (``None`` keeps the server's: ef_search 40)."""

    ef_search: int | None = None
    iterative_scan: IterativeScan = "strict_order"


NO_FILTERS = Filters()
DEFAULT_HNSW = HnswSettings()

_COLUMNS = """c.id AS chunk_id, d.external_key, d.id AS document_id, v.version_no,
              v.content_type, c.chunk_index, c.content, v.ocr_low_confidence_pages"""


def nearest_chunks(
    conn: Connection,
    model: EmbeddingModel,
    vector: Sequence[float],
    limit: int,
    *,
    filters: Filters,
    hnsw: HnswSettings,
    candidates_for: int | None = None,
) -> list[dict[str, Any]]:
    """The ``limit`` chunks closest to ``vector`` by cosine, best first, with ``score``, in one
    statement (``trioindex_nearest_chunks``): under load every round trip waits for the server
    process to be scheduled again.

    Exact while the model has no valid index; once it has, the
    :func:`~trioindex.db.vector_index.candidate_count` nearest by the Hamming distance of their
    sign bits (through the index) ordered by exact cosine (:mod:`trioindex.db.vector_index`
    says why): as many as a list ``candidates_for`` deep takes (``limit`` when None; never
    fewer than ``limit``), so a list's deeper ranks may be ranked from a shorter list's
    candidates. The candidates are ranked from the vectors and the served rows alone (documents
    and versions only when a filter needs them); the chunk's text, document and version are
    read for the ``limit`` kept."""
    dim = int(model.dimension)
    candidates = max(limit, candidate_count(candidates_for or limit, dim))
    # the graph returns at most ef_search rows per scan: never fewer than the candidates asked
    # for (pgvector's ceiling is 1000; the iterative scan goes on past it)
    ef = max(hnsw.ef_search or 0, min(candidates, 1000))
    explicit = ef > 40 or hnsw.ef_search is not None  # 40: pgvector's default
    return conn.execute(
        """SELECT * FROM trioindex_nearest_chunks(
               %(q)s::vector, %(model)s::uuid, %(dim)s::int, %(index)s::text, %(limit)s::int,
               %(candidates)s::int, %(ef)s::int, %(scan)s::text, %(key_prefix)s::text,
               %(content_types)s::text[], %(low_confidence)s::boolean)""",
        {
            "q": Vector(list(vector)),
            "model": model.id,
            "dim": dim,
            "index": model.index_name,
            "limit": limit,
            "candidates": candidates,
            "ef": ef if explicit else None,
            "scan": hnsw.iterative_scan,
        }
        | filters.params(),
    ).fetchall()


@attrs.frozen
class Bm25:
    """BM25's parameters: ``k1`` (term-frequency saturation) and ``b`` (length normalisation),
    Lucene's defaults."""

    k1: float = 1.2
    b: float = 0.75

    def __attrs_post_init__(self) -> None:
        if not (self.k1 >= 0 and 0 <= self.b <= 1):
            raise ValueError(f"BM25 needs k1 >= 0 and 0 <= b <= 1, not k1={self.k1}, b={self.b}")


DEFAULT_BM25 = Bm25()


@attrs.frozen
class TextTerm:
    """One query term: its ``tsquery`` operand (what matches) and what its term frequency counts
    in a chunk's ``search_vector`` (``lexeme``, or every lexeme it starts when ``prefix``)."""

    query: str
    lexeme: str
    prefix: bool = False


#: A term's document frequency is counted exactly up to this many chunks; a term in more is
#: given ANALYZE's estimate (``pg_stats``: the share of chunks holding it, times N; a term
#: ANALYZE did not list as common: the least listed share, an upper bound).
DF_EXACT_UP_TO = 100


@attrs.frozen
class Collection:
    """What BM25 knows of the chunks a model serves (its served versions' chunk sets): how
    many there are and their text's length in characters, summed."""

    chunks: int
    text_length: int

    @property
    def average_length(self) -> float:
        return self.text_length / self.chunks if self.chunks else 1.0


def served_collection(conn: Connection, model: EmbeddingModel) -> Collection:
    """The chunk count and summed text length of the chunk sets ``model`` serves
    (each served row's ``chunks`` and ``text_length``, which the completion that moves it
    writes: one row per served document)."""
    row = conn.execute(f"SELECT * FROM ({_COLLECTION}) AS c", {"model": model.id}).fetchone()
    assert row is not None
    return Collection(row["chunks"], row["text_length"])


_COLLECTION = """SELECT coalesce(sum(chunks), 0)::bigint AS chunks,
                        coalesce(sum(text_length), 0)::bigint AS text_length
                 FROM served_versions WHERE embedding_model_id = %(model)s"""


def document_frequencies(
    conn: Connection, model: EmbeddingModel, terms: Sequence[TextTerm], chunks: int
) -> list[float]:
    """Each term's document frequency in the chunk sets ``model`` serves (``chunks`` of them):
    ANALYZE's estimate when ANALYZE lists the term in more than :data:`DF_EXACT_UP_TO` chunks,
    otherwise counted in that set (the GIN index) up to :data:`DF_EXACT_UP_TO`, past it
    estimated."""
    row = conn.execute(
        f"""WITH {_DOCUMENT_FREQUENCIES}
            SELECT array(SELECT df FROM term_frequencies ORDER BY ord) AS dfs""",
        {
            "model": model.id,
            "n": float(chunks),
            "queries": [t.query for t in terms],
            "lexemes": [t.lexeme for t in terms],
            "prefixes": [t.prefix for t in terms],
            "exact_up_to": DF_EXACT_UP_TO,
        },
    ).fetchone()
    assert row is not None
    return list(row["dfs"])


@attrs.frozen
class CandidateBranch:
    """Chunks matching ``query`` (``tsquery`` text), then those matching each of ``then`` in
    turn, at most ``cap`` of them in all (None: all)."""

    query: str
    cap: int | None = None
    then: tuple[str, ...] = ()


def candidate_vectors(
    conn: Connection, branches: Sequence[CandidateBranch], lexemes: Sequence[str] | None
) -> list[dict[str, Any]]:
    """The chunks matching each of ``branches`` (one GIN index pass each; a chunk matching two
    comes twice), any version, as ``id``, ``length`` (characters) and ``vector``: the text of
    their ``search_vector`` reduced to ``lexemes`` (the whole of it when ``lexemes`` is None).
    Which of them may be returned is :func:`served_chunks`' to say, for the best only."""
    # setweight marks the query's lexemes and ts_filter keeps them: a few positions per chunk
    # come back instead of its whole vector
    vector = (
        "c.search_vector::text"
        if lexemes is None
        else "ts_filter(setweight(c.search_vector, 'A', %(lexemes)s), '{a}')::text"
    )
    params: dict[str, Any] = {"lexemes": list(lexemes or [])}
    parts = []
    for i, branch in enumerate(branches):
        # one index pass per query; the limit stops the passes in order, so a branch's later
        # queries are not run once its first ones fill it
        passes = " UNION ALL ".join(
            f"""(SELECT c.id, length(c.content) AS length, {vector} AS vector
                 FROM document_chunks c WHERE c.search_vector @@ %(query{i}_{j})s::tsquery)"""
            for j in range(1 + len(branch.then))
        )
        parts.append(f"(SELECT * FROM ({passes}) AS b{i} LIMIT %(cap{i})s)")
        params[f"cap{i}"] = branch.cap
        for j, query in enumerate((branch.query, *branch.then)):
            params[f"query{i}_{j}"] = query
    return conn.execute(" UNION ALL ".join(parts), params).fetchall()


def served_chunks(
    conn: Connection,
    model: EmbeddingModel,
    scored: Sequence[tuple[UUID, float]],
    limit: int,
    *,
    filters: Filters,
) -> list[dict[str, Any]]:
    """The first ``limit`` chunks of ``scored`` (best first) that are of a version ``model``
    serves, in its chunk set (the chunks it has vectors for), and pass ``filters``: the result
    columns with their ``score``, in that order. Checked in order until ``limit`` pass: a few
    index probes per returned chunk, not per candidate."""
    return conn.execute(
        f"""SELECT {_COLUMNS}, t.score
            FROM unnest(%(ids)s::uuid[], %(scores)s::float8[]) WITH ORDINALITY
                 AS t (id, score, ord)
            JOIN document_chunks c ON c.id = t.id
            JOIN served_versions s ON s.document_version_id = c.document_version_id
                                  AND s.embedding_model_id = %(model)s
            JOIN documents d ON d.id = s.document_id
            JOIN document_versions v ON v.id = c.document_version_id
            WHERE {_HAS_VECTOR}
              AND trioindex_search_filters_pass(
                      d.external_key, v.content_type, v.ocr_low_confidence_pages,
                      %(key_prefix)s::text, %(content_types)s::text[], %(low_confidence)s::boolean)
            ORDER BY t.ord
            LIMIT %(limit)s""",
        {
            "ids": [i for i, _ in scored],
            "scores": [s for _, s in scored],
            "model": model.id,
            "limit": limit,
        }
        | filters.params(),
    ).fetchall()


# A chunk of the model's own chunk set: one it has a vector for (a version may hold a chunk set
# per chunking; the text ranking and its document frequencies count only this one).
_HAS_VECTOR = (
    "EXISTS (SELECT 1 FROM embeddings e"
    " WHERE e.chunk_id = c.id AND e.embedding_model_id = %(model)s)"
)


# Each term's document frequency among the n chunks the model serves. df: a term ANALYZE lists
# as held by more than exact_up_to chunks (pg_stats.most_common_elems: the share of chunks
# holding it, or a prefix's lexemes, times n) is that estimate, not counted; any other term is
# counted in the served set up to exact_up_to, and past it estimated alike (a lexeme ANALYZE
# did not list: the least share it listed, an upper bound), at least what was counted.
_DOCUMENT_FREQUENCIES = (
    """analysed AS MATERIALIZED (
        SELECT most_common_elems::text::text[] AS lexemes, most_common_elem_freqs AS shares
        FROM pg_stats
        WHERE schemaname = current_schema() AND tablename = 'document_chunks'
          AND attname = 'search_vector'),
    term_frequencies AS MATERIALIZED (
        SELECT q.ord, f.df
        FROM unnest(%(queries)s::text[], %(lexemes)s::text[], %(prefixes)s::boolean[])
             WITH ORDINALITY AS q (query, lexeme, prefix, ord)
        CROSS JOIN (SELECT %(n)s::float8 AS n) AS k
        CROSS JOIN LATERAL (
            SELECT CASE WHEN q.prefix
                        THEN (SELECT sum(a.share) FROM analysed
                              CROSS JOIN unnest(analysed.lexemes, analysed.shares)
                                  AS a (lexeme, share)
                              WHERE starts_with(a.lexeme, q.lexeme))
                        ELSE (SELECT shares[array_position(lexemes, q.lexeme)] FROM analysed)
                   END AS share,
                   -- most_common_elem_freqs: one share per lexeme, then their least, ...
                   (SELECT shares[cardinality(lexemes) + 1] FROM analysed) AS least_share)
            AS listed
        CROSS JOIN LATERAL (
            SELECT listed.share IS NOT NULL
                       AND k.n * least(1, listed.share) > %(exact_up_to)s AS common,
                   k.n * least(1, coalesce(listed.share, listed.least_share, 0)) AS estimate
        ) AS st
        CROSS JOIN LATERAL (
            SELECT count(*)::float8 AS counted FROM (
                SELECT 1 FROM document_chunks c
                JOIN served_versions s ON s.document_version_id = c.document_version_id
                                      AND s.embedding_model_id = %(model)s
                WHERE NOT st.common
                  AND c.search_vector @@ q.query::tsquery
                  AND """
    + _HAS_VECTOR
    + """
                LIMIT %(exact_up_to)s + 1) AS found) AS e
        CROSS JOIN LATERAL (
            SELECT CASE WHEN st.common THEN st.estimate
                        WHEN e.counted <= %(exact_up_to)s THEN e.counted
                        ELSE greatest(e.counted, st.estimate)
                   END AS df) AS f)
"""
)


def english_lexemes(
    conn: Connection, texts: Sequence[str], *, collection_of: EmbeddingModel | None = None
) -> tuple[list[list[str]], Collection | None]:
    """Each text's English lexemes (``to_tsvector('english')``: stemmed, no stop words), sorted,
    in the texts' order; and, with ``collection_of``, that model's :func:`served_collection`
    (else None). One statement for all of it."""
    row = conn.execute(
        f"""SELECT l.lexemes, c.chunks, c.text_length
            FROM (SELECT coalesce(jsonb_agg(array(SELECT lexeme
                                                  FROM unnest(to_tsvector('english', t.text))
                                                  ORDER BY lexeme) ORDER BY t.ord),
                                  '[]') AS lexemes
                  FROM unnest(%(texts)s::text[]) WITH ORDINALITY AS t (text, ord)) AS l
            CROSS JOIN ({_COLLECTION}) AS c""",
        # no model: the collection's index scan for NULL finds no row
        {"texts": list(texts), "model": collection_of.id if collection_of else None},
    ).fetchone()
    assert row is not None
    collection = Collection(row["chunks"], row["text_length"]) if collection_of else None
    return [list(lexemes) for lexemes in row["lexemes"]], collection


def marked_texts(
    conn: Connection, marking: Sequence[tuple[str, str]], start: str, stop: str
) -> list[str]:
    """Each ``(text, query)`` pair's text with the words its ``query`` (a ``tsquery``) matches
    between ``start`` and ``stop`` (``ts_headline`` over the whole text, ``english``: the stems
    and prefixes text search matches), in order: one statement for all of them."""
    rows = conn.execute(
        """SELECT ts_headline('english', t.text, t.query::tsquery,
                              'HighlightAll=true, StartSel=' || %(start)s
                              || ', StopSel=' || %(stop)s) AS marked
           FROM unnest(%(texts)s::text[], %(queries)s::text[]) WITH ORDINALITY
                AS t (text, query, ord)
           ORDER BY t.ord""",
        {
            "texts": [text for text, _ in marking],
            "queries": [query for _, query in marking],
            "start": start,
            "stop": stop,
        },
    ).fetchall()
    return [row["marked"] for row in rows]
