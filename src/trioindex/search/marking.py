"""Where a query matched in its hits: the offsets of the words its terms match in each hit's
chunk text (:attr:`~trioindex.search.results.ChunkHit.matches`), so that snippets show the
passage at the match (:mod:`trioindex.search.passages`) in every mode.

The words are the ones text search matches — the query's English stems and its Korean words
as prefixes (:func:`~trioindex.search.ranking.query_terms`) — marked by PostgreSQL. A query
without such terms, or with more than text search accepts (a long vector query), marks
nothing: its snippets are the chunks' starts.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from trioindex.db import search as db_search
from trioindex.db.pool import Connection
from trioindex.search.passages import MARK_START, MARK_STOP, match_offsets
from trioindex.search.query import QueryRefused
from trioindex.search.ranking import query_terms
from trioindex.search.results import ChunkHit, DocumentHit


def marked_chunk_hits(conn: Connection, text: str, hits: Sequence[ChunkHit]) -> list[ChunkHit]:
    """``hits`` with the offsets of ``text``'s matched words in each chunk."""
    if not hits:
        return []
    try:
        terms = query_terms(conn, text)
    except QueryRefused:
        terms = []
    if not terms:
        return list(hits)
    query = " | ".join(t.query for t in terms)
    marked = db_search.marked_texts(conn, [h.text for h in hits], query, MARK_START, MARK_STOP)
    found = []
    for hit, marks in zip(hits, marked, strict=True):
        unmarked, spans = match_offsets(marks)
        # ts_headline returns the text it was given; anything else marks nothing
        found.append(attrs.evolve(hit, matches=spans) if unmarked == hit.text else hit)
    return found


def marked_document_hits(
    conn: Connection, text: str, hits: Sequence[DocumentHit]
) -> list[DocumentHit]:
    """``hits`` with their chunks marked (:func:`marked_chunk_hits`), in one query."""
    chunks = marked_chunk_hits(conn, text, [c for h in hits for c in h.chunks])
    found, at = [], 0
    for hit in hits:
        found.append(attrs.evolve(hit, chunks=tuple(chunks[at : at + len(hit.chunks)])))
        at += len(hit.chunks)
    return found
