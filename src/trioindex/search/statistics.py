"""BM25's statistics for one query: N and the average length of the chunks the ranking model
serves, read for every batch of queries (one row per served document, summed), and each term's
document frequency, kept between queries while the collection stays as it was.

Counting a term's chunks is the dear part (a GIN index pass and a probe of each match's served
row and vector, or ANALYZE's list read), and the same terms come back query after query. A
term's df is kept per model and per collection state (its chunk count and summed length): any
chunk set stored, replaced or deleted changes the state, and the next query counts afresh. So
a df is never older than the N it is used with, and an index that is not being written to
pays for each term once.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from uuid import UUID

import attrs

from trioindex.db import search as db_search
from trioindex.db.models import EmbeddingModel
from trioindex.db.pool import Connection
from trioindex.db.search import Collection, TextTerm

#: The most document frequencies kept (per process); past it the oldest half goes.
MAX_KEPT = 50_000


@attrs.frozen
class TermStatistics:
    """N (the chunks the model serves), their average length in characters, and each query
    term's document frequency among them, in the query's order."""

    chunks: int
    average_length: float
    document_frequencies: tuple[float, ...]


_Key = tuple[UUID, Collection, TextTerm]
_kept: dict[_Key, float] = {}
_lock = threading.Lock()


def term_statistics(
    conn: Connection,
    model: EmbeddingModel,
    terms: Sequence[TextTerm],
    collection: Collection | None = None,
) -> TermStatistics:
    """The statistics BM25 scores ``terms`` with: ``collection`` (read now when None: a batch
    of queries reads it once, with their terms), each term's df as kept for this collection
    state or counted (:func:`db.search.document_frequencies`)."""
    if collection is None:
        collection = db_search.served_collection(conn, model)
    keys = [(model.id, collection, term) for term in terms]
    with _lock:
        found = {key: _kept[key] for key in keys if key in _kept}
    missing = [key for key in keys if key not in found]
    if missing:
        counted = db_search.document_frequencies(
            conn, model, [term for _, _, term in missing], collection.chunks
        )
        found |= dict(zip(missing, counted, strict=True))
        with _lock:
            if len(_kept) + len(missing) > MAX_KEPT:
                for key in list(_kept)[: len(_kept) // 2]:  # insertion order: oldest first
                    del _kept[key]
            _kept.update(zip(missing, counted, strict=True))
    return TermStatistics(
        collection.chunks, collection.average_length, tuple(found[key] for key in keys)
    )


def forget() -> None:
    """Drop every kept document frequency (the next queries count afresh)."""
    with _lock:
        _kept.clear()
