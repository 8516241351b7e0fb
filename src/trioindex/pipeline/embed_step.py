"""Embedding step: the job's chunks → validated vectors (docs/design/architecture.md, "Embed").

The worker embeds a job's chunk texts through its embedding coalescer
(:class:`~trioindex.embedding.batching.EmbeddingCoalescer`), which hands back one float32 row per
chunk, checked by the embedder that answered (:class:`~trioindex.embedding.vectors.Vectors`);
this module hashes each row and builds immutable drafts (:func:`drafts_from_matrix`),
which the worker stores with :func:`trioindex.db.steps.store_embeddings_many` in slices of at
most :data:`SLICE_ROWS` vectors: the slice that ends the set completes the job in the same
transaction.
"""

from __future__ import annotations

import hashlib

import numpy as np
import numpy.typing as npt

from trioindex.db.steps import EmbeddingDraft, EmbedSnapshot
from trioindex.errors import StateInconsistent

# Vectors stored per slice (one call of the group function): a larger set is stored in several
# slices, each in its own transaction, so no group array holds a large document twice.
SLICE_ROWS = 4096

# Rows converted to big-endian at a time to hash them (4 MiB at 1024 dimensions).
HASH_SLICE_ROWS = 1024


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
