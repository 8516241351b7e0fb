"""Jobs made by hand in a migrated database, for the database tests and the queue benchmark:
a text document enqueued the way ingest does it, and a version staged as parse + embed leave it."""

from __future__ import annotations

import hashlib
from uuid import UUID

from trioindex.db.pool import Connection
from trioindex.ingest import IngestResult, enqueue_version, storage_key_for


def enqueue_text(
    conn: Connection,
    model_id: UUID,
    key: str,
    data: bytes,
    *,
    max_attempts: int = 3,
    priority: int = 0,
) -> IngestResult:
    """Document ``key`` (``key.txt``, content ``data``) + version + PENDING job, with NOTIFY."""
    sha = hashlib.sha256(data).hexdigest()
    return enqueue_version(
        conn,
        document_key=key,
        storage_key=storage_key_for(sha),
        original_name=f"{key}.txt",
        content_type="text/plain",
        byte_size=len(data),
        sha256=sha,
        model_id=model_id,
        max_attempts=max_attempts,
        priority=priority,
    )


def stage_embedded(
    conn: Connection,
    version_id: UUID,
    document_id: UUID,
    model_id: UUID,
    *,
    dimension: int = 4,
    chunks: int = 1,
) -> None:
    """Give the version a chunk set with the model's full embedding set (what parse + embed
    leave before the completion)."""
    vector = "[" + ",".join(["0.5"] * dimension) + "]"
    for index in range(chunks):
        chunk = conn.execute(
            """INSERT INTO document_chunks (document_id, document_version_id, chunk_index, content,
                   char_start, char_end, token_count, content_sha256)
               VALUES (%s, %s, %s, 'x', 0, 1, 1, %s) RETURNING id""",
            (document_id, version_id, index, "b" * 64),
        ).fetchone()
        assert chunk is not None
        conn.execute(
            """INSERT INTO embeddings (chunk_id, document_id, document_version_id, embedding_model_id,
                   vector, dimension, vector_sha256) VALUES (%s, %s, %s, %s, %s, %s, %s)""",
            (chunk["id"], document_id, version_id, model_id, vector, dimension, "c" * 64),
        )
