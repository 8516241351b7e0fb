"""The search queries: the chunks of the versions a model serves, nearest to a vector or
matching full-text tiers, and the query's English lexemes (what :mod:`trioindex.search.ranking`
asks). Rows come back as the result columns ``trioindex.search.results`` reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import attrs
import numpy as np
import psycopg

from trioindex.db.models import EmbeddingModel
from trioindex.db.pool import Connection

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
        if self.low_confidence is not None:
            where += " AND (v.ocr_low_confidence_pages IS NOT NULL) = %(low_confidence)s"
            params["low_confidence"] = self.low_confidence
        return where, params


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
) -> list[dict[str, Any]]:
    """The ``limit`` chunks closest to ``vector`` by cosine, best first, with ``score``."""
    dim = int(model.dimension)
    where, params = filters.sql()
    with conn.transaction():
        _set_hnsw(conn, hnsw)
        return conn.execute(
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


def _set_hnsw(conn: Connection, hnsw: HnswSettings) -> None:
    if hnsw.ef_search is not None:
        conn.execute(f"SET LOCAL hnsw.ef_search = {int(hnsw.ef_search)}")
    try:
        with conn.transaction():
            conn.execute(f"SET LOCAL hnsw.iterative_scan = {hnsw.iterative_scan}")
    except psycopg.errors.UndefinedObject:
        pass  # pgvector < 0.8: plain index scan


def matching_chunks(
    conn: Connection, model: EmbeddingModel, tiers: Sequence[str], limit: int, *, filters: Filters
) -> list[dict[str, Any]]:
    """The ``limit`` chunks of the versions ``model`` serves, in its chunk set (the chunks it
    has vectors for), that match the ``tsquery`` tiers, best tier first and ``ts_rank`` (by the
    last, "any term", tier) within one."""
    where, params = filters.sql()
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
        return conn.execute(
            f"SELECT * FROM ({' UNION ALL '.join(branches)}) AS tiers LIMIT %(limit)s",
            {"any": tiers[-1], "limit": limit, "model": model.id} | tier_params | params,
        ).fetchall()


def _not_above(tier: int) -> str:
    # tier i matches at least as many terms as tier i - 1 asks: leave its rows to tier i - 1
    return f" AND NOT c.search_vector @@ %(tier{tier - 1})s::tsquery" if tier else ""


def english_lexemes(conn: Connection, text: str) -> list[str]:
    """The text's English lexemes (``to_tsvector('english')``: stemmed, no stop words)."""
    row = conn.execute(
        "SELECT array(SELECT lexeme FROM unnest(to_tsvector('english', %s)) ORDER BY lexeme)"
        " AS lexemes",
        (text,),
    ).fetchone()
    lexemes: list[str] = row["lexemes"] if row else []
    return lexemes
