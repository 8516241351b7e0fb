"""Query side: embed a question with the index's model, cosine search over current versions.

Only chunks of each document's current (searchable) version are returned. The query uses the
model's own partial HNSW index (``vector::vector(dim) <=> q``), with pgvector's iterative scan
so that filtering to current versions still fills ``top_k`` results.
"""

from __future__ import annotations

from uuid import UUID

import attrs
import numpy as np
import psycopg

from trioindex.db.models import EmbeddingModel
from trioindex.db.pool import Connection
from trioindex.embedding import Embedder
from trioindex.embedding.vectors import validate_vectors


@attrs.frozen
class SearchHit:
    rank: int
    score: float
    document_key: str
    document_id: UUID
    version_no: int
    chunk_index: int
    text: str = attrs.field(repr=False)

    def snippet(self, width: int = 160) -> str:
        flat = " ".join(self.text.split())
        return flat if len(flat) <= width else flat[: width - 1] + "…"


def search_vectors(
    conn: Connection, model: EmbeddingModel, query: list[float], top_k: int
) -> list[SearchHit]:
    dim = int(model.dimension)
    vector = np.asarray(query, dtype=np.float32)
    with conn.transaction():
        try:
            with conn.transaction():
                conn.execute("SET LOCAL hnsw.iterative_scan = strict_order")
        except psycopg.errors.UndefinedObject:
            pass  # pgvector < 0.8: plain index scan
        rows = conn.execute(
            f"""SELECT d.external_key, d.id AS document_id, v.version_no, c.chunk_index, c.content,
                       1 - (e.vector::vector({dim}) <=> %(q)s::vector({dim})) AS score
                FROM embeddings e
                JOIN documents d ON d.current_version_id = e.document_version_id
                JOIN document_versions v ON v.id = e.document_version_id
                JOIN document_chunks c ON c.id = e.chunk_id
                WHERE e.embedding_model_id = %(model)s
                ORDER BY e.vector::vector({dim}) <=> %(q)s::vector({dim})
                LIMIT %(k)s""",
            {"q": vector, "model": model.id, "k": top_k},
        ).fetchall()
    return [
        SearchHit(
            rank=i + 1,
            score=float(row["score"]),
            document_key=row["external_key"],
            document_id=row["document_id"],
            version_no=row["version_no"],
            chunk_index=row["chunk_index"],
            text=row["content"],
        )
        for i, row in enumerate(rows)
    ]


async def embed_query(embedder: Embedder, model: EmbeddingModel, text: str) -> list[float]:
    vectors = await embedder.embed([text])
    return validate_vectors(vectors, expected_count=1, dimension=model.dimension)[0]
