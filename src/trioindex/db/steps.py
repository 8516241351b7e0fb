"""The pipeline steps' writes: a job's chunk set, its embed prepare, and its vectors with the
completion — for many jobs at once, each job refused or written on its own.

Each function here calls one SQL function of ``functions.sql`` (``trioindex_store_chunks_many``,
``trioindex_begin_embedding``, ``trioindex_store_embeddings_many``) and turns its rows into
values. The group functions return one result per job, in the order given: a value, or the
exception that refused that job alone (:func:`trioindex.db.fence.refusal_error`); the worker's
group committers (:mod:`trioindex.worker.committer`) batch many jobs' writes into one call, which
the SQL side writes set-based (one fence statement per group, one statement per table). Jobs are
passed to SQL in version-id order, so two groups never take version locks in opposite orders.
The parse needs no write of its own first: the claim carries what it reads
(:class:`trioindex.values.ParseSnapshot`).

The values that cross from the pipeline to these writes and back live here too: the chunks the
parse stores (:class:`ChunkCommit`), what the embed step embeds (:class:`EmbedSnapshot`) and the
vectors it stores (:class:`EmbeddingCommit`).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, Protocol
from uuid import UUID

import attrs
import numpy as np
import numpy.typing as npt

from trioindex.db.fence import claim_arrays, fenced_errors, refusal_error
from trioindex.db.pool import Connection
from trioindex.errors import StateInconsistent
from trioindex.values import Claim, CompleteResult, ParseSnapshot

# ---------------------------------------------------------------------------------------------
# parse


class StoredChunk(Protocol):
    """One chunk as the parse made it (:class:`trioindex.pipeline.chunk_values.ChunkDraft`)."""

    @property
    def index(self) -> int: ...
    @property
    def text(self) -> str: ...
    @property
    def start(self) -> int: ...
    @property
    def end(self) -> int: ...
    @property
    def token_count(self) -> int: ...
    @property
    def content_sha256(self) -> str: ...


@attrs.frozen
class ChunkCommit:
    """One job's parsed chunks, ready for :func:`store_chunks_many`. Chunk ids are made here,
    so the embed step knows them without reading the rows back."""

    claim: Claim
    snapshot: ParseSnapshot
    chunks: Sequence[StoredChunk] = attrs.field(repr=False)
    replaced: int = 0
    ids: tuple[UUID, ...] = attrs.field(repr=False)
    low_confidence_pages: tuple[int, ...] = ()  # pages OCR read with low confidence, if any

    @ids.default
    def _new_ids(self) -> tuple[UUID, ...]:
        return tuple(uuid.uuid4() for _ in self.chunks)

    @property
    def weight(self) -> int:
        return len(self.chunks)


# ---------------------------------------------------------------------------------------------
# embed


@attrs.frozen
class ChunkRef:
    id: UUID
    index: int
    text: str = attrs.field(repr=False)


@attrs.frozen
class EmbedSnapshot:
    """What the embed step embeds: the job's chunk set in order and its pinned model
    (never "the active model"); ``complete`` when the model's vectors are all stored."""

    version_id: UUID
    document_id: UUID
    model_id: UUID
    model_name: str
    dimension: int
    chunks: tuple[ChunkRef, ...]
    complete: bool

    def texts(self) -> list[str]:
        """The chunk texts, in chunk order."""
        return [chunk.text for chunk in self.chunks]

    def without_texts(self) -> EmbedSnapshot:
        """The same snapshot with every chunk's text dropped (``""``): what storing the
        vectors needs (ids and indexes), without holding a large document's text."""
        return attrs.evolve(
            self, chunks=tuple(ChunkRef(chunk.id, chunk.index, "") for chunk in self.chunks)
        )


def _int_array(values: Sequence[int]) -> str | None:
    """A PostgreSQL integer array literal (``{1,3}``), or None for none."""
    return "{" + ",".join(str(int(v)) for v in values) + "}" if values else None


def _screen(problems: Sequence[Exception | None], versions: Sequence[UUID]) -> list[int]:
    """The positions of the commits without a problem found before the database, in version-id
    order (the order group functions take)."""
    valid = [i for i, problem in enumerate(problems) if problem is None]
    return sorted(valid, key=lambda i: versions[i])


def _chunk_problem(commit: ChunkCommit) -> StateInconsistent | None:
    """What would be refused of a chunk set before touching the database."""
    if not commit.chunks:
        return StateInconsistent("refusing to store an empty chunk set")
    if [c.index for c in commit.chunks] != list(range(len(commit.chunks))):
        return StateInconsistent("chunk indexes are not contiguous from 0")
    return None


def _chunk_arrays(ordered: Sequence[ChunkCommit]) -> tuple[list[Any], ...]:
    """The parameters the chunk-storing functions take, in their order: the claims, the
    version snapshots, the replaced-sequence counts, then job i's chunks at positions
    ``first[i] .. first[i] + count[i] - 1`` of the chunk arrays (ids, texts, starts, ends,
    token counts, sha256s)."""
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
    return (
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
    )


def store_chunks_many(
    conn: Connection, commits: Sequence[ChunkCommit]
) -> list[EmbedSnapshot | int | Exception]:
    """Store each job's chunk set and start its embed step, for many jobs in one statement.
    One result per commit, in order: the :class:`EmbedSnapshot` the embed step continues from;
    the stored chunk count when the set was stored already (nothing written: the embed step
    prepares itself with :func:`begin_embedding`); or the error that refused this job alone."""
    problems = [_chunk_problem(c) for c in commits]
    results: list[EmbedSnapshot | int | Exception] = [p or StateInconsistent("") for p in problems]
    valid = _screen(problems, [c.claim.document_version_id for c in commits])
    if not valid:
        return results
    ordered = [commits[i] for i in valid]
    rows = conn.execute(
        """SELECT * FROM trioindex_store_chunks_many(
               %b::uuid[], %b::uuid[], %b::uuid[], %b::uuid[],
               %b::uuid[], %b::text[], %b::text[], %b::bigint[], %b::int[], %b::int[], %b::int[],
               %b::uuid[], %b::text[], %b::int[], %b::int[], %b::int[], %b::text[],
               %b::text[], %b::timestamptz[])""",
        (
            *_chunk_arrays(ordered),
            [_int_array(c.low_confidence_pages) for c in ordered],
            [c.snapshot.parse_started_at for c in ordered],
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


def begin_embedding(conn: Connection, claim: Claim) -> EmbedSnapshot:
    """The embed prepare of a claim whose chunk set is stored: the set in chunk order and the
    job's model, in one transaction (``trioindex_begin_embedding``, which also clears a
    partial vector set an earlier attempt left)."""
    with conn.transaction():
        with fenced_errors():
            row = conn.execute(
                "SELECT * FROM trioindex_begin_embedding(%s, %s, %s, %s)",
                (claim.job_id, claim.worker_id, claim.claim_token, claim.attempt_id),
            ).fetchone()
        assert row is not None
        chunks = conn.execute(
            """SELECT id, chunk_index, content FROM document_chunks
               WHERE document_version_id = %s AND chunking = %s ORDER BY chunk_index""",
            (row["version_id"], row["chunking"]),
        ).fetchall()
    refs = tuple(ChunkRef(c["id"], c["chunk_index"], c["content"]) for c in chunks)
    if [ref.index for ref in refs] != list(range(len(refs))):
        raise StateInconsistent("the version's chunk indexes are not contiguous from 0")
    return EmbedSnapshot(
        version_id=row["version_id"],
        document_id=row["document_id"],
        model_id=row["model_id"],
        model_name=row["model_name"],
        dimension=row["dimension"],
        chunks=refs,
        complete=row["existing"] == len(refs),
    )


@attrs.frozen
class EmbeddingDraft:
    """One validated vector for one chunk. ``vector`` is a read-only float32 row: 4 bytes per
    element instead of ~32 as a list of Python floats, and exactly what pgvector stores."""

    chunk_id: UUID
    chunk_index: int
    vector: npt.NDArray[np.float32] = attrs.field(repr=False, eq=False)
    dimension: int
    vector_sha256: str


@attrs.frozen
class EmbeddingCommit:
    """A slice of one job's validated vectors, ready for :func:`store_embeddings_many`: the
    drafts for chunks ``offset .. offset + len(drafts) - 1`` of the snapshot's set. The slice
    that ends the set completes the job."""

    claim: Claim
    snapshot: EmbedSnapshot
    drafts: Sequence[EmbeddingDraft] = attrs.field(repr=False)
    offset: int = 0

    @property
    def weight(self) -> int:
        return len(self.drafts)

    @property
    def last(self) -> bool:
        """Whether this slice ends the set (its commit completes the job)."""
        return self.offset + len(self.drafts) == len(self.snapshot.chunks)

    def problem(self) -> StateInconsistent | None:
        """What would be refused before touching the database."""
        snapshot = self.snapshot
        expected = snapshot.chunks[self.offset : self.offset + len(self.drafts)]
        if not self.drafts or [(d.chunk_id, d.chunk_index) for d in self.drafts] != [
            (c.id, c.index) for c in expected
        ]:
            return StateInconsistent("the drafts do not match the chunk set")
        if any(
            d.dimension != snapshot.dimension or len(d.vector) != d.dimension for d in self.drafts
        ):
            return StateInconsistent("a draft's dimension differs from the model's")
        return None


@attrs.frozen
class StoredSlice:
    """What storing one slice did: ``result`` is the completion's, once the slice ended the
    set (None before)."""

    result: CompleteResult | None


def store_embeddings_many(
    conn: Connection, commits: Sequence[EmbeddingCommit]
) -> list[StoredSlice | Exception]:
    """Store slices of vectors and complete each job whose set they end, for many jobs in one
    statement. One result per commit, in order: what it did, or the error that refused this
    job alone (its slice is then not stored either)."""
    problems = [c.problem() for c in commits]
    results: list[StoredSlice | Exception] = [p or StateInconsistent("") for p in problems]
    valid = _screen(problems, [c.claim.document_version_id for c in commits])
    if not valid:
        return results
    ordered = [commits[i] for i in valid]
    firsts: list[int] = []
    counts: list[int] = []
    chunk_ids: list[UUID] = []
    vectors: list[npt.NDArray[np.float32]] = []
    hashes: list[str] = []
    for commit in ordered:
        firsts.append(len(chunk_ids) + 1)
        counts.append(len(commit.drafts))
        for draft in commit.drafts:
            chunk_ids.append(draft.chunk_id)
            vectors.append(draft.vector)
            hashes.append(draft.vector_sha256)
    with conn.cursor(binary=True) as cursor:
        rows = cursor.execute(
            """SELECT * FROM trioindex_store_embeddings_many(
                   %b::uuid[], %b::uuid[], %b::uuid[], %b::uuid[], %b::uuid[], %b::uuid[],
                   %b::int[], %b::int[], %b::int[], %b::uuid[], %b::vector[], %b::text[])""",
            (
                *claim_arrays([c.claim for c in ordered]),
                [c.snapshot.version_id for c in ordered],
                [c.snapshot.model_id for c in ordered],
                firsts,
                counts,
                [c.offset for c in ordered],
                chunk_ids,
                vectors,
                hashes,
            ),
        ).fetchall()
    for position, row in zip(valid, rows, strict=True):
        refused = refusal_error(row["refusal"], row["message"])
        if refused is not None:
            results[position] = refused
        elif row["completed"]:
            results[position] = StoredSlice(CompleteResult(bool(row["became_current"])))
        else:
            results[position] = StoredSlice(None)
    return results


# ---------------------------------------------------------------------------------------------
# a small document's whole store


@attrs.frozen
class DocumentCommit:
    """A small document's chunk set and its vectors, embedded before anything of it was stored,
    ready for :func:`store_documents_many`: ``vectors`` name the chunks of ``chunks`` (their
    ids, in order) and end the set."""

    chunks: ChunkCommit
    vectors: EmbeddingCommit

    @property
    def weight(self) -> int:
        return len(self.chunks.chunks)

    def problem(self) -> StateInconsistent | None:
        """What would be refused before touching the database."""
        problem = _chunk_problem(self.chunks) or self.vectors.problem()
        if problem is not None:
            return problem
        if self.vectors.offset != 0 or not self.vectors.last:
            return StateInconsistent("a whole document's vectors are not its whole set")
        if [d.chunk_id for d in self.vectors.drafts] != list(self.chunks.ids):
            return StateInconsistent("the vectors do not name the chunks stored with them")
        return None


def whole_snapshot(
    commit: ChunkCommit, model_id: UUID, model_name: str, dimension: int
) -> EmbedSnapshot:
    """What the embed step embeds of a chunk set not stored yet (a small document, embedded
    before its one store): the chunks as parsed, the claim's model (``model_name`` of
    ``dimension``, the worker's own: it claims only its model's jobs), which the store checks
    against the model row by id and dimension."""
    return EmbedSnapshot(
        version_id=commit.snapshot.version_id,
        document_id=commit.snapshot.document_id,
        model_id=model_id,
        model_name=model_name,
        dimension=dimension,
        chunks=tuple(
            ChunkRef(chunk_id, chunk.index, chunk.text)
            for chunk_id, chunk in zip(commit.ids, commit.chunks, strict=True)
        ),
        complete=False,
    )


def store_documents_many(
    conn: Connection, commits: Sequence[DocumentCommit]
) -> list[StoredSlice | Exception]:
    """Store small documents whole, for many jobs in one statement: each job's chunk set, its
    vectors and its completion (``trioindex_store_documents_many``). One result per commit, in
    order: the completion's :class:`StoredSlice`, or the error that refused this job alone
    (nothing of it is then stored)."""
    problems = [c.problem() for c in commits]
    results: list[StoredSlice | Exception] = [p or StateInconsistent("") for p in problems]
    valid = _screen(problems, [c.chunks.claim.document_version_id for c in commits])
    if not valid:
        return results
    ordered = [commits[i] for i in valid]
    drafts = [d for c in ordered for d in c.vectors.drafts]
    with conn.cursor(binary=True) as cursor:
        rows = cursor.execute(
            """SELECT * FROM trioindex_store_documents_many(
                   %b::uuid[], %b::uuid[], %b::uuid[], %b::uuid[],
                   %b::uuid[], %b::text[], %b::text[], %b::bigint[], %b::int[], %b::int[],
                   %b::int[], %b::uuid[], %b::text[], %b::int[], %b::int[], %b::int[],
                   %b::text[], %b::timestamptz[], %b::uuid[], %b::int[], %b::vector[],
                   %b::text[])""",
            (
                *_chunk_arrays([c.chunks for c in ordered]),
                [c.chunks.snapshot.parse_started_at for c in ordered],
                [c.vectors.snapshot.model_id for c in ordered],
                [c.vectors.snapshot.dimension for c in ordered],
                [d.vector for d in drafts],
                [d.vector_sha256 for d in drafts],
            ),
        ).fetchall()
    for position, row in zip(valid, rows, strict=True):
        refused = refusal_error(row["refusal"], row["message"])
        if refused is not None:
            results[position] = refused
        else:
            results[position] = StoredSlice(CompleteResult(bool(row["became_current"])))
    return results
