"""Parse and chunk step: storage object → text → chunks stored atomically.

See docs/design/architecture.md, "Parse + chunk".

prepare: under job then version lock, ``UPLOADED → PARSING`` (or resume ``PARSING``) and a
snapshot of storage key, content type, size and sha256. A version already ``CHUNKED`` or later
is a replay: no storage read at all.

outside any transaction: read the object (never more than the configured maximum), then check
its sha256 against the snapshot, parse and chunk in a worker process that is killed on
cancellation or after ``indexing.parsing.timeout`` (:mod:`trioindex.pipeline.parse_process`).

commit: re-validate ownership and that the version still matches the snapshot, then replace
the version's chunks in one transaction and move it to ``CHUNKED``. A concurrent commit for
the same claim serialises on the job lock and finds the version already ``CHUNKED``. The
``CHUNKS_STORED`` event says how many invalid byte sequences decoding replaced by U+FFFD
(``replaced_sequences``, only when there were any) — a count, never the text.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from uuid import UUID

import attrs
import trio

from trioindex.db.events import record_claim_event
from trioindex.db.fence import lock_owned_job
from trioindex.db.jobs import set_progress
from trioindex.db.pool import Connection, Database
from trioindex.db.versions import lock_version, mark_chunked, mark_parsing
from trioindex.errors import ContentInvalid, StateInconsistent
from trioindex.pipeline.chunking import ChunkDraft, Chunker
from trioindex.pipeline.parse_process import (
    DEFAULT_TIMEOUT,
    ParseRequest,
    parse_document,
    parse_in_process,
)
from trioindex.storage import AsyncObjectStore
from trioindex.values import Claim, VersionStatus

logger = logging.getLogger(__name__)

PROGRESS_PARSING = 10
PROGRESS_CHUNKED = 40

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
        return self.status in _ALREADY_CHUNKED


def prepare_parse(conn: Connection, claim: Claim) -> ParseSnapshot:
    with conn.transaction():
        owned = lock_owned_job(conn, claim)
        version = lock_version(conn, owned.document_version_id)
        status = VersionStatus(version["status"])
        if status is VersionStatus.FAILED:
            raise StateInconsistent("the version is FAILED; retry the job to parse it again")
        chunk_count = version["chunk_count"]
        if status is VersionStatus.UPLOADED:
            mark_parsing(conn, version["id"])
            set_progress(conn, claim.job_id, PROGRESS_PARSING)
            record_claim_event(conn, "PARSING_STARTED", claim, version["id"])
            status = VersionStatus.PARSING
        elif status in _ALREADY_CHUNKED and chunk_count is None:
            row = conn.execute(
                "SELECT count(*) AS n FROM document_chunks WHERE document_version_id = %s",
                (version["id"],),
            ).fetchone()
            chunk_count = row["n"] if row else 0
    return ParseSnapshot(
        version_id=version["id"],
        document_id=version["document_id"],
        storage_key=version["storage_key"],
        original_name=version["original_name"],
        content_type=version["content_type"],
        byte_size=version["byte_size"],
        sha256=version["sha256"],
        status=status,
        chunk_count=chunk_count,
    )


_COPY_CHUNKS = """COPY document_chunks
    (document_id, document_version_id, chunk_index, content, char_start, char_end,
     token_count, content_sha256) FROM STDIN"""


def commit_chunks(
    conn: Connection,
    claim: Claim,
    snapshot: ParseSnapshot,
    chunks: Sequence[ChunkDraft],
    *,
    replaced: int = 0,
) -> int:
    """Replace the version's chunks with ``chunks`` and move it to CHUNKED; return the count.

    ``replaced``: invalid byte sequences decoding replaced by U+FFFD, recorded in the event.
    """
    if not chunks:
        raise StateInconsistent("refusing to store an empty chunk set")
    if [c.index for c in chunks] != list(range(len(chunks))):
        raise StateInconsistent("chunk indexes are not contiguous from 0")
    with conn.transaction():
        owned = lock_owned_job(conn, claim)
        version = lock_version(conn, owned.document_version_id)
        if (
            version["id"] != snapshot.version_id
            or version["storage_key"] != snapshot.storage_key
            or version["sha256"] != snapshot.sha256
            or version["byte_size"] != snapshot.byte_size
        ):
            raise StateInconsistent("the version changed since parsing was prepared")
        status = VersionStatus(version["status"])
        if status in _ALREADY_CHUNKED:
            # a concurrent or repeated commit for this claim got here first: converge on it
            row = conn.execute(
                "SELECT count(*) AS n FROM document_chunks WHERE document_version_id = %s",
                (version["id"],),
            ).fetchone()
            return int(row["n"]) if row else 0
        if status is not VersionStatus.PARSING:
            raise StateInconsistent(f"cannot store chunks: version is {status}, expected PARSING")
        conn.execute("DELETE FROM document_chunks WHERE document_version_id = %s", (version["id"],))
        with conn.cursor().copy(_COPY_CHUNKS) as copy:
            for chunk in chunks:
                copy.write_row(
                    (
                        version["document_id"],
                        version["id"],
                        chunk.index,
                        chunk.text,
                        chunk.start,
                        chunk.end,
                        chunk.token_count,
                        chunk.content_sha256,
                    )
                )
        mark_chunked(conn, version["id"], len(chunks))
        set_progress(conn, claim.job_id, PROGRESS_CHUNKED)
        detail = {"chunks": len(chunks), "characters": chunks[-1].end}
        if replaced:
            detail["replaced_sequences"] = replaced
        record_claim_event(conn, "CHUNKS_STORED", claim, version["id"], detail)
    return len(chunks)


def _request(data: bytes, snapshot: ParseSnapshot, max_bytes: int) -> ParseRequest:
    return ParseRequest(
        data=data,
        sha256=snapshot.sha256,
        name=snapshot.original_name,
        content_type=snapshot.content_type,
        max_bytes=max_bytes,
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
    """Run the whole step for ``claim``; return the number of chunks the version has.

    ``parse_timeout`` (``indexing.parsing.timeout``) bounds the parse of this one document,
    not the wait for ``cpu_limiter``; past it the parse is killed and the step fails
    ``DOCUMENT_CONTENT_INVALID``.
    """
    snapshot = await db.run(prepare_parse, claim)
    if snapshot.already_chunked:
        logger.debug("job %s: version already chunked, parse step replayed", claim.job_id)
        return snapshot.chunk_count or 0
    if snapshot.byte_size > max_bytes:
        raise ContentInvalid(
            f"file over the maximum size: {snapshot.byte_size} bytes > {max_bytes} bytes"
        )
    data = await store.get(snapshot.storage_key, max_bytes=max_bytes)
    request = _request(data, snapshot, max_bytes)
    del data
    parsed = await parse_in_process(request, chunker, time_limit=parse_timeout, limiter=cpu_limiter)
    del request
    if parsed.replaced:
        logger.info(
            "job %s: %d invalid byte sequence(s) replaced by U+FFFD",
            claim.job_id,
            parsed.replaced,
        )
    return await db.run(commit_chunks, claim, snapshot, parsed.chunks, replaced=parsed.replaced)
