"""Document version status: every write of ``document_versions.status`` from Python, one named
function per transition.

A version moves through the pipeline like this; the writer of each step is named so that a
change to one transition has exactly one place to go::

    (ingest inserts it)  UPLOADED
    UPLOADED  → PARSING    trioindex_mark_parsing (SQL, migration 0005), in the parse step's
                                            prepare (trioindex_begin_parse_many, one job or many)
    CHUNKED   → EMBEDDING  mark_embedding   embed step, prepare (SQL trioindex_mark_embedding)
    PARSING   → EMBEDDING  trioindex_mark_embedding, from the chunk commit (migrations 0005 and
                                            0008, one job or a group: chunks stored and
                                            embedding begun at once; a version already
                                            CHUNKED that gets another chunk set moves too)
    EMBEDDING → INDEXED    trioindex_complete_job (SQL, migrations 0003 and 0006: fenced with
                                            the job)
    any       → FAILED     mark_failed      a failure report with no retry left (db/jobs.py);
                                            not an INDEXED version (another model's job)
                           FAILED_WHERE_ID_IN  lease recovery on the last attempt, as part of
                                            its one statement (db/jobs.py)
    FAILED    → UPLOADED   mark_uploaded    an operator retry (db/jobs.py ``retry_failed``)

None of these checks ownership or the current status: the caller does that under its locks, in
the order job row → version row → document row (:func:`lock_version` takes the second), inside
its own transaction.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from trioindex.db.pool import Connection
from trioindex.errors import StateInconsistent

# The FAILED transition over the versions whose ids the ``{ids}`` subquery yields. Lease
# recovery embeds it in its one statement (a CTE over the jobs it failed); mark_failed passes
# one id. Both use this text, so the transition is written once.
# A version another model already INDEXED stays INDEXED: a model switch's failed job must not
# take away what the serving model indexed.
FAILED_WHERE_ID_IN = (
    "UPDATE document_versions SET status = 'FAILED' WHERE id IN ({ids}) AND status <> 'INDEXED'"
)


def lock_version(conn: Connection, version_id: UUID) -> dict[str, Any]:
    """Lock the version row (always after the job row) and return it."""
    row = conn.execute(
        "SELECT * FROM document_versions WHERE id = %s FOR UPDATE", (version_id,)
    ).fetchone()
    if row is None:
        raise StateInconsistent("the job's document version does not exist")
    return row


def mark_embedding(conn: Connection, version_id: UUID) -> None:
    """CHUNKED → EMBEDDING: the embed step has started (the SQL function that the group chunk
    commit of migration 0005 calls for PARSING → EMBEDDING)."""
    conn.execute("SELECT trioindex_mark_embedding(%s, NULL)", (version_id,))


def mark_failed(conn: Connection, version_id: UUID) -> None:
    """→ FAILED: the version's job failed for good."""
    conn.execute(FAILED_WHERE_ID_IN.format(ids="%s"), (version_id,))


def mark_uploaded(conn: Connection, version_id: UUID) -> None:
    """FAILED → UPLOADED: an operator retry runs the whole pipeline again (the parse step
    replaces the chunks atomically). An INDEXED version (a model switch's job failed on it)
    keeps its chunks and status: the retried job only embeds them."""
    conn.execute(
        "UPDATE document_versions SET status = 'UPLOADED' WHERE id = %s AND status = 'FAILED'",
        (version_id,),
    )
