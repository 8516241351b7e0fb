"""The folders ``ingest`` was given: each one's key root, and the documents it holds.

A folder is recorded by its resolved path (bytes), the first time it is ingested, with the key
root its files were keyed under (``""``: keyed from itself); every later ingest of the folder,
from any current folder and by any name (a link, a relative path), keys its files under that
root, unless ``--as`` names another (which is then recorded). Every file an ingest finds under
a folder is *held* by it (:func:`hold_documents`). ``--sync`` deletes only documents the folder
holds, or holds through a folder above or below it keyed the same way (:func:`sync_candidates`),
and a document that an unrelated folder also holds is only released by this one
(:func:`release_shared`): two folders keyed into one namespace never delete each other's
documents.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from uuid import UUID

import attrs

from trioindex.db.pool import Connection
from trioindex.ingest.discover import is_text

__all__ = [
    "IngestFolder",
    "claim_folders",
    "folder_roots",
    "hold_documents",
    "release_shared",
    "sync_candidates",
]


@attrs.frozen
class IngestFolder:
    """A recorded folder: its id, resolved path and key root (``""`` or ``docs/sub``)."""

    id: UUID
    real_path: bytes
    key_root: str

    def key_of(self, real_path: bytes) -> str | None:
        """The key root a folder at ``real_path`` has under this one's keys (None: it is not
        this folder or below it)."""
        if real_path == self.real_path:
            return self.key_root
        if not real_path.startswith(self.real_path.rstrip(b"/") + b"/"):
            return None
        below = os.fsdecode(real_path[len(self.real_path.rstrip(b"/")) + 1 :])
        return f"{self.key_root}/{below}" if self.key_root else below

    def agrees_with(self, other: IngestFolder) -> bool:
        """Whether a file under both folders has one key under either (one is below the other,
        keyed alike)."""
        return (
            self.key_of(other.real_path) == other.key_root
            or other.key_of(self.real_path) == self.key_root
        )


def folder_roots(
    conn: Connection, folders: Sequence[tuple[bytes, str]], *, override: bool
) -> list[str]:
    """The key root of each ``(real_path, key_root)``: the one given when ``override``
    (``--as``), else its record's, else the one the nearest recorded folder above it gives it
    (its files keep their keys), else the one given. Records nothing (:func:`claim_folders`
    does, once the run's walk found no reason to refuse it)."""
    return [root if override else _inherited_root(conn, path, root) for path, root in folders]


def claim_folders(conn: Connection, folders: Sequence[tuple[bytes, str]]) -> list[IngestFolder]:
    """Record each ``(real_path, key_root)`` with that root (:func:`folder_roots` chose it);
    one :class:`IngestFolder` each, in order."""
    claimed = []
    with conn.transaction():
        for real_path, key_root in folders:
            row = conn.execute(
                """INSERT INTO ingest_folders (real_path, key_root) VALUES (%s, %s)
                   ON CONFLICT (real_path) DO UPDATE
                   SET key_root = excluded.key_root, last_ingested_at = now()
                   RETURNING id, real_path, key_root""",
                (real_path, key_root),
            ).fetchone()
            assert row is not None
            claimed.append(IngestFolder(row["id"], bytes(row["real_path"]), row["key_root"]))
    return claimed


def _inherited_root(conn: Connection, real_path: bytes, key_root: str) -> str:
    """The root of the folder at ``real_path``: its own record's, else the nearest recorded
    folder above it gives it, else ``key_root``."""
    rows = conn.execute(
        """SELECT id, real_path, key_root FROM ingest_folders
           WHERE substring(%s FROM 1 FOR octet_length(real_path)) = real_path
           ORDER BY octet_length(real_path) DESC""",
        (real_path,),
    ).fetchall()
    for row in rows:
        above = IngestFolder(row["id"], bytes(row["real_path"]), row["key_root"])
        inherited = above.key_of(real_path)
        if inherited is not None:
            return inherited if is_text(inherited) else key_root
    return key_root


def hold_documents(
    conn: Connection, folder_ids: Sequence[UUID], document_ids: Sequence[UUID]
) -> None:
    """Each folder of ``folder_ids`` holds the document at the same place of ``document_ids``
    (a document deleted meanwhile is left out)."""
    conn.execute(
        """INSERT INTO ingest_folder_documents (folder_id, document_id)
           SELECT h.folder_id, h.document_id
           FROM unnest(%s::uuid[], %s::uuid[]) AS h (folder_id, document_id)
           JOIN documents d ON d.id = h.document_id
           ON CONFLICT DO NOTHING""",
        (list(folder_ids), list(document_ids)),
    )


def related_folders(conn: Connection, folder: IngestFolder) -> list[UUID]:
    """``folder`` and the recorded folders above or below it keyed alike (a file under two of
    them has one key)."""
    rows = conn.execute(
        """SELECT id, real_path, key_root FROM ingest_folders
           WHERE substring(%(path)s FROM 1 FOR octet_length(real_path)) = real_path
              OR substring(real_path FROM 1 FOR octet_length(%(path)s)) = %(path)s""",
        {"path": folder.real_path},
    ).fetchall()
    others = [IngestFolder(r["id"], bytes(r["real_path"]), r["key_root"]) for r in rows]
    return [folder.id] + [o.id for o in others if o.id != folder.id and o.agrees_with(folder)]


def sync_candidates(conn: Connection, folder: IngestFolder) -> tuple[list[str], list[UUID]]:
    """The keys a sync of ``folder`` may delete (sorted) when their files are gone: under its
    key root, and held by it or a related folder (:func:`related_folders`), or, under a
    non-empty root, held by no folder at all (documents ingested by file name, or before
    folders were recorded); and the related folders' ids."""
    related = related_folders(conn, folder)
    prefix = f"{folder.key_root}/" if folder.key_root else ""
    rows = conn.execute(
        """SELECT d.external_key FROM documents d
           WHERE starts_with(d.external_key, %(prefix)s)
             AND (EXISTS (SELECT 1 FROM ingest_folder_documents h
                          WHERE h.document_id = d.id AND h.folder_id = ANY(%(related)s))
                  OR (%(prefix)s <> '' AND NOT EXISTS (
                          SELECT 1 FROM ingest_folder_documents h WHERE h.document_id = d.id)))
           ORDER BY 1""",
        {"prefix": prefix, "related": related},
    ).fetchall()
    return [row["external_key"] for row in rows], related


def release_shared(conn: Connection, related: Sequence[UUID], keys: Sequence[str]) -> list[str]:
    """Of ``keys`` (whose files are gone from the related folders), those some other folder
    also holds: the related folders' holds on them are dropped and they are returned (kept).
    Each document row is locked first, so two syncs releasing one document take turns and the
    second finds itself its last holder."""
    with conn.transaction():
        conn.execute(
            "SELECT 1 FROM documents WHERE external_key = ANY(%s) ORDER BY id FOR UPDATE",
            (list(keys),),
        )
        rows = conn.execute(
            """DELETE FROM ingest_folder_documents h USING documents d
               WHERE h.document_id = d.id AND h.folder_id = ANY(%(related)s)
                 AND d.external_key = ANY(%(keys)s)
                 AND EXISTS (SELECT 1 FROM ingest_folder_documents o
                             WHERE o.document_id = d.id AND NOT o.folder_id = ANY(%(related)s))
               RETURNING d.external_key""",
            {"related": list(related), "keys": list(keys)},
        ).fetchall()
    return sorted({row["external_key"] for row in rows})
