"""What a search returns: chunk hits, document hits (a document with its best chunks), and
their documented JSON shapes.

A :class:`ChunkHit` is one stored chunk of a document's current version; a
:class:`DocumentHit` groups the chunk hits of one document, scored by its best chunk. What a
score means depends on the mode (see :mod:`trioindex.search.ranking`): cosine similarity for
``vector``, PostgreSQL's ``ts_rank`` for ``text``, the reciprocal-rank-fusion sum for
``hybrid``; within one result list a higher score always ranks first. A chunk whose score is
not a number (a vector of norm zero stored before vectors were checked for it) is not ranked.

:func:`json_text` is how search output becomes JSON: strict (``NaN`` and ``Infinity`` are
refused, never printed) and valid UTF-8 (a lone surrogate, which an input line may carry in its
``id``, is written as its ``\\uXXXX`` escape).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from typing import Any
from uuid import UUID

import attrs

from trioindex.search.passages import SNIPPET_WIDTH, Passage, Span, passage


def json_text(value: object, *, indent: int | None = None) -> str:
    """``value`` as strict JSON text that encodes to UTF-8 (module docstring)."""
    text = json.dumps(value, ensure_ascii=False, allow_nan=False, indent=indent)
    # Lone surrogates are the only characters UTF-8 cannot encode; backslashreplace writes each
    # as \udXXX, its JSON escape (a surrogate can only be inside a string).
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def snippet(text: str, width: int = SNIPPET_WIDTH, matches: Sequence[Span] = ()) -> str:
    """``text``'s passage at ``matches`` (:func:`~trioindex.search.passages.passage`) on one
    line, at most ``width`` characters (an ellipsis marks each cut); without matches, its
    start."""
    return passage(text, matches, width).text


@attrs.frozen
class ChunkHit:
    """One chunk of a document's current version, ranked among the chunks of one search."""

    rank: int
    score: float
    document_key: str
    document_id: UUID
    version_no: int
    chunk_index: int
    text: str = attrs.field(repr=False)
    #: ``[start, end)`` character offsets in ``text`` of the words the query's terms match
    matches: tuple[Span, ...] = attrs.field(default=(), repr=False)

    def passage(self, width: int = SNIPPET_WIDTH) -> Passage:
        """The chunk's passage at its matches, with their offsets in it."""
        return passage(self.text, self.matches, width)

    def snippet(self, width: int = SNIPPET_WIDTH) -> str:
        return self.passage(width).text

    def as_json(self) -> dict[str, Any]:
        """The ``search --chunks --json`` element: the first release's fields, then the
        matches' offsets in ``text``, the snippet and the matches' offsets in it."""
        shown = self.passage()
        return {
            "rank": self.rank,
            "score": self.score,
            "document_key": self.document_key,
            "document_id": str(self.document_id),
            "version_no": self.version_no,
            "chunk_index": self.chunk_index,
            "text": self.text,
            "matches": [list(m) for m in self.matches],
            "snippet": shown.text,
            "highlights": [list(h) for h in shown.highlights],
        }


#: The name the first releases used for a chunk hit.
SearchHit = ChunkHit


@attrs.frozen
class DocumentHit:
    """One document: its current version, its score (its best chunk's) and its best chunks."""

    rank: int
    score: float
    document_key: str
    document_id: UUID
    version_no: int
    content_type: str | None
    chunks: tuple[ChunkHit, ...]
    low_confidence_pages: tuple[int, ...] = ()  # the pages OCR read with low confidence

    def as_json(self) -> dict[str, Any]:
        """The ``search --json`` element: chunks carry index, score, snippet and the offsets of
        the matched words in the snippet (``highlights``: ``[start, end)`` pairs)."""
        return {
            "rank": self.rank,
            "score": self.score,
            "document_key": self.document_key,
            "document_id": str(self.document_id),
            "version_no": self.version_no,
            "content_type": self.content_type,
            "chunks": [_chunk_json(c) for c in self.chunks],
        }


def _chunk_json(chunk: ChunkHit) -> dict[str, Any]:
    shown = chunk.passage()
    return {
        "chunk_index": chunk.chunk_index,
        "score": chunk.score,
        "snippet": shown.text,
        "highlights": [list(h) for h in shown.highlights],
    }


@attrs.frozen
class RankedChunk:
    """A chunk as a ranking query returns it, before hits are numbered or grouped."""

    chunk_id: UUID
    score: float
    document_key: str
    document_id: UUID
    version_no: int
    content_type: str | None
    chunk_index: int
    text: str = attrs.field(repr=False)
    low_confidence_pages: tuple[int, ...] = ()

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> RankedChunk:
        return cls(
            row["chunk_id"],
            float(row["score"]),
            row["external_key"],
            row["document_id"],
            row["version_no"],
            row["content_type"],
            row["chunk_index"],
            row["content"],
            tuple(row.get("ocr_low_confidence_pages") or ()),
        )


def ranked_chunks(rows: Iterable[dict[str, Any]]) -> list[RankedChunk]:
    """A ranking query's rows as chunks, in order, leaving out any whose score is not finite."""
    ranked = (RankedChunk.from_row(row) for row in rows)
    return [chunk for chunk in ranked if math.isfinite(chunk.score)]


def chunk_hits(ranked: Sequence[RankedChunk], top_k: int) -> list[ChunkHit]:
    """The first ``top_k`` chunks as hits numbered from 1."""
    return [
        ChunkHit(i + 1, r.score, r.document_key, r.document_id, r.version_no, r.chunk_index, r.text)
        for i, r in enumerate(ranked[:top_k])
    ]


def document_hits(
    ranked: Sequence[RankedChunk], top_k: int, chunks_per_document: int
) -> list[DocumentHit]:
    """Group ranked chunks (best first) by document: at most ``top_k`` documents, each scored
    by its best chunk, with at most ``chunks_per_document`` of its chunks, best first."""
    grouped: dict[UUID, list[RankedChunk]] = {}
    for chunk in ranked:
        grouped.setdefault(chunk.document_id, []).append(chunk)
    hits: list[DocumentHit] = []
    for rank, chunks in enumerate(list(grouped.values())[:top_k], start=1):
        best = chunks[0]
        hits.append(
            DocumentHit(
                rank,
                best.score,
                best.document_key,
                best.document_id,
                best.version_no,
                best.content_type,
                tuple(chunk_hits(chunks, chunks_per_document)),
                best.low_confidence_pages,
            )
        )
    return hits
