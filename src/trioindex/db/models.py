"""Embedding model registry: one row per model, pinned to jobs, with its own HNSW index.

The ``embeddings.vector`` column has no fixed dimension so that several models can live side by
side; each model gets a partial HNSW cosine index over ``vector::vector(dim)`` restricted to its
rows, which is what lets ``ORDER BY vector::vector(dim) <=> query`` use the index.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

import attrs

from trioindex.db.pool import Connection
from trioindex.errors import ConfigError, NotFound


@attrs.frozen
class EmbeddingModel:
    id: UUID
    name: str
    dimension: int
    is_active: bool

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> EmbeddingModel:
        return cls(row["id"], row["name"], row["dimension"], row["is_active"])

    @property
    def index_name(self) -> str:
        return f"embeddings_hnsw_{self.id.hex[:16]}"


# Serialises registrations so that two processes starting at once do not race on the
# "at most one active model" index or on creating the same HNSW index.
_REGISTRY_LOCK = 0x74_72_69_6F_6D_64_6C


def ensure_model(conn: Connection, name: str, dimension: int) -> EmbeddingModel:
    """Register ``name`` on first use (active if no model is) and return it.

    A model already registered with another dimension is a configuration error: its stored
    vectors could never be compared with the new ones.
    """
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_REGISTRY_LOCK,))
        row = conn.execute("SELECT * FROM embedding_models WHERE name = %s", (name,)).fetchone()
        if row is not None:
            model = EmbeddingModel.from_row(row)
            if model.dimension != dimension:
                raise ConfigError(
                    f"embedding.dimension: model {name!r} is registered with dimension "
                    f"{model.dimension}, the configuration says {dimension}"
                )
            return model
        row = conn.execute(
            """INSERT INTO embedding_models (name, dimension, is_active)
               VALUES (%s, %s, NOT EXISTS (SELECT 1 FROM embedding_models WHERE is_active))
               RETURNING *""",
            (name, dimension),
        ).fetchone()
        assert row is not None
        model = EmbeddingModel.from_row(row)
        if dimension <= 2000:  # pgvector's HNSW limit for the vector type
            conn.execute(
                f"""CREATE INDEX {model.index_name} ON embeddings
                    USING hnsw ((vector::vector({int(dimension)})) vector_cosine_ops)
                    WHERE embedding_model_id = '{model.id}'"""
            )
    return model


def get_model(conn: Connection, model_id: UUID) -> EmbeddingModel:
    row = conn.execute("SELECT * FROM embedding_models WHERE id = %s", (model_id,)).fetchone()
    if row is None:
        raise NotFound(f"no embedding model with id {model_id}")
    return EmbeddingModel.from_row(row)


def find_model(conn: Connection, name: str) -> EmbeddingModel | None:
    row = conn.execute("SELECT * FROM embedding_models WHERE name = %s", (name,)).fetchone()
    return EmbeddingModel.from_row(row) if row else None
