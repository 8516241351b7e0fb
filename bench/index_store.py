"""trioindex's store path into an indexed model, for ``bench.index_scale``.

Owns :func:`load_base` (a model whose ``embeddings`` already hold N vectors — one document
with N chunks, loaded by COPY — and its default index, built by
:func:`~trioindex.db.vector_index.build_vector_index`), :func:`enqueue_documents` and
:func:`store_documents` (more vectors indexed as one-chunk documents through the worker's group statements, as
``bench.sql_floor`` writes them).
"""

from __future__ import annotations

import io
import uuid
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt

from bench.harness import chunk_texts
from bench.sql_floor import GROUP, Corpus, Setup, group_functions
from testkit.jobs import enqueue_text
from trioindex.db.jobs import claim_jobs, register_worker
from trioindex.db.models import EmbeddingModel, ensure_model
from trioindex.db.pool import Connection, connect
from trioindex.db.vector_index import build_vector_index

MODEL = "index-scale-model"
_DAY = 86_400.0


def register_bench_worker(conn: Connection) -> uuid.UUID:
    """A registered worker that claims groups of :data:`bench.sql_floor.GROUP`."""
    return register_worker(
        conn,
        hostname="bench",
        pid=1,
        version="bench",
        max_concurrency=GROUP,
        chunking="characters",
    )


def load_base(url: str, base: npt.NDArray[np.float32]) -> EmbeddingModel:
    """The model with ``base`` stored as one document's chunks, and its index built."""
    dim = int(base.shape[1])
    with connect(url) as conn:
        model = ensure_model(conn, MODEL, dim)
        doc = enqueue_text(conn, model.id, "base", b"base")
        # the base document's job stays claimed (a day's lease): the store run claims only its own
        claim_jobs(conn, register_bench_worker(conn), 1, _DAY)
        version = Version(doc.document_id, doc.version_id)
        with conn.transaction():
            ids = add_chunks(conn, version, 0, len(base))
            copy_embeddings(conn, model, version, ids, base)
        conn.execute("SET maintenance_work_mem = '1GB'")
        if not build_vector_index(conn, model, min_vectors=1):
            raise RuntimeError("the default index was not built")
    return model


@attrs.frozen
class Version:
    document_id: uuid.UUID
    version_id: uuid.UUID


def add_chunks(conn: Connection, doc: Version, first: int, count: int) -> list[Any]:
    """``count`` placeholder chunks of ``doc`` from index ``first``; their ids in order."""
    return [
        r["id"]
        for r in conn.execute(
            """INSERT INTO document_chunks (document_id, document_version_id, chunk_index,
                   content, char_start, char_end, token_count, content_sha256)
               SELECT %s, %s, i, 'x', 0, 1, 1, repeat('b', 64)
               FROM generate_series(%s::int, %s::int - 1) AS i RETURNING id, chunk_index""",
            (doc.document_id, doc.version_id, first, first + count),
        ).fetchall()
    ]


def copy_embeddings(
    conn: Connection,
    model: EmbeddingModel,
    doc: Version,
    chunk_ids: list[Any],
    vectors: npt.NDArray[np.float32],
) -> None:
    """One ``embeddings`` row per chunk of ``doc`` with its vector, by one text COPY."""
    rows = io.StringIO()
    for chunk_id, vector in zip(chunk_ids, vectors, strict=True):
        text = ",".join(f"{x:.7g}" for x in vector)
        rows.write(
            f"{chunk_id}\t{doc.document_id}\t{doc.version_id}\t{model.id}\t[{text}]"
            f"\t{model.dimension}\t{'c' * 64}\n"
        )
    copy_sql = """COPY embeddings (chunk_id, document_id, document_version_id,
                      embedding_model_id, vector, dimension, vector_sha256) FROM STDIN"""
    with conn.cursor().copy(copy_sql) as copy:
        copy.write(rows.getvalue())


def base_document(conn: Connection) -> Version:
    """The document version :func:`load_base` stored the base vectors in."""
    row = conn.execute(
        """SELECT d.id AS document_id, v.id AS version_id FROM documents d
           JOIN document_versions v ON v.document_id = d.id WHERE d.external_key = 'base'"""
    ).fetchone()
    if row is None:
        raise RuntimeError("no base document")
    return Version(row["document_id"], row["version_id"])


def enqueue_documents(
    url: str, model: EmbeddingModel, vectors: npt.NDArray[np.float32]
) -> tuple[Corpus, Setup]:
    """One pending one-chunk document per vector, and the worker that will write them."""
    corpus = Corpus(chunk_texts(len(vectors), characters=600, salt="index"), vectors)
    with connect(url) as conn:
        with conn.transaction():
            for i, text in enumerate(corpus.texts):
                enqueue_text(conn, model.id, f"d{i}", text.encode())
        return corpus, Setup(model.id, register_bench_worker(conn), GROUP)


def store_documents(url: str, corpus: Corpus, setup: Setup) -> int:
    """Claim, parse, chunk and store every pending document's vector; documents written."""
    with connect(url) as conn:
        return group_functions(conn, corpus, setup)
