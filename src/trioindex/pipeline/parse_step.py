"""Parse and chunk step: storage object → text → chunks, for one claimed job.

See docs/design/architecture.md, "Parse + chunk". :func:`parse_and_store` is the step; its one
database write is given to it (the worker passes its group committer over
:func:`trioindex.db.steps.store_chunks_many`).

The claim begins it: the claim statement reads what the parse needs (the claim's
:class:`~trioindex.values.ParseSnapshot`: storage key, content type, size and sha256) for a job
whose chunk set (``characters``, or ``tokens:<model>`` for a token-aware chunker) is not stored,
so the parse writes and reads nothing in the database before its commit.

outside any transaction: read the object (never more than the configured maximum), then check
its sha256 against the snapshot, parse and chunk in a worker process that is killed on
cancellation or after ``indexing.parsing.timeout`` (:mod:`trioindex.pipeline.parse_process`).
Small plain-text and Markdown files (at most :data:`INLINE_PARSE_BYTES`) are parsed in the
worker itself: their work is bounded and tiny (~0.04 ms), while a round trip to a parse process
costs ~1.7 ms of CPU.

commit (and the embed step's start, in the same transaction): re-validate ownership and that
the version still matches the snapshot, store the claim's set (recorded on the attempt: the
parse's start, its chunk count and the embedding's start). A concurrent commit of the same set —
another model's job sharing it — serialises on the version lock and finds the set stored: it
converges without writing. The attempt records how many invalid byte sequences decoding
replaced by U+FFFD (``replaced_sequences``, only when there were any) — a count, never the text.
A scan whose OCR read pages with low confidence marks the version with those pages
(``document_versions.ocr_low_confidence_pages``) and an ``OCR_LOW_CONFIDENCE`` event, in the
same transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

import trio

from trioindex.db.steps import ChunkCommit, EmbedSnapshot
from trioindex.errors import ContentInvalid, StateInconsistent
from trioindex.pipeline.chunking import Chunker
from trioindex.pipeline.formats import DEFAULT_OCR, DocumentFormat, detect_format
from trioindex.pipeline.parse_process import (
    DEFAULT_TIMEOUT,
    ParsedDocument,
    ParseRequest,
    parse_document,
    parse_in_process,
)
from trioindex.values import Claim, ParseSnapshot

logger = logging.getLogger(__name__)

# Plain text and Markdown up to this size are parsed in the worker, not in a parse process:
# decoding and chunking 32 KiB is bounded (well under 10 ms even for the splitter's worst case).
INLINE_PARSE_BYTES = 32 * 1024
_INLINE_FORMATS = frozenset({DocumentFormat.TEXT, DocumentFormat.MARKDOWN})


class ObjectReader(Protocol):
    """Where the parse reads its document: :class:`trioindex.storage.AsyncObjectStore`, or
    :class:`trioindex.storage.grouped_reads.GroupedReads` (many jobs' reads per thread hop)."""

    async def get(self, key: str, *, max_bytes: int) -> bytes: ...


def _request(
    data: bytes,
    snapshot: ParseSnapshot,
    max_bytes: int,
    ocr: bool = True,
    ocr_low_confidence: float = DEFAULT_OCR.low_confidence,
    *,
    detected: DocumentFormat | None = None,
) -> ParseRequest:
    return ParseRequest(
        data=data,
        sha256=snapshot.sha256,
        name=snapshot.original_name,
        content_type=snapshot.content_type,
        max_bytes=max_bytes,
        ocr=ocr,
        ocr_low_confidence=ocr_low_confidence,
        detected=detected,
    )


async def parse_and_store(
    claim: Claim,
    *,
    commit: Callable[[ChunkCommit], Awaitable[EmbedSnapshot | int]],
    admit: Callable[[ParseSnapshot], Awaitable[None]] | None = None,
    store: ObjectReader,
    chunker: Chunker,
    max_bytes: int,
    parse_timeout: float = DEFAULT_TIMEOUT,
    ocr: bool = True,
    ocr_low_confidence: float = DEFAULT_OCR.low_confidence,
    cpu_limiter: trio.CapacityLimiter | None = None,
) -> EmbedSnapshot | int:
    """The step of a claim that parses (it carries its :class:`ParseSnapshot`), with its one
    transaction given: ``commit`` (store the chunks). ``admit`` is awaited before the bytes are
    read (the worker bounds how many large documents it holds at once). ``ocr``:
    ``indexing.parsing.ocr`` is not ``off``; ``ocr_low_confidence``:
    ``indexing.parsing.ocr-low-confidence``. Returns what ``commit`` returns."""
    snapshot = claim.parse
    if snapshot is None:
        raise StateInconsistent("the claim carries nothing to parse: its chunk set was stored")
    if snapshot.byte_size > max_bytes:
        raise ContentInvalid(
            f"file over the maximum size: {snapshot.byte_size} bytes > {max_bytes} bytes"
        )
    if admit is not None:
        await admit(snapshot)
    data = await store.get(snapshot.storage_key, max_bytes=max_bytes)
    # a small file's format decides where it is parsed; the parse is given it, not judging the
    # same bytes again
    detected = (
        detect_format(data, snapshot.original_name, snapshot.content_type)
        if len(data) <= INLINE_PARSE_BYTES
        else None
    )
    inline = detected in _INLINE_FORMATS
    request = _request(data, snapshot, max_bytes, ocr, ocr_low_confidence, detected=detected)
    del data
    parsed: ParsedDocument
    if inline:
        parsed = parse_document(request, chunker)
    else:
        parsed = await parse_in_process(
            request, chunker, time_limit=parse_timeout, limiter=cpu_limiter
        )
    del request
    if parsed.replaced:
        logger.info(
            "job %s: %d invalid byte sequence(s) replaced by U+FFFD",
            claim.job_id,
            parsed.replaced,
        )
    if parsed.low_confidence_pages:
        logger.info(
            "job %s: OCR read %d page(s) with low confidence; the version is marked",
            claim.job_id,
            len(parsed.low_confidence_pages),
        )
    return await commit(
        ChunkCommit(
            claim,
            snapshot,
            parsed.chunks,
            parsed.replaced,
            low_confidence_pages=parsed.low_confidence_pages,
        )
    )
