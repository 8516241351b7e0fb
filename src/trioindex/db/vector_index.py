"""A model's HNSW index: built once the model has enough vectors, exact search below that.

Maintaining an HNSW index row by row is the largest PostgreSQL cost of indexing small
documents (about 1 ms of server CPU per 768-dimension vector, docs/test-results/peer.md), and
below a few thousand vectors an exact scan answers a query as fast and with recall 1. So a
model is registered without an index (:func:`trioindex.db.models.ensure_model`), and once it
has ``embedding.index-min-vectors`` vectors a worker builds one (:func:`build_vector_index`,
called by :class:`trioindex.worker.index_keeper.VectorIndexKeeper`) — as pgai does, and as
pgvector advises (an index built over loaded rows is faster to build than one grown row by row).

Search ranks with ``ORDER BY vector::vector(dim) <=> query`` either way: the planner uses the
index once it is valid and scans the model's rows exactly until then.

The build is ``CREATE INDEX CONCURRENTLY``: writers (other workers' commits) go on meanwhile.
One process builds at a time (a session advisory lock per model; the others skip). A build that
was interrupted leaves an INVALID index, which PostgreSQL still maintains on every insert but
never uses: the next check drops it and builds again.
"""

from __future__ import annotations

import enum
import logging

from trioindex.db.models import INDEX_BUILD_LOCK, EmbeddingModel
from trioindex.db.pool import Connection

logger = logging.getLogger(__name__)

# pgvector's HNSW limit for the vector type: larger models are always searched exactly.
HNSW_MAX_DIMENSION = 2000


class IndexState(enum.StrEnum):
    MISSING = "missing"
    INVALID = "invalid"  # an interrupted concurrent build: maintained on insert, never used
    VALID = "valid"


def index_state(conn: Connection, model: EmbeddingModel) -> IndexState:
    row = conn.execute(
        """SELECT i.indisvalid FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid
           WHERE c.relname = %s AND c.relnamespace = current_schema()::regnamespace""",
        (model.index_name,),
    ).fetchone()
    if row is None:
        return IndexState.MISSING
    return IndexState.VALID if row["indisvalid"] else IndexState.INVALID


def has_vectors(conn: Connection, model: EmbeddingModel, count: int) -> bool:
    """Whether the model has at least ``count`` vectors (reads at most ``count`` rows)."""
    row = conn.execute(
        """SELECT count(*) AS n FROM (SELECT 1 FROM embeddings
                                     WHERE embedding_model_id = %s LIMIT %s) s""",
        (model.id, count),
    ).fetchone()
    return row is not None and row["n"] >= count


def create_index_sql(model: EmbeddingModel) -> str:
    """The model's partial HNSW cosine index over ``vector::vector(dim)``, built concurrently."""
    return (
        f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {model.index_name} ON embeddings"
        f" USING hnsw ((vector::vector({int(model.dimension)})) vector_cosine_ops)"
        f" WHERE embedding_model_id = '{model.id}'"
    )


def build_vector_index(conn: Connection, model: EmbeddingModel, *, min_vectors: int) -> bool:
    """Build ``model``'s HNSW index if it has ``min_vectors`` vectors and no valid index yet;
    True when this call built it.

    ``conn`` must be in autocommit mode and outside a transaction (a concurrent build is not
    allowed in one). Returns False at once when another session is building it.
    """
    if model.dimension > HNSW_MAX_DIMENSION:
        return False
    lock = conn.execute(
        "SELECT pg_try_advisory_lock(%s::int, hashtext(%s)) AS got",
        (INDEX_BUILD_LOCK, str(model.id)),
    ).fetchone()
    if lock is None or not lock["got"]:
        return False
    try:
        still = conn.execute("SELECT 1 FROM embedding_models WHERE id = %s", (model.id,)).fetchone()
        if still is None:
            return False  # removed (under this lock, so no removal runs now)
        state = index_state(conn, model)
        if state is IndexState.VALID or not has_vectors(conn, model, min_vectors):
            return False
        if state is IndexState.INVALID:
            logger.info("dropping the interrupted HNSW index build of model %s", model.name)
            conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {model.index_name}")
        logger.info("building the HNSW index of model %s (%s+ vectors)", model.name, min_vectors)
        conn.execute(create_index_sql(model))
        return True
    finally:
        if not conn.closed:  # a lost session released its lock with it
            conn.execute(
                "SELECT pg_advisory_unlock(%s::int, hashtext(%s))",
                (INDEX_BUILD_LOCK, str(model.id)),
            )
