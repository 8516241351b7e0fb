"""Embedding model registry: one row per model, pinned to jobs; and the model switch (which
model serves search, activating another, removing one).

The ``embeddings.vector`` column has no fixed dimension so that several models can live side by
side; each model gets a partial HNSW index over its vectors' sign bits restricted to its rows (the
candidates of a query, re-ranked exactly) — built by a worker once the model has enough vectors
(:mod:`trioindex.db.vector_index`), not at registration.

Each model serves its own version of each document (``served_versions``, moved forward by that
model's completions only). One model *serves search* (``is_active``): :func:`serving_model` is
the one answer to "which model ranks a query now", and search reads that model's versions.
:func:`activate_model` starts a switch: the new model is marked ``activating`` and gets a job
for each document's newest version (and for the version the serving model serves, when that is
older); search keeps the serving model until the new one serves every document the serving
model serves at the same version or a newer one and owes no work, and then
``trioindex_finish_switch`` moves ``is_active`` over in one transaction — at the first read of
the serving model after that (every search makes one), a ``models list``, ``status``, delete
or activation. A job of the new model that failed for good on a newer version than it serves
holds the switch (finishing would serve an older version than before): retry it, delete the
document, or remove the model to cancel the switch.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

import attrs
import psycopg

from trioindex.db.pool import Connection
from trioindex.errors import ConfigError, NotFound, TrioindexError
from trioindex.values import token_chunking


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
        """The model's vector index (HNSW over its vectors' sign bits, db/vector_index.py)."""
        return f"embeddings_bits_{self.id.hex[:16]}"

    @property
    def retired_index_name(self) -> str:
        """An index being replaced by :attr:`index_name` and dropped once that is valid: the
        float32 HNSW index older releases built (under this name), or a bit graph built with
        other parameters (renamed to it)."""
        return f"embeddings_hnsw_{self.id.hex[:16]}"

    @property
    def next_index_name(self) -> str:
        """A bit graph being built with new parameters beside :attr:`index_name`, whose name
        it takes once valid."""
        return f"embeddings_bitsnext_{self.id.hex[:16]}"


# Serialises registrations so that two processes starting at once do not race on the
# "at most one active model" index.
_REGISTRY_LOCK = 0x74_72_69_6F_6D_64_6C
# The advisory lock of one model's HNSW index build ("tiix", an int4; the second key is the
# model id hashed): the build holds it for its session (db/vector_index.py), and removing the
# model takes it for its transaction, so the two never run at once.
INDEX_BUILD_LOCK = 0x74_69_69_78


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
        # no HNSW index yet: a worker builds it once the model has enough vectors
        return EmbeddingModel.from_row(row)


def get_model(conn: Connection, model_id: UUID) -> EmbeddingModel:
    row = conn.execute("SELECT * FROM embedding_models WHERE id = %s", (model_id,)).fetchone()
    if row is None:
        raise NotFound(f"no embedding model with id {model_id}")
    return EmbeddingModel.from_row(row)


def find_model(conn: Connection, name: str) -> EmbeddingModel | None:
    row = conn.execute("SELECT * FROM embedding_models WHERE name = %s", (name,)).fetchone()
    return EmbeddingModel.from_row(row) if row else None


class ModelNotServing(TrioindexError):
    """A query embedded with a model that is not the one serving search: its vectors could
    not be compared with the stored ones."""


def finish_switch(conn: Connection) -> bool:
    """End a model switch whose new model covers what the serving one serves (one transaction,
    and one cheap indexed read while its jobs still run); True when it switched now."""
    row = conn.execute("SELECT trioindex_finish_switch() AS done").fetchone()
    return bool(row and row["done"])


def serving_model(conn: Connection) -> EmbeddingModel | None:
    """The model search ranks with now (None before any model is registered).

    Every version this model serves has its full vector set, so a search over its versions
    never meets a document it cannot rank. Ends a switch that is complete
    first, so the switch takes effect at the first search after it. Call it outside a
    transaction (the switch is its own transaction) or accept that it only reads.
    """
    if conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
        # one statement: the switch's end (trioindex_finish_switch), then the serving row
        row = conn.execute("SELECT * FROM trioindex_serving_model()").fetchone()
    else:
        row = conn.execute("SELECT * FROM embedding_models WHERE is_active").fetchone()
    return EmbeddingModel.from_row(row) if row else None


def check_serving(conn: Connection, model: EmbeddingModel) -> EmbeddingModel:
    """``model`` if it serves search, else :class:`ModelNotServing` naming the one that does."""
    serving = serving_model(conn)
    if serving is not None and serving.id != model.id:
        raise ModelNotServing(
            f"search is served by model {serving.name!r}, not the configured {model.name!r}:"
            f" query with embedding.model = {serving.name!r}"
            + (
                " (a switch to the configured model is in progress, see `trioindex models list`)"
                if _activating_id(conn) == model.id
                else f" or switch with `trioindex models activate {model.name}`"
            )
        )
    return serving or model


def _activating_id(conn: Connection) -> UUID | None:
    row = conn.execute("SELECT id FROM embedding_models WHERE activating").fetchone()
    return row["id"] if row else None


@attrs.frozen
class ModelView:
    """One model as ``models list`` shows it: ``covered`` = documents this model serves at the
    newest version any model indexed, of ``documents`` (every document with a version);
    ``failed_jobs`` = its jobs that failed for good."""

    name: str
    dimension: int
    serving: bool
    activating: bool
    covered: int
    documents: int
    pending_jobs: int
    failed_jobs: int


def model_list(conn: Connection) -> list[ModelView]:
    """Every registered model with its coverage; ends a switch that is complete."""
    finish_switch(conn)
    with conn.transaction():
        rows = conn.execute(
            """SELECT m.name, m.dimension, m.is_active, m.activating,
                      (SELECT count(*) FROM served_versions s
                         JOIN document_versions sv ON sv.id = s.document_version_id
                        WHERE s.embedding_model_id = m.id
                          AND sv.version_no = (SELECT max(v.version_no)
                                               FROM document_versions v
                                               WHERE v.document_id = s.document_id))
                          AS covered,
                      (SELECT count(*) FROM documents) AS documents,
                      (SELECT count(*) FROM embedding_jobs j WHERE j.embedding_model_id = m.id
                          AND j.status IN ('PENDING', 'PROCESSING')) AS pending,
                      (SELECT count(*) FROM embedding_jobs j WHERE j.embedding_model_id = m.id
                          AND j.status = 'FAILED') AS failed
               FROM embedding_models m ORDER BY m.is_active DESC, m.activating DESC, m.name"""
        ).fetchall()
    return [
        ModelView(
            name=r["name"],
            dimension=r["dimension"],
            serving=r["is_active"],
            activating=r["activating"],
            covered=r["covered"],
            documents=r["documents"],
            pending_jobs=r["pending"],
            failed_jobs=r["failed"],
        )
        for r in rows
    ]


@attrs.frozen
class Activation:
    """What ``models activate`` did: ``jobs`` enqueued for the model; ``switched`` when it
    serves already (it covered every document at once, e.g. an empty index)."""

    model: EmbeddingModel
    jobs: int
    switched: bool


def activate_model(
    conn: Connection, name: str, dimension: int, *, max_attempts: int, priority: int = 0
) -> Activation:
    """Start switching search to ``name`` (registered now if new, with ``dimension``).

    One transaction: the model becomes ``activating`` and gets one PENDING job for each
    document's newest version and for the version the serving model serves, when older (a job
    it already has is kept).
    Refused while a switch to another model runs. Workers configured for ``name`` do the
    jobs; until they cover every current version, search keeps the serving model.
    """
    model = ensure_model(conn, name, dimension)
    with conn.transaction():
        # No version may be inserted meanwhile: an ingest that committed before this lock is
        # seen by the backfill below, one after it sees the model activating (its trigger
        # adds the job).
        conn.execute("LOCK TABLE document_versions IN SHARE MODE")
        row = conn.execute(
            "SELECT * FROM embedding_models WHERE id = %s FOR UPDATE", (model.id,)
        ).fetchone()
        if row is None:
            raise NotFound(f"model {name!r} was removed meanwhile")
        if row["is_active"]:
            return Activation(EmbeddingModel.from_row(row), 0, True)
        other = conn.execute(
            "SELECT name FROM embedding_models WHERE activating AND id <> %s", (model.id,)
        ).fetchone()
        if other is not None:
            raise TrioindexError(
                f"a switch to model {other['name']!r} is in progress; wait for it to end or"
                f" `trioindex models remove {other['name']}` to cancel it"
            )
        conn.execute("UPDATE embedding_models SET activating = true WHERE id = %s", (model.id,))
        jobs = conn.execute(
            """INSERT INTO embedding_jobs
                   (document_version_id, embedding_model_id, max_attempts, priority)
               SELECT v.id, %(model)s, %(attempts)s, %(priority)s
               FROM document_versions v
               WHERE v.version_no = (SELECT max(n.version_no) FROM document_versions n
                                     WHERE n.document_id = v.document_id)
                  OR v.id IN (SELECT s.document_version_id FROM served_versions s
                              JOIN embedding_models serving
                                ON serving.id = s.embedding_model_id AND serving.is_active)
               ON CONFLICT (document_version_id, embedding_model_id) DO NOTHING""",
            {"model": model.id, "attempts": max_attempts, "priority": priority},
        ).rowcount
        conn.execute(
            """INSERT INTO indexing_events (event_type, detail)
               VALUES ('MODEL_SWITCH_STARTED', jsonb_build_object('model', %s::text,
                       'jobs', %s::int))""",
            (name, jobs),
        )
        conn.execute("NOTIFY trioindex_jobs")
    switched = finish_switch(conn)  # an empty index is covered at once
    return Activation(get_model(conn, model.id), jobs, switched)


@attrs.frozen
class Removal:
    name: str
    embeddings: int
    jobs: int
    chunks: int = 0  # the model's own token-aware chunk set, if it had one


def remove_model(conn: Connection, name: str) -> Removal:
    """Drop a model that does not serve search: its jobs, its embeddings, its own chunk set
    (token-aware chunks cut with its tokenizer), its HNSW index and its row, in one
    transaction. Removing the model being switched to cancels the switch.
    A worker still running one of its jobs finds the job gone and stops quietly. Refused while
    a worker builds the model's HNSW index (run it again when the build ends): dropping the
    index under a concurrent build would deadlock with it."""
    with conn.transaction():
        found = conn.execute("SELECT id FROM embedding_models WHERE name = %s", (name,)).fetchone()
        if found is None:
            raise NotFound(f"no embedding model named {name!r}")
        # first, before any row or table lock: a build waits for no lock of ours, and a build
        # starting after this commits finds the model gone (it checks under the same lock)
        free = conn.execute(
            "SELECT pg_try_advisory_xact_lock(%s::int, hashtext(%s)) AS got",
            (INDEX_BUILD_LOCK, str(found["id"])),
        ).fetchone()
        if free is None or not free["got"]:
            raise TrioindexError(
                f"PostgreSQL is building the HNSW index of model {name!r}; remove it when"
                " the build has ended"
            )
        # Locks in the order a completion takes them (its job row, then the embeddings it
        # reads), so removing never deadlocks with one.
        conn.execute(
            """SELECT j.id FROM embedding_jobs j JOIN embedding_models m
                 ON m.id = j.embedding_model_id
               WHERE m.name = %s ORDER BY j.id FOR UPDATE OF j""",
            (name,),
        )
        conn.execute("LOCK TABLE embeddings IN ACCESS EXCLUSIVE MODE")  # DROP INDEX takes it
        row = conn.execute(
            "SELECT * FROM embedding_models WHERE name = %s FOR UPDATE", (name,)
        ).fetchone()
        if row is None:
            raise NotFound(f"no embedding model named {name!r}")
        model = EmbeddingModel.from_row(row)
        if model.is_active:
            raise TrioindexError(
                f"model {name!r} serves search; activate another model first"
                " (`trioindex models activate NAME`), then remove this one"
            )
        jobs = conn.execute(
            "DELETE FROM embedding_jobs WHERE embedding_model_id = %s", (model.id,)
        ).rowcount
        embeddings = conn.execute(
            "DELETE FROM embeddings WHERE embedding_model_id = %s", (model.id,)
        ).rowcount
        # only this model's workers make this set (character chunks are every model's)
        chunks = conn.execute(
            "DELETE FROM document_chunks WHERE chunking = %s", (token_chunking(name),)
        ).rowcount
        conn.execute(
            f"DROP INDEX IF EXISTS {model.index_name}, {model.retired_index_name},"
            f" {model.next_index_name}"
        )
        conn.execute("DELETE FROM embedding_models WHERE id = %s", (model.id,))
        conn.execute(
            """INSERT INTO indexing_events (event_type, detail)
               VALUES ('MODEL_REMOVED', jsonb_build_object('model', %s::text,
                       'embeddings', %s::int))""",
            (name, embeddings),
        )
    return Removal(name, embeddings, jobs, chunks)
