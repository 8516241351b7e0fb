"""What PostgreSQL spends per small document, and how much of it the rows themselves cost.

pgai's workload (issue 13: documents of 600 characters, one chunk each, 768 dimensions) is
written straight to an embedded PostgreSQL from one connection in this process, in groups of
20 jobs (the worker's usual group commit), with no worker, embedder or parser: what is left is
the database's own CPU per document. Five ways of writing the same documents, each in a fresh
database, interleaved over rounds:

1. **trioindex's group functions** — the claim (`claim_jobs`, which also reads what the parse
   needs), then the worker's group statement for a small document in a transaction of its
   own: `trioindex_store_documents_many`, chunks, vectors and completion at once (the group
   fenced in one locking statement, every job's own checks in one statement, then one
   statement per table). **The group functions, chunks stored first** is the same claim, then
   the worker's path for a larger document, in two transactions:
   `trioindex_store_chunks_many`, then `trioindex_store_embeddings_many`. With `--baseline REF` the same calls also run over the `functions.sql` of git
   revision REF (say `main`), applied to its own fresh database: the before and after of a
   change to the functions, in one run (functions that still have a parse prepare,
   `trioindex_begin_parse_many`, get it called in a transaction of its own, as their worker
   did; functions without `trioindex_store_documents_many` store the chunks first). Functions
   that fence on a `STARTED` attempt row (before the running attempt moved onto the job row)
   are refused: this schema's claim writes no such row, so measure that revision's own tree.
   Functions from before the claim was one of them get this tree's `trioindex_claim`: every
   revision is measured with the same claim.
2. **The same rows, set-based** — the same claim, then exactly the rows (1) writes (the job's
   completion with its chunk count, the attempt's steps and end, the chunk with its full-text
   column, the vector, the model's served version with its text statistics), in one
   transaction per group, one statement per table change, from arrays: no fence, lookup,
   loop or subtransaction. No rewrite of the SQL functions can cost less than this while
   writing these rows.
3. **The document's data only** — a queue row deleted, the chunk row (full-text column
   included) and the vector row: no attempts, events or statuses.
4. **pgai's shape** — a queue row deleted and one row with the text and the vector (what
   pgai's vectorizer writes per chunk; no full-text column).

With ``--parts``, the document's data is also written with one piece of the schema taken away
at a time (its full-text column, or one of the vector's two foreign keys), and with the
vector's key to its chunk replaced by a key to its version: what each piece costs is the gap
to (3), in the same run.

PostgreSQL CPU is the server's (the backend's CPU once it exited), per document; transactions
are committed transactions of the database. Run ``.venv/bin/python -m bench.sql_floor``;
``--quick`` is a smoke run that writes its files to a temporary folder unless ``--out`` says
otherwise.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import statistics
import subprocess
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from uuid import UUID

import attrs
import numpy as np
import numpy.typing as npt

from bench.common import (
    BenchPostgres,
    Panel,
    Session,
    add_out,
    bench_parser,
    machine_info,
    markdown_table,
    page_head,
    plot_panels,
)
from bench.harness import chunk_texts
from testkit.jobs import enqueue_text
from trioindex.db.fence import claim_arrays
from trioindex.db.jobs import claim_jobs, register_worker
from trioindex.db.migrations import _OUR_OBJECTS, functions_sql
from trioindex.db.models import ensure_model
from trioindex.db.pool import Connection, connect
from trioindex.db.steps import (
    ChunkCommit,
    DocumentCommit,
    EmbeddingCommit,
    EmbedSnapshot,
    StoredSlice,
    store_chunks_many,
    store_documents_many,
    store_embeddings_many,
    whole_snapshot,
)
from trioindex.pipeline.chunk_values import ChunkDraft
from trioindex.pipeline.embed_step import drafts_from_matrix
from trioindex.values import Claim

DOCUMENTS, QUICK_DOCUMENTS = 2000, 200
ROUNDS, QUICK_ROUNDS = 3, 1
# jobs per group statement: the worker's usual group commit on this workload (``--group`` for
# another: 1 is documents arriving one at a time)
GROUP = 20
CHARACTERS = 600
DIMENSION = 768
MODEL_NAME = "floor-model"
TOKENS = 150  # the chunk's recorded token count; any positive value


@attrs.frozen
class Corpus:
    texts: Sequence[str]
    vectors: npt.NDArray[np.float32]

    def index_of(self, original_name: str) -> int:
        """Documents are enqueued as ``d<i>.txt``."""
        return int(original_name[1:-4])

    def text_hash(self, i: int) -> str:
        return hashlib.sha256(self.texts[i].encode()).hexdigest()

    def vector_hash(self, i: int) -> str:
        return hashlib.sha256(self.vectors[i].astype(">f4").tobytes()).hexdigest()


@attrs.frozen
class Setup:
    model_id: UUID
    worker_id: UUID
    group: int  # jobs per group statement


def enqueue_all(conn: Connection, corpus: Corpus, group: int = GROUP) -> Setup:
    model = ensure_model(conn, MODEL_NAME, DIMENSION)
    with conn.transaction():
        for i, text in enumerate(corpus.texts):
            enqueue_text(conn, model.id, f"d{i}", text.encode())
    worker = register_worker(
        conn, hostname="bench", pid=1, version="bench", max_concurrency=group,
        chunking="characters",
    )  # fmt: skip
    return Setup(model.id, worker, group)


# ---------------------------------------------------------------------------------------------
# the four ways


_PARSE_PREPARE = """SELECT * FROM trioindex_begin_parse_many(
    %b::uuid[], %b::uuid[], %b::uuid[], %b::uuid[])"""


def group_functions(
    conn: Connection,
    corpus: Corpus,
    setup: Setup,
    *,
    whole: bool = True,
    parse_prepare: bool = False,
) -> int:
    """The worker's group statements. ``whole``: each document stored whole once embedded
    (`trioindex_store_documents_many`, as the worker stores a small one), else its chunks first
    and then its vectors with the completion; ``parse_prepare``: functions from before the
    claim began the parse, whose worker ran their prepare in a transaction of its own first."""
    done = 0
    while claims := claim_jobs(conn, setup.worker_id, setup.group, 600):
        if parse_prepare:
            ordered = sorted(claims, key=lambda c: c.document_version_id)
            with conn.transaction():
                conn.execute(_PARSE_PREPARE, claim_arrays(ordered)).fetchall()
        commits = []
        for claim in claims:
            snapshot = claim.parse
            if snapshot is None:
                raise RuntimeError(f"claim {claim.job_id} carries nothing to parse")
            i = corpus.index_of(snapshot.original_name)
            text = corpus.texts[i]
            chunk = ChunkDraft(0, text, 0, len(text), TOKENS, corpus.text_hash(i))
            commits.append(ChunkCommit(claim, snapshot, [chunk]))
        if whole:
            _store_whole(conn, corpus, setup, commits)
            done += len(claims)
            continue
        with conn.transaction():
            stored = store_chunks_many(conn, commits)
        embedded = []
        for commit, result in zip(commits, stored, strict=True):
            if not isinstance(result, EmbedSnapshot):
                raise RuntimeError(f"chunks not stored: {result!r}")
            i = corpus.index_of(commit.snapshot.original_name)
            drafts = drafts_from_matrix(result, corpus.vectors[i : i + 1].copy())
            embedded.append(EmbeddingCommit(commit.claim, result, drafts))
        with conn.transaction():
            completed = store_embeddings_many(conn, embedded)
        for outcome in completed:
            if not isinstance(outcome, StoredSlice) or outcome.result is None:
                raise RuntimeError(f"not completed: {outcome!r}")
        done += len(claims)
    return done


def _store_whole(
    conn: Connection, corpus: Corpus, setup: Setup, commits: Sequence[ChunkCommit]
) -> None:
    """The group's documents stored whole: chunks, vectors and completion in one call."""
    documents = []
    for commit in commits:
        snapshot = whole_snapshot(commit, setup.model_id, MODEL_NAME, DIMENSION)
        i = corpus.index_of(commit.snapshot.original_name)
        drafts = drafts_from_matrix(snapshot, corpus.vectors[i : i + 1].copy())
        documents.append(DocumentCommit(commit, EmbeddingCommit(commit.claim, snapshot, drafts)))
    with conn.transaction():
        completed = store_documents_many(conn, documents)
    for outcome in completed:
        if not isinstance(outcome, StoredSlice) or outcome.result is None:
            raise RuntimeError(f"not completed: {outcome!r}")


def functions_at(revision: str) -> str:
    """``functions.sql`` as git revision ``revision`` has it."""
    return subprocess.run(
        ["git", "show", f"{revision}:src/trioindex/db/migrations/functions.sql"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip


def use_functions(text: str, conn: Connection) -> None:
    """Replace the database's trioindex functions by ``text`` (what ``migrate`` does when
    ``functions.sql`` changes). Functions from before the parse prepare handed out its start
    time get thin adapters to this revision's calls (one SQL call more per group)."""
    with conn.transaction():
        for row in conn.execute(_OUR_OBJECTS).fetchall():
            conn.execute(f"DROP {row['object']} CASCADE")
        if "served_text_statistics" in text:
            _keep_statistics_apart(conn)
        conn.execute(text.encode())
        if "p_parse_started" not in text:
            _adapt_parse_start(conn)
        if "FUNCTION trioindex_claim(" not in text:
            _add_claim(conn)


def _add_claim(conn: Connection) -> None:
    """For functions from before the claim was one of them: this checkout's claim function
    (and its plan settings), so every revision is measured with the same claim."""
    today = functions_sql()
    start = today.index("CREATE FUNCTION trioindex_claim(")
    conn.execute(today[start : today.index("\n$$;\n", start) + 4].encode())
    start = today.index("ALTER FUNCTION trioindex_claim(")
    conn.execute(today[start : today.index(";", start) + 1].encode())


def _keep_statistics_apart(conn: Connection) -> None:
    """For functions from before version 16, which keep BM25's statistics in a table of their
    own (by a trigger) and write served rows without them: that table (as version 13 made it)
    and zeros for the served rows' columns."""
    conn.execute(
        """CREATE TABLE served_text_statistics (
               embedding_model_id uuid NOT NULL REFERENCES embedding_models (id)
                   ON DELETE CASCADE,
               document_id uuid NOT NULL REFERENCES documents (id) ON DELETE CASCADE,
               chunks integer NOT NULL CHECK (chunks >= 0),
               text_length bigint NOT NULL CHECK (text_length >= 0),
               PRIMARY KEY (embedding_model_id, document_id))"""
    )
    conn.execute(
        """ALTER TABLE served_versions ALTER COLUMN chunks SET DEFAULT 0,
                                       ALTER COLUMN text_length SET DEFAULT 0"""
    )


_BEGIN_PARSE = "trioindex_begin_parse_many(uuid[], uuid[], uuid[], uuid[])"
_STORE_CHUNKS = """trioindex_store_chunks_many(
    uuid[], uuid[], uuid[], uuid[], uuid[], text[], text[], bigint[], integer[], integer[],
    integer[], uuid[], text[], integer[], integer[], integer[], text[], text[]"""


def _adapt_parse_start(conn: Connection) -> None:
    """Adapters for functions from before the parse prepare handed out its start time: the
    prepare with a NULL start time, the chunk commit taking the time and dropping it (their
    results as the older functions declare them)."""

    def result(signature: str) -> str:
        row = conn.execute(
            "SELECT pg_get_function_result(%s::regprocedure) AS r", (signature,)
        ).fetchone()
        assert row is not None
        return str(row["r"])

    conn.execute(f"ALTER FUNCTION {_BEGIN_PARSE} RENAME TO trioindex_begin_parse_many_before")
    prepared = result("trioindex_begin_parse_many_before(uuid[], uuid[], uuid[], uuid[])")
    conn.execute(
        f"""CREATE FUNCTION {_BEGIN_PARSE}
            RETURNS {prepared[:-1]}, parse_started_at timestamptz) LANGUAGE sql AS $$
                SELECT b.*, NULL::timestamptz
                FROM trioindex_begin_parse_many_before($1, $2, $3, $4) AS b
            $$"""
    )
    conn.execute(
        f"""CREATE FUNCTION {_STORE_CHUNKS}, timestamptz[])
            RETURNS {result(_STORE_CHUNKS + ")")} LANGUAGE sql AS $$
                SELECT * FROM trioindex_store_chunks_many($1, $2, $3, $4, $5, $6, $7, $8, $9,
                    $10, $11, $12, $13, $14, $15, $16, $17, $18)
            $$""".encode()
    )


def _claim_arrays(claims: Sequence[Claim]) -> tuple[list[UUID], ...]:
    return (
        [c.job_id for c in claims],
        [c.document_version_id for c in claims],
        [c.attempt_id for c in claims],
    )


_CHUNKS = """INSERT INTO document_chunks
    (id, document_id, document_version_id, chunking, chunk_index, content, char_start,
     char_end, token_count, content_sha256)
SELECT c, d, v, 'characters', 0, t, 0, length(t), %b, h
FROM unnest(%b::uuid[], %b::uuid[], %b::uuid[], %b::text[], %b::text[]) AS u(c, d, v, t, h)"""

_VECTORS = """INSERT INTO embeddings
    (chunk_id, document_id, document_version_id, embedding_model_id, vector, dimension,
     vector_sha256)
SELECT c, d, v, %b, x, %b, h
FROM unnest(%b::uuid[], %b::uuid[], %b::uuid[], %b::vector[], %b::text[]) AS u(c, d, v, x, h)"""


def _insert_chunks(
    cursor: Any, corpus: Corpus, index: Sequence[int], documents: list[UUID], versions: list[UUID]
) -> list[UUID]:
    """One group's chunk rows (with their full-text column); their ids."""
    chunk_ids = [uuid.uuid4() for _ in index]
    texts = [corpus.texts[i] for i in index]
    hashes = [corpus.text_hash(i) for i in index]
    cursor.execute(_CHUNKS, (TOKENS, chunk_ids, documents, versions, texts, hashes))
    return chunk_ids


def _insert_vectors(
    cursor: Any,
    corpus: Corpus,
    setup: Setup,
    index: Sequence[int],
    rows: tuple[list[UUID], list[UUID], list[UUID]],
) -> None:
    """One group's vector rows; ``rows``: the chunk, document and version ids."""
    vectors = [corpus.vectors[i] for i in index]
    hashes = [corpus.vector_hash(i) for i in index]
    cursor.execute(_VECTORS, (setup.model_id, DIMENSION, *rows, vectors, hashes))


def same_rows_set_based(conn: Connection, corpus: Corpus, setup: Setup) -> int:
    done = 0
    while claims := claim_jobs(conn, setup.worker_id, setup.group, 600):
        jobs, versions, _ = _claim_arrays(claims)
        parses = [c.parse for c in claims if c.parse is not None]
        documents = [p.document_id for p in parses]
        index = [corpus.index_of(p.original_name) for p in parses]
        with conn.transaction(), conn.cursor(binary=True) as cursor:
            chunk_ids = _insert_chunks(cursor, corpus, index, documents, versions)
            _insert_vectors(cursor, corpus, setup, index, (chunk_ids, documents, versions))
            cursor.execute(
                f"""INSERT INTO served_versions (document_id, embedding_model_id,
                        document_version_id, chunks, text_length)
                    SELECT u.d, %b, u.v, 1, {CHARACTERS}
                    FROM unnest(%b::uuid[], %b::uuid[]) AS u(d, v)
                    ON CONFLICT (embedding_model_id, document_id)
                    DO UPDATE SET document_version_id = EXCLUDED.document_version_id,
                                  chunks = EXCLUDED.chunks, text_length = EXCLUDED.text_length""",
                (setup.model_id, documents, versions),
            )
            cursor.execute(
                f"""INSERT INTO embedding_job_attempts
                        (id, embedding_job_id, attempt_no, worker_id, status, started_at,
                         finished_at, became_current, parse_started_at, chunks_stored_at,
                         chunks, characters, embedding_started_at, embeddings_stored_at,
                         embeddings, embedding_slices)
                    SELECT attempt_id, id, attempt_count, worker_id, 'SUCCEEDED', locked_at,
                           now(), true, locked_at, now(), 1, {CHARACTERS}, now(), now(), 1, 1
                    FROM embedding_jobs WHERE id = ANY(%b)""",
                (jobs,),
            )
            cursor.execute(
                """UPDATE embedding_jobs
                   SET status = 'SUCCEEDED', progress = 100, finished_at = now(),
                       chunk_count = 1, worker_id = NULL, claim_token = NULL, locked_at = NULL,
                       lease_expires_at = NULL, attempt_id = NULL, last_failure_type = NULL,
                       last_failure_message = NULL
                   WHERE id = ANY(%b)""",
                (jobs,),
            )
        done += len(claims)
    return done


_QUEUE_TAKE = """DELETE FROM floor_queue WHERE id IN (
    SELECT id FROM floor_queue ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED)
RETURNING version_id, document_id, doc"""


def _fill_queue(conn: Connection) -> None:
    conn.execute(
        """CREATE TABLE floor_queue (
               id bigserial PRIMARY KEY, version_id uuid, document_id uuid, doc integer)"""
    )
    conn.execute(
        """INSERT INTO floor_queue (version_id, document_id, doc)
           SELECT id, document_id, substr(original_name, 2, length(original_name) - 5)::integer
           FROM document_versions"""
    )
    conn.execute("ANALYZE floor_queue")


def _drain_queue(
    conn: Connection, group: int, write: Callable[[Any, list[dict[str, Any]]], None]
) -> int:
    """Take the queue (:func:`_fill_queue`, before the measurement) ``group`` rows at a time,
    each group's rows written by ``write`` in the transaction that deletes its queue rows."""
    done = 0
    while True:
        with conn.transaction(), conn.cursor(binary=True) as cursor:
            rows = cursor.execute(_QUEUE_TAKE, (group,)).fetchall()
            if not rows:
                return done
            write(cursor, rows)
        done += len(rows)


def data_rows_only(conn: Connection, corpus: Corpus, setup: Setup) -> int:
    def write(cursor: Any, rows: list[dict[str, Any]]) -> None:
        index = [r["doc"] for r in rows]
        documents = [r["document_id"] for r in rows]
        versions = [r["version_id"] for r in rows]
        chunk_ids = _insert_chunks(cursor, corpus, index, documents, versions)
        _insert_vectors(cursor, corpus, setup, index, (chunk_ids, documents, versions))

    return _drain_queue(conn, setup.group, write)


def _pgai_tables(conn: Connection) -> None:
    _fill_queue(conn)
    conn.execute(
        f"""CREATE TABLE floor_embeddings (
               id uuid PRIMARY KEY DEFAULT gen_random_uuid(), doc integer, chunk_seq integer,
               chunk text, embedding vector({DIMENSION}))"""
    )


def pgai_shape(conn: Connection, corpus: Corpus, setup: Setup) -> int:
    def write(cursor: Any, rows: list[dict[str, Any]]) -> None:
        index = [r["doc"] for r in rows]
        cursor.execute(
            """INSERT INTO floor_embeddings (doc, chunk_seq, chunk, embedding)
               SELECT d, 0, t, x FROM unnest(%b::int[], %b::text[], %b::vector[]) AS u(d, t, x)""",
            (index, [corpus.texts[i] for i in index], [corpus.vectors[i] for i in index]),
        )

    return _drain_queue(conn, setup.group, write)


WAYS: dict[str, Callable[[Connection, Corpus, Setup], int]] = {
    "trioindex's group functions": group_functions,
    "the group functions, chunks stored first": functools.partial(group_functions, whole=False),
    "the same rows, set-based": same_rows_set_based,
    "the document's data only": data_rows_only,
    "pgai's shape": pgai_shape,
}
# Tables a way needs, made before the measurement starts.
PREPARE: dict[str, Callable[[Connection], None]] = {
    "the document's data only": _fill_queue,
    "pgai's shape": _pgai_tables,
}


# ---------------------------------------------------------------------------------------------
# measuring


# What a way left behind, table by table: the two trioindex ways must leave the same.
_ROWS_LEFT = """
SELECT 'events ' || event_type || ' detail ' || coalesce(
           (SELECT string_agg(k, ',' ORDER BY k) FROM jsonb_object_keys(detail) AS k), '-')
       AS what, count(*) AS n
FROM indexing_events GROUP BY 1
UNION ALL SELECT 'versions', count(*) FROM document_versions
UNION ALL SELECT 'jobs ' || status || ' progress ' || progress || ' chunks '
                 || coalesce(chunk_count::text, '-'), count(*) FROM embedding_jobs GROUP BY 1
UNION ALL SELECT 'attempts ' || status || ' steps '
                 || concat_ws(',', CASE WHEN parse_started_at IS NOT NULL THEN 'parse' END,
                              CASE WHEN chunks_stored_at IS NOT NULL THEN 'chunks' END,
                              CASE WHEN embedding_started_at IS NOT NULL THEN 'embedding' END,
                              CASE WHEN embeddings_stored_at IS NOT NULL THEN 'vectors' END)
                 || ' counts ' || concat_ws(',', chunks, characters, replaced_sequences,
                                            embeddings, embedding_slices)
                 || ' became current ' || coalesce(became_current::text, '-'), count(*)
          FROM embedding_job_attempts GROUP BY 1
UNION ALL SELECT 'chunks', count(*) FROM document_chunks
UNION ALL SELECT 'embeddings', count(*) FROM embeddings
UNION ALL SELECT 'served versions', count(*) FROM served_versions
"""
# BM25's statistics: on the served rows, or in the table of their own that functions from
# before version 16 keep (a baseline's)
_STATISTICS_LEFT = """SELECT 'text statistics ' || chunks || ' ' || text_length AS what, count(*) AS n
FROM {table} GROUP BY 1"""


def rows_left(conn: Connection) -> dict[str, int]:
    own = conn.execute("SELECT to_regclass('served_text_statistics') AS t").fetchone()
    table = "served_text_statistics" if own and own["t"] else "served_versions"
    rows = [*conn.execute(_ROWS_LEFT).fetchall(),
            *conn.execute(_STATISTICS_LEFT.format(table=table)).fetchall()]  # fmt: skip
    return {row["what"]: int(row["n"]) for row in rows}


_TABLE_WRITES = """SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del
FROM pg_stat_user_tables"""


def table_writes(url: str) -> dict[str, tuple[int, int, int, int]]:
    """Rows inserted, updated (all; HOT), deleted so far, per table of the database."""
    with connect(url) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        return {
            r["relname"]: (r["n_tup_ins"], r["n_tup_upd"], r["n_tup_hot_upd"], r["n_tup_del"])
            for r in conn.execute(_TABLE_WRITES).fetchall()
        }


def writes_per_document(
    before: dict[str, tuple[int, int, int, int]],
    after: dict[str, tuple[int, int, int, int]],
    documents: int,
) -> dict[str, list[float]]:
    """Per table that changed: rows inserted, updated, of them HOT, deleted — per document."""
    found = {}
    for table, counts in after.items():
        old = before.get(table, (0, 0, 0, 0))
        delta = [(n - o) / documents for n, o in zip(counts, old, strict=True)]
        if any(delta):
            found[table] = delta
    return found


def baseline_way(revision: str) -> str:
    return f"the group functions at {revision}"


# The document's data with one piece of the schema taken away or changed (``--parts``).
_CHUNK_KEY = "embeddings_chunk_id_document_version_id_document_id_fkey"
PARTS: dict[str, tuple[str, ...]] = {
    "the data, no full-text column": ("ALTER TABLE document_chunks DROP COLUMN search_vector",),
    "the data, no vector → chunk key": (f"ALTER TABLE embeddings DROP CONSTRAINT {_CHUNK_KEY}",),
    "the data, no vector → model key": (
        "ALTER TABLE embeddings DROP CONSTRAINT embeddings_embedding_model_id_dimension_fkey",
    ),
    "the data, vector → version key for the chunk's": (
        f"ALTER TABLE embeddings DROP CONSTRAINT {_CHUNK_KEY}",
        """ALTER TABLE embeddings ADD FOREIGN KEY (document_version_id, document_id)
           REFERENCES document_versions (id, document_id) ON DELETE CASCADE""",
    ),
}


def _data_without(statements: Sequence[str], conn: Connection) -> None:
    _fill_queue(conn)
    for statement in statements:
        conn.execute(statement)


def add_parts() -> None:
    """Measure the document's data with each of :data:`PARTS` too."""
    for way, statements in PARTS.items():
        WAYS[way] = data_rows_only
        PREPARE[way] = functools.partial(_data_without, statements)


def add_baseline(revision: str) -> None:
    """Measure the group functions over ``functions.sql`` at git ``revision`` too."""
    way = baseline_way(revision)
    text = functions_at(revision)
    if "a embedding_job_attempts, p_worker" in text:
        raise SystemExit(
            f"--baseline {revision}: its functions fence on a STARTED attempt row, which this"
            " schema no longer writes (the running attempt is on the job row); measure that"
            " revision's tree with its own bench/sql_floor.py in the same series instead"
        )
    WAYS[way] = functools.partial(
        group_functions,
        whole="trioindex_store_documents_many" in text,
        parse_prepare="trioindex_begin_parse_many" in text,
    )
    PREPARE[way] = functools.partial(use_functions, text)


def measure(pg: BenchPostgres, corpus: Corpus, way: str, group: int = GROUP) -> dict[str, Any]:
    with pg.fresh_database("sql_floor") as url:
        with connect(url) as conn:
            setup = enqueue_all(conn, corpus, group)
            if way in PREPARE:
                PREPARE[way](conn)
        pg.quiesce(url)
        writes_before = table_writes(url)
        before = pg.counters(url, settle_seconds=5)
        began = time.monotonic()
        with connect(url) as conn:
            documents = WAYS[way](conn, corpus, setup)
        wall = time.monotonic() - began
        after = pg.counters(url, settle_seconds=10)
        if documents != len(corpus.texts):
            raise RuntimeError(f"{way}: {documents} of {len(corpus.texts)} documents written")
        writes = writes_per_document(writes_before, table_writes(url), documents)
        with connect(url) as conn:
            left = rows_left(conn)
        return {
            "way": way,
            "documents": documents,
            "wall_s": round(wall, 3),
            "postgres_cpu_ms_per_doc": (after.server_cpu_s - before.server_cpu_s) / documents * 1e3,
            "xacts_per_doc": (after.xact_commit - before.xact_commit) / documents,
            "wal_bytes_per_doc": pg.wal_bytes(before, after) / documents,
            "rows_left": left,
            "writes_per_doc": writes,
        }


# What another revision's functions may record differently: its events and attempt columns.
_BOOKKEEPING = ("events ", "attempts ")


def check_same_rows(runs: Sequence[dict[str, Any]]) -> None:
    """The set-based way and the two-step path must leave exactly the rows the group functions
    leave (by table, status, event type with its detail's keys, attempt steps and counts, and
    job progress), or the set-based figure is not their floor; the baseline's functions the same data, jobs and served
    versions (their events and attempt records may differ: that is what a change cuts)."""
    product = next(r["rows_left"] for r in runs if r["way"] == "trioindex's group functions")
    for run in runs:
        if run["way"] in ("the same rows, set-based", "the group functions, chunks stored first"):
            ignored: tuple[str, ...] = ()
        elif run["way"].startswith(baseline_way("")):
            ignored = _BOOKKEEPING
        else:
            continue
        keys = {k for k in product.keys() | run["rows_left"].keys() if not k.startswith(ignored)}
        differ = sorted(k for k in keys if product.get(k) != run["rows_left"].get(k))
        if differ:
            raise RuntimeError(f"{run['way']} leaves other rows: {differ}")


def _span(values: Sequence[float], digits: int = 2) -> str:
    low, high = min(values), max(values)
    if round(low, digits) == round(high, digits):
        return f"{low:,.{digits}f}"
    return f"{low:,.{digits}f}–{high:,.{digits}f}"


def summary(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    def median_of(way: str) -> float:
        return statistics.median(r["postgres_cpu_ms_per_doc"] for r in runs if r["way"] == way)

    product = median_of("trioindex's group functions")
    data = median_of("the document's data only")
    rows = []
    for way in WAYS:
        mine = [r for r in runs if r["way"] == way]
        cpu = [r["postgres_cpu_ms_per_doc"] for r in mine]
        rows.append({
            "way": way,
            "cpu_ms": cpu,
            "median_cpu_ms": statistics.median(cpu),
            "share_of_group_functions": statistics.median(cpu) / product,
            "times_data_floor": statistics.median(cpu) / data,
            "xacts": [r["xacts_per_doc"] for r in mine],
            "wal_bytes": [r["wal_bytes_per_doc"] for r in mine],
        })  # fmt: skip
    return rows


def writes_table(runs: Sequence[dict[str, Any]]) -> list[str]:
    """Rows written per document, by table, for the group functions (and the baseline's):
    "inserted / updated (HOT) / deleted", from the last round of each."""
    ways = [w for w in WAYS if w.startswith(("trioindex's group functions",
                                             "the group functions"))]  # fmt: skip
    last = {r["way"]: r["writes_per_doc"] for r in runs if r["way"] in ways}
    tables = sorted({t for writes in last.values() for t in writes})

    def cell(way: str, table: str) -> str:
        ins, upd, hot, dele = last[way].get(table, [0.0, 0.0, 0.0, 0.0])
        return f"{ins:.2f} / {upd:.2f} ({hot:.2f}) / {dele:.2f}"

    rows = [[t, *(cell(w, t) for w in ways)] for t in tables]
    totals = ["**all tables**"]
    for way in ways:
        sums = [sum(v[i] for v in last[way].values()) for i in range(4)]
        totals.append(f"{sums[0]:.2f} / {sums[1]:.2f} ({sums[2]:.2f}) / {sums[3]:.2f}")
    return markdown_table(["table (inserted / updated (HOT) / deleted per document)", *ways],
                          [*rows, totals])  # fmt: skip


GOAL = 1.5  # the group functions' CPU per document, at most this many times the data's alone


def verdict(rows: Sequence[dict[str, Any]]) -> str:
    """The group functions against the goal (medians of this run), and against the baseline's
    functions when measured."""
    by_way = {r["way"]: r for r in rows}
    ours = by_way["trioindex's group functions"]
    same_rows = by_way["the same rows, set-based"]
    text = (
        f"The group functions cost {ours['times_data_floor']:.2f}× the document's data alone "
        f"(goal: at most {GOAL}×) and "
        f"{ours['median_cpu_ms'] / same_rows['median_cpu_ms']:.2f}× the same rows written "
        "set-based"
    )
    for way, row in by_way.items():
        if way.startswith(baseline_way("")):
            text += (
                f"; {way} cost {row['times_data_floor']:.2f}× the data alone, so the group "
                f"functions cost {ours['median_cpu_ms'] / row['median_cpu_ms']:.2f}× theirs"
            )
    return text + "."


def markdown(
    session: Session,
    machine: dict[str, Any],
    rows: list[dict[str, Any]],
    runs: Sequence[dict[str, Any]],
) -> Any:
    def page(date: str, elapsed: float, png: str) -> str:
        lines = page_head("PostgreSQL CPU per small document, and its floor", date,
                          session.command, elapsed, machine, about=__doc__ or "")  # fmt: skip
        table = [
            [r["way"], _span(r["cpu_ms"], 3), f"{r['share_of_group_functions']:.2f}",
             f"{r['times_data_floor']:.2f}", _span(r["xacts"]), _span(r["wal_bytes"], 0)]
            for r in rows
        ]  # fmt: skip
        lines += ["## Results", "", f"![sql floor]({png})", "",
                  *markdown_table(["way", "PostgreSQL CPU ms/doc", "median / group functions",
                                   "median / data only", "xacts/doc", "WAL bytes/doc"], table),
                  "",
                  "Checked in every round (`check_same_rows`): the set-based way left exactly "
                  "the rows the group functions left (rows per table, per status, per event "
                  "type with its detail's keys, per attempt's steps and counts, per job "
                  "progress, and the text statistics); the baseline's functions, if measured, "
                  "the same data, jobs, served versions and text statistics (their events and "
                  "attempt records may differ). The baseline runs another revision's functions "
                  "over this revision's schema. Tables a way needs of its own are made before "
                  "its measurement.",
                  "", verdict(rows), "",
                  "## Rows written per document", "",
                  "Every row version each way's measured part wrote (claim and the three group "
                  "statements; `pg_stat_user_tables`, triggers included), per document:", "",
                  *writes_table(runs), ""]  # fmt: skip
        return "\n".join(lines)

    return page


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench_parser("sql_floor", "PostgreSQL CPU per small document.", "200 documents, once")
    parser.add_argument("--rounds", type=int, default=None, help=f"interleaved rounds ({ROUNDS})")
    parser.add_argument(
        "--baseline",
        metavar="REV",
        default=None,
        help="also measure functions.sql as git revision REV has it (say main)",
    )
    parser.add_argument(
        "--group", type=int, default=GROUP, help=f"jobs per group statement ({GROUP})"
    )
    parser.add_argument(
        "--parts",
        action="store_true",
        help="also write the data without its full-text column or a vector's foreign key",
    )
    add_out(parser, "sql_floor")
    args: argparse.Namespace = parser.parse_args(argv)
    if args.group < 1:
        parser.error(f"--group must be at least 1, not {args.group}")
    session = Session.start("sql_floor", args)
    if args.baseline:
        add_baseline(args.baseline)
    if args.parts:
        add_parts()
    count = QUICK_DOCUMENTS if args.quick else DOCUMENTS
    rounds = args.rounds or (QUICK_ROUNDS if args.quick else ROUNDS)
    rng = np.random.default_rng(13)
    corpus = Corpus(
        chunk_texts(count, characters=CHARACTERS, salt="floor"),
        rng.standard_normal((count, DIMENSION)).astype(np.float32),
    )
    runs = []
    with BenchPostgres() as pg:
        machine = machine_info(pg.admin_url)
        for _ in range(rounds):
            for way in WAYS:
                run = measure(pg, corpus, way, args.group)
                runs.append(run)
                print(f"{way:<28} {run['postgres_cpu_ms_per_doc']:.3f} ms/doc PostgreSQL CPU, "
                      f"{run['xacts_per_doc']:.2f} xacts/doc", flush=True)  # fmt: skip
    check_same_rows(runs)
    rows = summary(runs)
    print(verdict(rows), flush=True)
    print("\n".join(writes_table(runs)), flush=True)

    def plot(path: Path) -> Path:
        medians: Sequence[float] = [r["median_cpu_ms"] for r in rows]
        bars = {"PostgreSQL CPU ms/doc (median)": medians}
        panel = Panel("PostgreSQL CPU per document", "ms", groups=[r["way"] for r in rows],
                      bars=bars)  # fmt: skip
        return plot_panels(path, [panel], (8, 4))

    figures = {"documents": count, "group": args.group, "dimension": DIMENSION, "runs": runs,
               "summary": rows}  # fmt: skip
    return session.publish(machine, figures, plot, markdown(session, machine, rows, runs))


if __name__ == "__main__":
    raise SystemExit(main())
