"""Parse and chunk step: storage object → text → chunks stored atomically.

See docs/design/architecture.md, "Parse + chunk".

Chunk sets (migration 0008): a version keeps one set of chunks per chunking, named by the
claim's ``chunking`` (``characters``, or ``tokens:<model>`` for a token-aware chunker). The
step makes and stores the claim's set only.

prepare: under job then version lock, ``UPLOADED → PARSING`` (or resume ``PARSING``) and a
snapshot of storage key, content type, size and sha256. A version that already has the claim's
set is a replay: no storage read at all. A version ``CHUNKED`` or later without it (chunked
for another model's chunking) is parsed again, for this set.

outside any transaction: read the object (never more than the configured maximum), then check
its sha256 against the snapshot, parse and chunk in a worker process that is killed on
cancellation or after ``indexing.parsing.timeout`` (:mod:`trioindex.pipeline.parse_process`).

commit (and the embed step's prepare, in the same transaction): re-validate ownership and that
the version still matches the snapshot, store the claim's set, and start embedding
(``PARSING → EMBEDDING``, ``CHUNKS_STORED`` and ``EMBEDDING_STARTED``); a version past
``PARSING`` keeps its status. A concurrent commit of the same set serialises on the job and
version locks and finds the set stored: it converges without writing. The ``CHUNKS_STORED``
event says how many invalid byte sequences decoding replaced by U+FFFD
(``replaced_sequences``, only when there were any) — a count, never the text.

Both run as the SQL functions of migrations 0005/0008 (:func:`begin_parse_many`,
:func:`store_chunks_many`), each job fenced in its own subtransaction. The worker hands them
to its group committers (:func:`parse_and_store`), which write the steps of many jobs in one
transaction; :func:`run_parse_step` calls them for one job. Small plain-text and
Markdown files (at most :data:`INLINE_PARSE_BYTES`) are parsed in the worker itself: their work
is bounded and tiny (~0.04 ms), while a round trip to a parse process costs ~1.7 ms of CPU.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from uuid import UUID

import attrs
import trio

from trioindex.db.fence import claim_arrays, refusal_error
from trioindex.db.pool import Connection, Database
from trioindex.errors import ContentInvalid, StateInconsistent
from trioindex.pipeline.chunking import ChunkDraft, Chunker
from trioindex.pipeline.embed_step import ChunkRef, EmbedSnapshot
from trioindex.pipeline.formats import DocumentFormat, detect_format
from trioindex.pipeline.parse_process import (
    DEFAULT_TIMEOUT,
    ParsedDocument,
    ParseRequest,
    parse_document,
    parse_in_process,
)
from trioindex.storage import AsyncObjectStore
from trioindex.values import Claim, VersionStatus

logger = logging.getLogger(__name__)

PROGRESS_PARSING = 10
# Plain text and Markdown up to this size are parsed in the worker, not in a parse process:
# decoding and chunking 32 KiB is bounded (well under 10 ms even for the splitter's worst case).
INLINE_PARSE_BYTES = 32 * 1024
_INLINE_FORMATS = frozenset({DocumentFormat.TEXT, DocumentFormat.MARKDOWN})

_ALREADY_CHUNKED = frozenset(
    {VersionStatus.CHUNKED, VersionStatus.EMBEDDING, VersionStatus.INDEXED}
)


@attrs.frozen
class ParseSnapshot:
    version_id: UUID
    document_id: UUID
    storage_key: str
    original_name: str
    content_type: str | None
    byte_size: int
    sha256: str
    status: VersionStatus
    chunk_count: int | None

    @property
    def already_chunked(self) -> bool:
        """The version has the job's chunk set (``chunk_count`` is its size): a replay."""
        return self.status in _ALREADY_CHUNKED and self.chunk_count is not None


def prepare_parse(conn: Connection, claim: Claim) -> ParseSnapshot:
    """One job's parse prepare: :func:`begin_parse_many` for one claim (the same SQL function
    the worker's group committer runs), its refusal raised."""
    with conn.transaction():
        (result,) = begin_parse_many(conn, [claim])
    if isinstance(result, Exception):
        raise result
    return result


def commit_chunks(
    conn: Connection,
    claim: Claim,
    snapshot: ParseSnapshot,
    chunks: Sequence[ChunkDraft],
    *,
    replaced: int = 0,
) -> int:
    """One job's chunk commit: :func:`store_chunks_many` for one commit (the same SQL function
    the worker's group committer runs), in its own transaction; return the job's chunk count
    (stored now or, on a replay, before). The version moves to EMBEDDING with the chunks.

    ``replaced``: invalid byte sequences decoding replaced by U+FFFD, recorded in the event.
    """
    with conn.transaction():
        (result,) = store_chunks_many(conn, [ChunkCommit(claim, snapshot, chunks, replaced)])
    if isinstance(result, Exception):
        raise result
    return result if isinstance(result, int) else len(result.chunks)


def _snapshot_from_row(row: dict[str, Any]) -> ParseSnapshot:
    return ParseSnapshot(
        version_id=row["version_id"],
        document_id=row["document_id"],
        storage_key=row["storage_key"],
        original_name=row["original_name"],
        content_type=row["content_type"],
        byte_size=row["byte_size"],
        sha256=row["sha256"],
        status=VersionStatus(row["status"]),
        chunk_count=row["chunk_count"],
    )


def begin_parse_many(conn: Connection, claims: Sequence[Claim]) -> list[ParseSnapshot | Exception]:
    """:func:`prepare_parse` for many claims in one statement (``trioindex_begin_parse_many``,
    migration 0005); one result per claim, in order: its snapshot, or the
    :class:`OwnershipLost` / :class:`StateInconsistent` that refused it alone."""
    order = sorted(range(len(claims)), key=lambda i: claims[i].document_version_id)
    ordered = [claims[i] for i in order]
    rows = conn.execute(
        """SELECT * FROM trioindex_begin_parse_many(
               %b::uuid[], %b::uuid[], %b::uuid[], %b::uuid[])""",
        claim_arrays(ordered),
    ).fetchall()
    results: list[ParseSnapshot | Exception] = [StateInconsistent("no result")] * len(claims)
    for position, row in zip(order, rows, strict=True):
        refused = refusal_error(row["refusal"], row["message"])
        results[position] = refused if refused is not None else _snapshot_from_row(row)
    return results


@attrs.frozen
class ChunkCommit:
    """One job's parsed chunks, ready for :func:`store_chunks_many`. Chunk ids are made here,
    so the embed step knows them without reading the rows back."""

    claim: Claim
    snapshot: ParseSnapshot
    chunks: Sequence[ChunkDraft] = attrs.field(repr=False)
    replaced: int = 0
    ids: tuple[UUID, ...] = attrs.field(repr=False)

    @ids.default
    def _new_ids(self) -> tuple[UUID, ...]:
        return tuple(uuid.uuid4() for _ in self.chunks)

    @property
    def weight(self) -> int:
        return len(self.chunks)


def store_chunks_many(
    conn: Connection, commits: Sequence[ChunkCommit]
) -> list[EmbedSnapshot | int | Exception]:
    """:func:`commit_chunks` and the embed step's prepare for many jobs in one statement
    (``trioindex_store_chunks_many``, migration 0005). One result per commit, in order: the
    :class:`EmbedSnapshot` the embed step continues from; the stored chunk count when the
    version was already chunked (a replay: nothing written, the embed step prepares itself);
    or the error that refused this job alone."""
    results: list[EmbedSnapshot | int | Exception] = [StateInconsistent("no result")] * len(commits)
    valid: list[int] = []
    for position, commit in enumerate(commits):
        if not commit.chunks:
            results[position] = StateInconsistent("refusing to store an empty chunk set")
        elif [c.index for c in commit.chunks] != list(range(len(commit.chunks))):
            results[position] = StateInconsistent("chunk indexes are not contiguous from 0")
        else:
            valid.append(position)
    if not valid:
        return results
    valid.sort(key=lambda i: commits[i].claim.document_version_id)
    ordered = [commits[i] for i in valid]
    firsts, counts = [], []
    ids: list[UUID] = []
    texts: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    tokens: list[int] = []
    hashes: list[str] = []
    for commit in ordered:
        firsts.append(len(ids) + 1)
        counts.append(len(commit.chunks))
        ids.extend(commit.ids)
        for chunk in commit.chunks:
            texts.append(chunk.text)
            starts.append(chunk.start)
            ends.append(chunk.end)
            tokens.append(chunk.token_count)
            hashes.append(chunk.content_sha256)
    rows = conn.execute(
        """SELECT * FROM trioindex_store_chunks_many(
               %b::uuid[], %b::uuid[], %b::uuid[], %b::uuid[],
               %b::uuid[], %b::text[], %b::text[], %b::bigint[], %b::int[], %b::int[], %b::int[],
               %b::uuid[], %b::text[], %b::int[], %b::int[], %b::int[], %b::text[])""",
        (
            *claim_arrays([c.claim for c in ordered]),
            [c.snapshot.version_id for c in ordered],
            [c.snapshot.storage_key for c in ordered],
            [c.snapshot.sha256 for c in ordered],
            [c.snapshot.byte_size for c in ordered],
            [c.replaced for c in ordered],
            firsts,
            counts,
            ids,
            texts,
            starts,
            ends,
            tokens,
            hashes,
        ),
    ).fetchall()
    for position, commit, row in zip(valid, ordered, rows, strict=True):
        refused = refusal_error(row["refusal"], row["message"])
        if refused is not None:
            results[position] = refused
        elif not row["started_embedding"]:
            results[position] = int(row["chunks"])
        else:
            results[position] = EmbedSnapshot(
                version_id=commit.snapshot.version_id,
                document_id=commit.snapshot.document_id,
                model_id=row["model_id"],
                model_name=row["model_name"],
                dimension=row["dimension"],
                chunks=tuple(
                    ChunkRef(chunk_id, chunk.index, chunk.text)
                    for chunk_id, chunk in zip(commit.ids, commit.chunks, strict=True)
                ),
                complete=False,
            )
    return results


def _request(
    data: bytes, snapshot: ParseSnapshot, max_bytes: int, ocr: bool = True
) -> ParseRequest:
    return ParseRequest(
        data=data,
        sha256=snapshot.sha256,
        name=snapshot.original_name,
        content_type=snapshot.content_type,
        max_bytes=max_bytes,
        ocr=ocr,
    )


def parse_and_chunk_bytes(
    data: bytes, snapshot: ParseSnapshot, chunker: Chunker, max_bytes: int
) -> list[ChunkDraft]:
    """The CPU-bound part in the calling thread (the step itself runs it in a process)."""
    return parse_document(_request(data, snapshot, max_bytes), chunker).chunks


async def run_parse_step(
    claim: Claim,
    *,
    db: Database,
    store: AsyncObjectStore,
    chunker: Chunker,
    max_bytes: int,
    parse_timeout: float = DEFAULT_TIMEOUT,
    cpu_limiter: trio.CapacityLimiter | None = None,
) -> int:
    """Run the whole step for ``claim`` on its own (one transaction each for prepare and
    commit); return the number of chunks the version has.

    ``parse_timeout`` (``indexing.parsing.timeout``) bounds the parse of this one document,
    not the wait for ``cpu_limiter``; past it the parse is killed and the step fails
    ``DOCUMENT_CONTENT_INVALID``.
    """

    async def begin(claim: Claim) -> ParseSnapshot:
        return await db.run(prepare_parse, claim)

    async def commit(item: ChunkCommit) -> int:
        return await db.run(
            commit_chunks, item.claim, item.snapshot, item.chunks, replaced=item.replaced
        )

    result = await parse_and_store(
        claim,
        begin=begin,
        commit=commit,
        store=store,
        chunker=chunker,
        max_bytes=max_bytes,
        parse_timeout=parse_timeout,
        cpu_limiter=cpu_limiter,
    )
    return result if isinstance(result, int) else len(result.chunks)


async def parse_and_store(
    claim: Claim,
    *,
    begin: Callable[[Claim], Awaitable[ParseSnapshot]],
    commit: Callable[[ChunkCommit], Awaitable[EmbedSnapshot | int]],
    admit: Callable[[ParseSnapshot], Awaitable[None]] | None = None,
    store: AsyncObjectStore,
    chunker: Chunker,
    max_bytes: int,
    parse_timeout: float = DEFAULT_TIMEOUT,
    ocr: bool = True,
    cpu_limiter: trio.CapacityLimiter | None = None,
) -> EmbedSnapshot | int:
    """The step with its two transactions given: ``begin`` (prepare) and ``commit`` (store the
    chunks). ``admit`` is awaited before the bytes are read (the worker bounds how many large
    documents it holds at once). ``ocr``: ``indexing.parsing.ocr`` is not ``off``. Returns what
    ``commit`` returns, or the stored chunk count on a replay."""
    snapshot = await begin(claim)
    if snapshot.already_chunked:
        logger.debug("job %s: version already chunked, parse step replayed", claim.job_id)
        return snapshot.chunk_count or 0
    if snapshot.byte_size > max_bytes:
        raise ContentInvalid(
            f"file over the maximum size: {snapshot.byte_size} bytes > {max_bytes} bytes"
        )
    if admit is not None:
        await admit(snapshot)
    data = await store.get(snapshot.storage_key, max_bytes=max_bytes)
    request = _request(data, snapshot, max_bytes, ocr)
    inline = len(data) <= INLINE_PARSE_BYTES and (
        detect_format(data, snapshot.original_name, snapshot.content_type) in _INLINE_FORMATS
    )
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
    return await commit(ChunkCommit(claim, snapshot, parsed.chunks, parsed.replaced))
