"""A model's vector index: HNSW over the vectors' sign bits, built once the model has enough
vectors, with an exact re-rank at query time; exact search below that.

**What is indexed.** Each vector's ``binary_quantize(vector::vector(dim))::bit(dim)`` (one
bit per dimension: its sign; the SQL function ``trioindex_sign_bits_sql`` writes that text for
the index and for the ranking alike, :func:`quantized_sql`) in an HNSW graph under Hamming
distance (``bit_hamming_ops``; m = 16, ef_construction = 64, and m = 12,
ef_construction = 48 below 768 dimensions: :func:`hnsw_parameters`). A query takes the
:data:`RERANK_FACTOR` (20) × k nearest by Hamming distance through the graph
(:data:`NARROW_RERANK_FACTOR`, 40, below 768 dimensions) and orders them by the exact
cosine distance of the stored float32 vectors
(:func:`trioindex.db.search.nearest_chunks`). Chosen by the at-scale benchmark
(docs/test-results/index-scale.md: clustered 1024-dimension vectors and the local model's
vectors of real text): the bit graph is a twentieth of the float32 one's size and costs a fifth
to a quarter (1024 dimensions) to about a third (384) of its PostgreSQL CPU per inserted
vector; with those candidates re-ranked its recall@10 was 0.97–0.99 on those sets.
Sign bits need structured vectors: on near-random ones (no neighbourhoods) the candidates
miss, which model embeddings are not. pgvector indexes bits up to 64,000 dimensions (the
float32 graph stops at 2,000), so every model a ``vector`` column can hold (16,000) gets an
index.

**When.** Maintaining an HNSW index row by row is the largest PostgreSQL cost of indexing small
documents, and below a few thousand vectors an exact scan answers a query as fast and with
recall 1. So a model is registered without an index (:func:`trioindex.db.models.ensure_model`),
and once it has ``embedding.index-min-vectors`` vectors a worker builds one
(:func:`build_vector_index`, called by :class:`trioindex.worker.index_keeper.VectorIndexKeeper`)
— as pgai does, and as pgvector advises (an index built over loaded rows is faster to build
than one grown row by row). A first build that comes due during a bulk load (a job of the
model under way or due) waits for the load to end, up to :data:`DEFER_FACTOR` times the
threshold (:func:`build_deferred`): every vector stored after the build starts pays the graph's
upkeep row by row, about 2 ms of PostgreSQL CPU per 768-dimension vector between 18,000 and
20,000, against about 0.34 ms per vector for a build over the loaded rows
(docs/test-results/peer.md, "Where a 20,000-document run's wall time goes"). Search ranks
exactly (``ORDER BY vector::vector(dim) <=> query``) until the index is valid
(``trioindex_nearest_chunks`` checks, in the ranking's own statement): at 768 dimensions on
a loaded machine ~135 ms a ranking at 10,000 vectors, ~250 at 20,000 and ~780 at 50,000
(docs/test-results/peer.md), which is what bounds the wait.

The build is ``CREATE INDEX CONCURRENTLY``: writers (other workers' commits) go on meanwhile.
A draining worker may send a first build and leave it to PostgreSQL (:func:`send_first_build`,
docs/design/architecture.md says when).
One process builds at a time (a session advisory lock per model; the others skip). A build that
was interrupted leaves an INVALID index, which PostgreSQL still maintains on every insert but
never uses: the next check drops it and builds again. A database indexed by an older release
has the model's float32 HNSW index (:attr:`EmbeddingModel.retired_index_name`): the next check
builds the bit index beside it, whatever the vector count, then drops the old one, both
concurrently, so search never loses its index. A bit graph built with other parameters than
:func:`hnsw_parameters`'s is rebuilt the same way: the new graph is built beside it
(:attr:`EmbeddingModel.next_index_name`), the two swap names in one transaction (a rename
blocks neither writers nor searches), and the old one is dropped; a rebuild interrupted at any
step is finished by the next check.
"""

from __future__ import annotations

import enum
import logging

from trioindex.db.models import INDEX_BUILD_LOCK, EmbeddingModel
from trioindex.db.pool import Connection

logger = logging.getLogger(__name__)

# pgvector's HNSW limit for the bit type (the vector type itself stops at 16,000).
BIT_HNSW_MAX_DIMENSION = 64_000
# HNSW build parameters of the bit graph (docs/test-results/index-scale.md, runs 5 and 6).
# pgvector's defaults (16, 64) from NARROW_DIMENSION up: at 1024 dimensions they cost a fifth
# to a quarter of float32 HNSW's insert CPU, and thinner graphs lost recall at 200,000
# clustered vectors (0.92 at (12, 48) against 0.99). Below it a Hamming distance costs next to
# nothing and the graph's own work is the insert: (16, 64) cost 0.52-0.59x float32 HNSW at 384
# dimensions, (12, 48) 0.36x with the same recall on the local model's vectors of real text.
HNSW_M, HNSW_EF_CONSTRUCTION = 16, 64
NARROW_HNSW_M, NARROW_HNSW_EF_CONSTRUCTION = 12, 48
NARROW_DIMENSION = 768
# A query's candidates from the bit graph, per result, re-ranked by exact cosine. From 768
# dimensions 20: recall@10 0.99 at 200,000 clustered 1024-d vectors (0.84 at 10). Below, the
# sign bits say less and 40: on 52,000 of the local model's 384-d vectors of real text recall@10
# was 0.89 at 10, 0.93-0.94 at 20 and 0.97 at 40 (float32 HNSW at ef_search 40: 0.95).
RERANK_FACTOR = 20
NARROW_RERANK_FACTOR = 40
# A first build waits for a bulk load (a backlog of pending jobs) to end while the model has
# fewer than this many times embedding.index-min-vectors vectors (build_deferred): exact search
# slows with the vectors (the module docstring, "When").
DEFER_FACTOR = 3
# At most this many candidates (a deep ranking still gets 20 or 40 per result up to it).
MAX_CANDIDATES = 1000


def hnsw_parameters(dimension: int) -> tuple[int, int]:
    """The bit graph's build parameters ``(m, ef_construction)`` for ``dimension``: thinner
    below :data:`NARROW_DIMENSION` (see the constants)."""
    if dimension < NARROW_DIMENSION:
        return NARROW_HNSW_M, NARROW_HNSW_EF_CONSTRUCTION
    return HNSW_M, HNSW_EF_CONSTRUCTION


def candidate_count(limit: int, dimension: int) -> int:
    """How many candidates a query for ``limit`` results takes from the bit graph of vectors
    of ``dimension``."""
    factor = NARROW_RERANK_FACTOR if dimension < NARROW_DIMENSION else RERANK_FACTOR
    return max(limit, min(factor * limit, MAX_CANDIDATES))


class IndexState(enum.StrEnum):
    MISSING = "missing"
    INVALID = "invalid"  # an interrupted concurrent build: maintained on insert, never used
    VALID = "valid"


def index_state(conn: Connection, model: EmbeddingModel, name: str | None = None) -> IndexState:
    """The state of the model's index (or of the index called ``name``)."""
    return _named_state(conn, name or model.index_name)


# whether the index called %(name)s in the current schema is valid (no row: there is none)
_VALIDITY_SQL = """SELECT i.indisvalid FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid
                   WHERE c.relname = %(name)s AND c.relnamespace = current_schema()::regnamespace"""


def _named_state(conn: Connection, name: str) -> IndexState:
    row = conn.execute(_VALIDITY_SQL, {"name": name}).fetchone()
    if row is None:
        return IndexState.MISSING
    return IndexState.VALID if row["indisvalid"] else IndexState.INVALID


def quantized_sql(conn: Connection, dimension: int, vector: str) -> str:
    """The indexed expression of ``vector`` (an SQL expression of type vector): its sign bits,
    in the one text the ranking orders by too (``trioindex_sign_bits_sql``)."""
    row = conn.execute(
        "SELECT trioindex_sign_bits_sql(%s, %s) AS sql", (int(dimension), vector)
    ).fetchone()
    assert row is not None  # a function of its arguments: always one row
    return str(row["sql"])


def has_vectors(conn: Connection, model: EmbeddingModel, count: int) -> bool:
    """Whether the model has at least ``count`` vectors (reads at most ``count`` rows)."""
    row = conn.execute(
        """SELECT count(*) AS n FROM (SELECT 1 FROM embeddings
                                     WHERE embedding_model_id = %s LIMIT %s) s""",
        (model.id, count),
    ).fetchone()
    return row is not None and row["n"] >= count


def loading(conn: Connection, model: EmbeddingModel) -> bool:
    """Whether the model has a job under way or due: PROCESSING, or PENDING and available now
    (a retry scheduled for later is not a load). Reads at most one row."""
    row = conn.execute(
        """SELECT EXISTS (SELECT 1 FROM embedding_jobs
                          WHERE embedding_model_id = %s
                            AND (status = 'PROCESSING'
                                 OR (status = 'PENDING' AND available_at <= now()))) AS busy""",
        (model.id,),
    ).fetchone()
    return row is not None and bool(row["busy"])


def build_deferred(conn: Connection, model: EmbeddingModel, *, min_vectors: int) -> bool:
    """Whether the model's first build, due by its vector count, waits for a bulk load to end:
    it has no index of any kind (none to replace or finish), a job of the model is under way or
    due (:func:`loading`), and fewer than :data:`DEFER_FACTOR` × ``min_vectors`` vectors are
    stored. Never with ``min_vectors`` 0 (the index from the first vector, as asked).

    Every vector stored after the build starts pays the graph's upkeep row by row (a concurrent
    build's late rows too); a build over the loaded rows costs a sixth of that (the module
    docstring, "When"). Search stays exact meanwhile, and an exact scan slows with the vectors,
    hence the limit."""
    return (
        min_vectors > 0
        and first_build_due(conn, model, min_vectors=min_vectors)
        and loading(conn, model)
        and not has_vectors(conn, model, DEFER_FACTOR * min_vectors)
    )


def index_parameters(conn: Connection, name: str) -> tuple[int, int] | None:
    """The HNSW build parameters ``(m, ef_construction)`` of the index called ``name`` (those
    its ``WITH`` left out are pgvector's defaults, 16 and 64), or None if there is none."""
    row = conn.execute(
        """SELECT coalesce(c.reloptions, '{}') AS options FROM pg_class c
           WHERE c.relname = %s AND c.relnamespace = current_schema()::regnamespace""",
        (name,),
    ).fetchone()
    if row is None:
        return None
    options = dict(option.split("=", 1) for option in row["options"])
    return int(options.get("m", 16)), int(options.get("ef_construction", 64))


def create_index_sql(
    conn: Connection, model: EmbeddingModel, *, concurrently: bool = True, name: str | None = None
) -> str:
    """The model's partial HNSW index over its vectors' sign bits (module docstring), called
    ``name`` (default: the model's index)."""
    m, ef_construction = hnsw_parameters(model.dimension)
    return (
        f"CREATE INDEX {'CONCURRENTLY ' if concurrently else ''}IF NOT EXISTS"
        f" {name or model.index_name} ON embeddings"
        f" USING hnsw (({quantized_sql(conn, model.dimension, 'vector')}) bit_hamming_ops)"
        f" WITH (m = {m}, ef_construction = {ef_construction})"
        f" WHERE embedding_model_id = '{model.id}'"
    )


def build_vector_index(conn: Connection, model: EmbeddingModel, *, min_vectors: int) -> bool:
    """Build ``model``'s index if it has ``min_vectors`` vectors (or a retired index to
    replace) and no valid index yet, or rebuild it if its build parameters are not
    :func:`hnsw_parameters`'s, and drop what it replaces; True when this call built one.

    ``conn`` must be in autocommit mode and outside a transaction (a concurrent build is not
    allowed in one); the build lets PostgreSQL give it parallel workers on that session
    whatever the table's size. Returns False at once when another session is building it.
    """
    if not _lock_for_build(conn, model):
        return False
    try:
        return _build(conn, model, min_vectors)
    finally:
        if not conn.closed:  # a lost session released its lock with it
            _unlock(conn, model)


def send_first_build(conn: Connection, model: EmbeddingModel, *, min_vectors: int) -> bool:
    """Send the model's first build, if it is due (``min_vectors`` vectors and no index of
    any kind: nothing to drop, finish or replace), without waiting for it; True when sent.

    The caller must then close ``conn`` without another statement: PostgreSQL finishes the
    build on its own. A backend notices that its client left only when it next reads from or
    writes to it, so the build runs to its end and commits; the session's advisory lock (one
    builder per model) goes with the backend when it exits. This session sets
    ``client_connection_check_interval`` to 0, so a server that polls its clients does not
    cancel the build. A build that fails anyway (the server stopped, an error) leaves an
    INVALID index, which the next check drops and builds again (:func:`build_vector_index`).
    ``conn`` as for :func:`build_vector_index`; when False is returned it can be used on.
    """
    if not _lock_for_build(conn, model):
        return False
    if not first_build_due(conn, model, min_vectors=min_vectors):
        _unlock(conn, model)
        return False
    conn.execute("SET client_connection_check_interval = 0")
    logger.info("building the vector index of model %s (%s+ vectors)", model.name, min_vectors)
    conn.pgconn.send_query(create_index_sql(conn, model).encode())
    return True


def first_build_due(conn: Connection, model: EmbeddingModel, *, min_vectors: int) -> bool:
    """Whether the model has no index of any kind (none to replace, finish or rename) and at
    least ``min_vectors`` vectors."""
    return all(
        _named_state(conn, name) is IndexState.MISSING
        for name in (model.index_name, model.retired_index_name, model.next_index_name)
    ) and has_vectors(conn, model, count=min_vectors)


def _lock_for_build(conn: Connection, model: EmbeddingModel) -> bool:
    """Take the model's build lock for this session if no other session holds it and the model
    is still registered, with the session set for a build; False (nothing held) otherwise."""
    if model.dimension > BIT_HNSW_MAX_DIMENSION:
        return False
    lock = conn.execute(
        "SELECT pg_try_advisory_lock(%s::int, hashtext(%s)) AS got",
        (INDEX_BUILD_LOCK, str(model.id)),
    ).fetchone()
    if lock is None or not lock["got"]:
        return False
    still = conn.execute("SELECT 1 FROM embedding_models WHERE id = %s", (model.id,)).fetchone()
    if still is None:  # removed (under this lock, so no removal runs now)
        _unlock(conn, model)
        return False
    # PostgreSQL sizes a build's parallel workers by the table's main fork, which is small
    # (the vectors live in TOAST): without this a build of 20,000 vectors gets none (with
    # it: 4.6-4.9 s against 7.0-7.6 s).
    conn.execute("SET min_parallel_table_scan_size = 0")
    return True


def _unlock(conn: Connection, model: EmbeddingModel) -> None:
    conn.execute(
        "SELECT pg_advisory_unlock(%s::int, hashtext(%s))", (INDEX_BUILD_LOCK, str(model.id))
    )


def _build(conn: Connection, model: EmbeddingModel, min_vectors: int) -> bool:
    state = index_state(conn, model)
    built = False
    if state is IndexState.VALID:
        if index_parameters(conn, model.index_name) != hnsw_parameters(model.dimension):
            _rebuild(conn, model)
            built = True
    elif index_state(conn, model, model.retired_index_name) is not IndexState.MISSING or (
        has_vectors(conn, model, min_vectors)
    ):
        if state is IndexState.INVALID:
            logger.info("dropping the interrupted index build of model %s", model.name)
            _drop(conn, model.index_name)
        logger.info("building the vector index of model %s (%s+ vectors)", model.name, min_vectors)
        conn.execute(create_index_sql(conn, model))
        built = True
    if built or state is IndexState.VALID:
        # what the valid index replaced, or a rebuild interrupted before it took the name
        _drop(conn, model.retired_index_name)
        _drop(conn, model.next_index_name)
    return built


def _rebuild(conn: Connection, model: EmbeddingModel) -> None:
    """Build the graph with today's parameters beside the valid one, then give it the model's
    index name in one transaction: search has a valid index throughout."""
    wanted = hnsw_parameters(model.dimension)
    if (
        index_state(conn, model, model.next_index_name) is not IndexState.VALID
        or index_parameters(conn, model.next_index_name) != wanted
    ):
        _drop(conn, model.next_index_name)  # an interrupted rebuild, or older parameters
        logger.info(
            "rebuilding the vector index of model %s (m, ef_construction = %s)", model.name, wanted
        )
        conn.execute(create_index_sql(conn, model, name=model.next_index_name))
    _drop(conn, model.retired_index_name)  # frees its name
    with conn.transaction():
        # renaming takes a SHARE UPDATE EXCLUSIVE lock: writers and searches go on
        conn.execute(f"ALTER INDEX {model.index_name} RENAME TO {model.retired_index_name}")
        conn.execute(f"ALTER INDEX {model.next_index_name} RENAME TO {model.index_name}")


def _drop(conn: Connection, name: str) -> None:
    if _named_state(conn, name) is not IndexState.MISSING:
        logger.info("dropping index %s (replaced)", name)
        conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
