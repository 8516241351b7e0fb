"""Deleting documents: the rows of a document and everything under it, in one transaction.

A document row owns its versions, and through them its chunks, embeddings, jobs and attempts
(the foreign keys cascade), so deleting the row removes the document from
search and its data in the same transaction. Locks are taken in the lifecycle's order — job
rows, then version rows, then document rows — so a worker's fenced write racing the delete
either commits first (and its rows go with the document) or waits and then finds its job gone
(``TI003`` → :class:`~trioindex.errors.JobRemoved`: it stops without writing).

Blobs are content-addressed and shared by every version with the same bytes, so a deletion
only *reports* the storage keys no remaining version names; removing them from the store is
the caller's next step (:func:`trioindex.removal.delete_documents`). Deleting a document
ends its history: ingesting the key again starts a new document at version 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import attrs

from trioindex.db.pool import Connection


@attrs.frozen
class DeletedDocuments:
    """What one deletion removed: ``deleted`` keys (sorted), ``missing`` keys that were asked
    for by name and did not exist, and ``unreferenced_blobs``: storage keys of the deleted
    versions that no remaining version names (safe to remove from the store)."""

    deleted: tuple[str, ...]
    missing: tuple[str, ...]
    unreferenced_blobs: tuple[str, ...]
    versions: int


def keys_under(conn: Connection, prefix: str) -> list[str]:
    """Every document key that starts with ``prefix`` (all keys for ""), sorted."""
    rows = conn.execute(
        "SELECT external_key FROM documents WHERE starts_with(external_key, %s) ORDER BY 1",
        (prefix,),
    ).fetchall()
    return [row["external_key"] for row in rows]


def blob_unreferenced(conn: Connection, storage_key: str) -> bool:
    """Whether no version names ``storage_key`` (its blob may be removed from the store)."""
    row = conn.execute(
        "SELECT 1 FROM document_versions WHERE storage_key = %s LIMIT 1", (storage_key,)
    ).fetchone()
    return row is None


def database_now(conn: Connection) -> datetime:
    """The database's clock: the start of a run that must not touch what comes after it."""
    row = conn.execute("SELECT clock_timestamp() AS now").fetchone()
    assert row is not None
    now: datetime = row["now"]
    return now


def delete_documents(
    conn: Connection,
    keys: Sequence[str] = (),
    *,
    prefix: str | None = None,
    unchanged_since: datetime | None = None,
) -> DeletedDocuments:
    """Delete the documents named by ``keys`` and those whose key starts with ``prefix``.

    One transaction (``trioindex_delete_documents``, the function applications call from SQL
    too): the documents leave search, and their versions, chunks, embeddings, jobs
    and attempts are deleted with them. An empty ``prefix`` is refused (it would be every
    document); name keys to delete everything. With ``unchanged_since`` (a database time), a
    document that got a version at or after it is kept, decided under the document's lock:
    ``ingest --sync`` never deletes what another ingest added while it ran. A model switch
    that was waiting only for the deleted documents ends right after
    (``trioindex_finish_switch``).
    """
    if prefix == "":
        raise ValueError("an empty prefix would delete every document; name the keys instead")
    with conn.transaction():
        row = conn.execute(
            "SELECT * FROM trioindex_delete_documents(%s::text[], %s, %s)",
            (list(keys), prefix, unchanged_since),
        ).fetchone()
    assert row is not None
    # its own transaction: ending a switch waits for completions, which may wait for documents
    conn.execute("SELECT trioindex_finish_switch()")
    return DeletedDocuments(
        deleted=tuple(row["deleted"]),
        missing=tuple(row["missing"]),
        unreferenced_blobs=tuple(row["unreferenced_blobs"]),
        versions=row["versions"],
    )
