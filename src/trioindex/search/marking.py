"""Where a query matched in its hits: the offsets of the words its terms match in each hit's
chunk text (:attr:`~trioindex.search.results.ChunkHit.matches`), so that snippets show the
passage at the match (:mod:`trioindex.search.passages`) in every mode.

The words are the ones text search matches — the query's English stems and its Korean words
as prefixes (:func:`~trioindex.search.ranking.queries_terms`) — marked by PostgreSQL. A query
without such terms, or with more than text search accepts (a long vector query), marks
nothing: its snippets are the chunks' starts. The hits of every query of a batch are marked in
one statement, with the terms their rankings already used.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from trioindex.db import search as db_search
from trioindex.db.pool import Connection
from trioindex.db.search import TextTerm
from trioindex.search.passages import MARK_START, MARK_STOP, match_offsets
from trioindex.search.query import QueryRefused
from trioindex.search.results import ChunkHit, DocumentHit

#: A query's terms (:func:`~trioindex.search.ranking.queries_terms`), or why it has none.
Terms = Sequence[TextTerm] | QueryRefused


def mark_chunk_answers(
    conn: Connection, answers: Sequence[tuple[Terms, Sequence[ChunkHit]]]
) -> list[list[ChunkHit]]:
    """Each answer's hits with the offsets of its query's matched words in each chunk, in
    order: one statement for all of them (none when no answer has terms and hits)."""
    queries = [
        " | ".join(t.query for t in terms) if not isinstance(terms, QueryRefused) else ""
        for terms, _ in answers
    ]
    asked = [
        (h.text, query)
        for query, (_, hits) in zip(queries, answers, strict=True)
        if query
        for h in hits
    ]
    marked = iter(db_search.marked_texts(conn, asked, MARK_START, MARK_STOP) if asked else [])
    found: list[list[ChunkHit]] = []
    for query, (_, hits) in zip(queries, answers, strict=True):
        if not query:
            found.append(list(hits))
            continue
        answer = []
        for hit in hits:
            unmarked, spans = match_offsets(next(marked))
            # ts_headline returns the text it was given; anything else marks nothing
            answer.append(attrs.evolve(hit, matches=spans) if unmarked == hit.text else hit)
        found.append(answer)
    return found


def mark_document_answers(
    conn: Connection, answers: Sequence[tuple[Terms, Sequence[DocumentHit]]]
) -> list[list[DocumentHit]]:
    """Each answer's document hits with their chunks marked (:func:`mark_chunk_answers`), in
    one statement."""
    chunks = mark_chunk_answers(
        conn, [(terms, [c for h in hits for c in h.chunks]) for terms, hits in answers]
    )
    found: list[list[DocumentHit]] = []
    for (_, hits), marked in zip(answers, chunks, strict=True):
        answer, at = [], 0
        for hit in hits:
            answer.append(attrs.evolve(hit, chunks=tuple(marked[at : at + len(hit.chunks)])))
            at += len(hit.chunks)
        found.append(answer)
    return found
