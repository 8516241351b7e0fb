"""Indexed documents written straight into a migrated database, for the search tests and the
search benchmark: what a worker leaves behind (document → current version ``INDEXED`` → chunks
→ embeddings of one model), without storage, parsing or an embedder, and with vectors the
caller chooses. Everything goes in with ``COPY`` in one transaction, so 100k chunks take
seconds."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable, Sequence
from uuid import UUID

import attrs
import numpy as np

from trioindex.db.models import EmbeddingModel
from trioindex.db.pool import Connection


@attrs.frozen
class IndexedDocument:
    """One document's current version: its chunks' texts and (unit or not) vectors."""

    key: str
    texts: Sequence[str]
    vectors: Sequence[Sequence[float]] | np.ndarray
    content_type: str | None = "text/plain"


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def store_indexed(
    conn: Connection, model: EmbeddingModel, documents: Iterable[IndexedDocument]
) -> dict[str, UUID]:
    """Store each document as version 1, ``INDEXED`` and current; return key → document id."""
    ids: dict[str, UUID] = {}
    with conn.transaction():
        docs: list[tuple[object, ...]] = []
        versions: list[tuple[object, ...]] = []
        chunks: list[tuple[object, ...]] = []
        embeddings: list[tuple[UUID, UUID, UUID, np.ndarray]] = []
        for doc in documents:
            assert len(doc.texts) == len(doc.vectors), doc.key
            doc_id, version_id = uuid.uuid4(), uuid.uuid4()
            ids[doc.key] = doc_id
            docs.append((doc_id, doc.key))
            size = sum(len(t.encode()) for t in doc.texts)
            versions.append(
                (
                    version_id,
                    doc_id,
                    1,
                    f"sha256/{doc.key}",
                    doc.key,
                    doc.content_type,
                    size,
                    _sha(doc.key),
                )
            )
            at = 0
            for index, (text, vector) in enumerate(zip(doc.texts, doc.vectors, strict=True)):
                chunk_id = uuid.uuid4()
                chunks.append(
                    (
                        chunk_id,
                        doc_id,
                        version_id,
                        index,
                        text,
                        at,
                        at + len(text),
                        len(text) // 4 + 1,
                        _sha(text),
                    )
                )
                at += len(text) + 2
                embeddings.append((chunk_id, doc_id, version_id, np.asarray(vector, np.float32)))
        with conn.cursor().copy("COPY documents (id, external_key) FROM STDIN") as copy:
            for row in docs:
                copy.write_row(row)
        with conn.cursor().copy(
            """COPY document_versions (id, document_id, version_no, storage_key, original_name,
                   content_type, byte_size, sha256)
               FROM STDIN"""
        ) as copy:
            for version in versions:
                copy.write_row(version)
        with conn.cursor().copy(
            """COPY document_chunks (id, document_id, document_version_id, chunk_index, content,
                   char_start, char_end, token_count, content_sha256) FROM STDIN"""
        ) as copy:
            for chunk in chunks:
                copy.write_row(chunk)
        with conn.cursor().copy(
            """COPY embeddings (chunk_id, document_id, document_version_id, embedding_model_id,
                   vector, dimension, vector_sha256) FROM STDIN WITH (FORMAT BINARY)"""
        ) as copy:
            copy.set_types(["uuid", "uuid", "uuid", "uuid", "vector", "int4", "text"])
            for chunk_id, doc_id, version_id, vector in embeddings:
                sha = hashlib.sha256(vector.astype(">f4").tobytes()).hexdigest()
                copy.write_row(
                    (chunk_id, doc_id, version_id, model.id, vector, model.dimension, sha)
                )
        conn.execute(
            """INSERT INTO served_versions
                   (document_id, embedding_model_id, document_version_id, chunks, text_length)
               SELECT v.document_id, %(model)s, v.id, t.chunks, t.text_length
               FROM document_versions v
               CROSS JOIN LATERAL trioindex_served_statistics(v.id, %(model)s) AS t
               WHERE v.document_id = ANY(%(documents)s)""",
            {"model": model.id, "documents": list(ids.values())},
        )
    return ids
