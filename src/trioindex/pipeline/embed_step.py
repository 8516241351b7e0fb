"""Embedding step: the version's chunks → validated vectors stored atomically
(docs/design/architecture.md, "Embed").

prepare: under job then version lock, ``CHUNKED → EMBEDDING`` (with ``EMBEDDING_STARTED``, first
call only) or resume ``EMBEDDING``; read the chunks in ``chunk_index`` order and the job's
pinned model (never "the active model"). A complete embedding set is a replay with no external
call; a partial set is ``INDEXING_STATE_INCONSISTENT``.

outside any transaction: embed the chunk texts in order, validate every vector, hash it, and
build immutable drafts.

commit: lock again in the same order, re-validate ownership with a fresh clock, check the chunk
set and model still match the snapshot, then insert every embedding in one COPY — all or
nothing. A late concurrent caller finds the finished set and replays it. The version stays
``EMBEDDING``: completion belongs to the lifecycle's complete step.

Grouped (the worker's path): the commit and the job's completion are one subtransaction of
``trioindex_store_embeddings_many`` (migration 0005), which the worker's group committer runs
for many jobs at once (:func:`store_embeddings_many`); the vectors come from the worker-wide
embedding coalescer (:class:`~trioindex.embedding.batching.EmbeddingCoalescer`).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from uuid import UUID

import attrs
import numpy as np
import numpy.typing as npt

from trioindex.db.events import record_claim_event
from trioindex.db.fence import claim_arrays, lock_owned_job, refusal_error
from trioindex.db.jobs import set_progress
from trioindex.db.pool import Connection, Database
from trioindex.db.versions import lock_version, mark_embedding
from trioindex.embedding import Embedder
from trioindex.embedding.vectors import validate_vectors
from trioindex.errors import StateInconsistent
from trioindex.values import Claim, CompleteResult, VersionStatus

logger = logging.getLogger(__name__)

# Batches per embed call in run_embed_step: enough to keep the worker's request slots busy.
SLICE_BATCHES = 8
# Rows converted to big-endian at a time to hash them (4 MiB at 1024 dimensions).
HASH_SLICE_ROWS = 1024

PROGRESS_EMBEDDING = 50
# INDEXED: another model's job indexed the version; this job embeds the same stored chunks
# for its own model (a model switch), without touching what the other model serves.
_EMBEDDABLE = frozenset({VersionStatus.CHUNKED, VersionStatus.EMBEDDING, VersionStatus.INDEXED})
PROGRESS_EMBEDDED = 90


@attrs.frozen
class ChunkRef:
    id: UUID
    index: int
    text: str = attrs.field(repr=False)


@attrs.frozen
class EmbedSnapshot:
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


@attrs.frozen
class EmbeddingDraft:
    """One validated vector for one chunk. ``vector`` is a read-only float32 row: 4 bytes per
    element instead of ~32 as a list of Python floats, and exactly what pgvector stores."""

    chunk_id: UUID
    chunk_index: int
    vector: npt.NDArray[np.float32] = attrs.field(repr=False, eq=False)
    dimension: int
    vector_sha256: str


def _existing_embeddings(conn: Connection, version_id: UUID, model_id: UUID) -> int:
    row = conn.execute(
        """SELECT count(*) AS n FROM embeddings
           WHERE document_version_id = %s AND embedding_model_id = %s""",
        (version_id, model_id),
    ).fetchone()
    return int(row["n"]) if row else 0


def _chunk_refs(conn: Connection, version_id: UUID, chunking: str) -> tuple[ChunkRef, ...]:
    rows = conn.execute(
        """SELECT id, chunk_index, content FROM document_chunks
           WHERE document_version_id = %s AND chunking = %s ORDER BY chunk_index""",
        (version_id, chunking),
    ).fetchall()
    refs = tuple(ChunkRef(row["id"], row["chunk_index"], row["content"]) for row in rows)
    if not refs:
        raise StateInconsistent("the version has no chunks to embed")
    if [ref.index for ref in refs] != list(range(len(refs))):
        raise StateInconsistent("the version's chunk indexes are not contiguous from 0")
    return refs


def prepare_embedding(conn: Connection, claim: Claim) -> EmbedSnapshot:
    with conn.transaction():
        owned = lock_owned_job(conn, claim)
        version = lock_version(conn, owned.document_version_id)
        status = VersionStatus(version["status"])
        if status not in _EMBEDDABLE:
            raise StateInconsistent(
                f"cannot embed: version is {status}, expected CHUNKED, EMBEDDING or INDEXED"
            )
        model = conn.execute(
            "SELECT id, name, dimension FROM embedding_models WHERE id = %s",
            (owned.embedding_model_id,),
        ).fetchone()
        if model is None:
            raise StateInconsistent("the job's embedding model no longer exists")
        chunks = _chunk_refs(conn, version["id"], owned.chunking)
        existing = _existing_embeddings(conn, version["id"], model["id"])
        if 0 < existing < len(chunks) or existing > len(chunks):
            raise StateInconsistent(
                f"partial embedding set: {existing} embeddings for {len(chunks)} chunks"
            )
        if status is VersionStatus.CHUNKED:
            if existing:
                raise StateInconsistent("embeddings exist for a version that is only CHUNKED")
            mark_embedding(conn, version["id"])
            set_progress(conn, claim.job_id, PROGRESS_EMBEDDING)
            record_claim_event(
                conn,
                "EMBEDDING_STARTED",
                claim,
                version["id"],
                {"chunks": len(chunks), "model": model["name"]},
            )
    return EmbedSnapshot(
        version_id=version["id"],
        document_id=version["document_id"],
        model_id=model["id"],
        model_name=model["name"],
        dimension=model["dimension"],
        chunks=chunks,
        complete=existing == len(chunks),
    )


def as_float32(vectors: object, *, expected_count: int, dimension: int) -> npt.NDArray[np.float32]:
    """Validate an embedder's answer and keep it as a float32 matrix (4 bytes per element;
    a list of Python floats costs ~32)."""
    checked = validate_vectors(vectors, expected_count=expected_count, dimension=dimension)
    return np.asarray(checked, dtype=np.float32).reshape(len(checked), dimension)


def build_drafts(snapshot: EmbedSnapshot, vectors: object) -> list[EmbeddingDraft]:
    """Validate the embedder's answer against the snapshot and hash every vector."""
    matrix = as_float32(vectors, expected_count=len(snapshot.chunks), dimension=snapshot.dimension)
    return drafts_from_matrix(snapshot, matrix)


def drafts_from_matrix(
    snapshot: EmbedSnapshot, matrix: npt.NDArray[np.float32]
) -> list[EmbeddingDraft]:
    """Drafts for already validated vectors, one row per chunk in chunk order."""
    if matrix.shape != (len(snapshot.chunks), snapshot.dimension):
        raise StateInconsistent("the vectors do not match the chunk set")
    matrix.flags.writeable = False
    # the hash is over big-endian binary32 bytes (vector_sha256's definition), computed per row
    # from one conversion per slice instead of a struct.pack per vector; slices, not the whole
    # matrix, so a document of 20,000 vectors does not hold a second 80 MB copy
    hashes: list[str] = []
    for start in range(0, len(matrix), HASH_SLICE_ROWS):
        big_endian = matrix[start : start + HASH_SLICE_ROWS].astype(">f4")
        hashes.extend(hashlib.sha256(row.tobytes()).hexdigest() for row in big_endian)
    return [
        EmbeddingDraft(
            chunk_id=chunk.id,
            chunk_index=chunk.index,
            vector=matrix[row],
            dimension=snapshot.dimension,
            vector_sha256=hashes[row],
        )
        for row, chunk in enumerate(snapshot.chunks)
    ]


_COPY_EMBEDDINGS = """COPY embeddings
    (chunk_id, document_id, document_version_id, embedding_model_id, vector, dimension,
     vector_sha256) FROM STDIN WITH (FORMAT BINARY)"""


def commit_embeddings(
    conn: Connection, claim: Claim, snapshot: EmbedSnapshot, drafts: Sequence[EmbeddingDraft]
) -> bool:
    """Store every draft in one transaction; True if stored now, False if replayed."""
    with conn.transaction():
        owned = lock_owned_job(conn, claim)
        version = lock_version(conn, owned.document_version_id)
        if (
            version["id"] != snapshot.version_id
            or version["document_id"] != snapshot.document_id
            or owned.embedding_model_id != snapshot.model_id
        ):
            raise StateInconsistent("the job's version or model changed since embedding began")
        if version["status"] not in (VersionStatus.EMBEDDING, VersionStatus.INDEXED):
            raise StateInconsistent(
                f"cannot store embeddings: version is {version['status']}, expected EMBEDDING"
            )
        current = conn.execute(
            """SELECT id, chunk_index FROM document_chunks
               WHERE document_version_id = %s AND chunking = %s ORDER BY chunk_index""",
            (snapshot.version_id, owned.chunking),
        ).fetchall()
        if [(r["id"], r["chunk_index"]) for r in current] != [
            (c.id, c.index) for c in snapshot.chunks
        ]:
            raise StateInconsistent("the version's chunks changed since embedding began")
        existing = _existing_embeddings(conn, snapshot.version_id, snapshot.model_id)
        if existing == len(snapshot.chunks):
            return False  # a concurrent caller stored the set first
        if existing:
            raise StateInconsistent(
                f"partial embedding set: {existing} embeddings for {len(snapshot.chunks)} chunks"
            )
        if [(d.chunk_id, d.chunk_index) for d in drafts] != [
            (c.id, c.index) for c in snapshot.chunks
        ]:
            raise StateInconsistent("the drafts do not match the chunk set")
        if any(d.dimension != snapshot.dimension or len(d.vector) != d.dimension for d in drafts):
            raise StateInconsistent("a draft's dimension differs from the model's")
        with conn.cursor().copy(_COPY_EMBEDDINGS) as copy:
            copy.set_types(["uuid", "uuid", "uuid", "uuid", "vector", "int4", "text"])
            for draft in drafts:
                copy.write_row(
                    (
                        draft.chunk_id,
                        snapshot.document_id,
                        snapshot.version_id,
                        snapshot.model_id,
                        draft.vector,
                        draft.dimension,
                        draft.vector_sha256,
                    )
                )
        set_progress(conn, claim.job_id, PROGRESS_EMBEDDED)
        record_claim_event(
            conn,
            "EMBEDDINGS_STORED",
            claim,
            snapshot.version_id,
            {"embeddings": len(drafts), "model": snapshot.model_name},
        )
    return True


@attrs.frozen
class EmbeddingCommit:
    """One job's validated vectors, ready for :func:`store_embeddings_many`."""

    claim: Claim
    snapshot: EmbedSnapshot
    drafts: Sequence[EmbeddingDraft] = attrs.field(repr=False)

    @property
    def weight(self) -> int:
        return len(self.drafts)

    def problem(self) -> StateInconsistent | None:
        """What :func:`commit_embeddings` would refuse before touching the database."""
        snapshot = self.snapshot
        if [(d.chunk_id, d.chunk_index) for d in self.drafts] != [
            (c.id, c.index) for c in snapshot.chunks
        ]:
            return StateInconsistent("the drafts do not match the chunk set")
        if any(
            d.dimension != snapshot.dimension or len(d.vector) != d.dimension for d in self.drafts
        ):
            return StateInconsistent("a draft's dimension differs from the model's")
        return None


def store_embeddings_many(
    conn: Connection, commits: Sequence[EmbeddingCommit]
) -> list[CompleteResult | Exception]:
    """Store every job's vectors and complete the job, for many jobs in one statement
    (``trioindex_store_embeddings_many``, migration 0005). One result per commit, in order:
    the completion's result, or the error that refused this job alone (its vectors are then
    not stored either)."""
    results: list[CompleteResult | Exception] = [StateInconsistent("no result")] * len(commits)
    valid: list[int] = []
    for position, commit in enumerate(commits):
        problem = commit.problem()
        if problem is not None:
            results[position] = problem
        else:
            valid.append(position)
    if not valid:
        return results
    valid.sort(key=lambda i: commits[i].claim.document_version_id)
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
                   %b::int[], %b::int[], %b::uuid[], %b::vector[], %b::text[])""",
            (
                *claim_arrays([c.claim for c in ordered]),
                [c.snapshot.version_id for c in ordered],
                [c.snapshot.model_id for c in ordered],
                firsts,
                counts,
                chunk_ids,
                vectors,
                hashes,
            ),
        ).fetchall()
    for position, row in zip(valid, rows, strict=True):
        refused = refusal_error(row["refusal"], row["message"])
        results[position] = (
            refused if refused is not None else CompleteResult(bool(row["became_current"]))
        )
    return results


async def run_embed_step(claim: Claim, *, db: Database, embedder: Embedder) -> int:
    """Run the whole step for ``claim``; return the number of embeddings the version has."""
    snapshot = await db.run(prepare_embedding, claim)
    if snapshot.complete:
        logger.debug("job %s: embedding set already complete, step replayed", claim.job_id)
        return len(snapshot.chunks)
    texts = [chunk.text for chunk in snapshot.chunks]
    # Embed in slices of a few batches and keep each slice as float32 at once: the embedder
    # answers with lists of Python floats, and holding those for a document of thousands of
    # chunks costs ~35 MiB per MB of text. A slice still fills every request slot.
    size = max(1, embedder.info.max_batch_size) * SLICE_BATCHES
    parts = []
    for start in range(0, len(texts), size):
        piece = texts[start : start + size]
        answer = await embedder.embed(piece)
        parts.append(as_float32(answer, expected_count=len(piece), dimension=snapshot.dimension))
        del answer
    drafts = drafts_from_matrix(snapshot, np.concatenate(parts))
    await db.run(commit_embeddings, claim, snapshot, drafts)
    return len(drafts)
