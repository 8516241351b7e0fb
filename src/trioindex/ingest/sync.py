"""``ingest --sync``: delete the documents a folder holds whose files are gone.

A folder's documents are those under its key root (recorded for it, :mod:`trioindex.db.folders`:
a folder keyed ``docs`` covers the keys ``docs/...``, one keyed ``""`` every key) that its
ingests found (or a folder's above or below it keyed alike), or, under a non-empty root, that no
folder's ingest found (files ingested by name, documents from before folders were recorded).
A document is deleted only when its file was seen missing: the key maps back to its
path under the folder, and nothing exists there (``os.path.lexists``, checked after every file
was ingested) — a file the walk leaves out (a dot-name, a link) is never "gone". A document is
also kept when the walk found an entry with its key, when it lies under an entry the walk
could not read or left out (a folder link, an unreadable folder with a key), and when it got a
version after the sync started (another ingest added it meanwhile: the deletion decides that
under the document's lock, :func:`trioindex.db.documents.delete_documents`). A document another
folder's ingest also found is not deleted: this folder only lets go of it, and the last folder
holding it deletes it when its file is gone there too. When the walk has an error it cannot
name a key for (an unreadable folder, a name that is not UTF-8), nothing is deleted: which
documents still have files is then unknown. So a folder outside the current one, keyed from
itself, syncs from anywhere without deleting another such folder's documents.

Only folder arguments sync; files named directly are ingested as usual. Deleting is
:func:`trioindex.removal.delete_documents` (rows, then blobs), after every file was ingested.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

import attrs

from trioindex.db import folders as recorded
from trioindex.db.folders import IngestFolder
from trioindex.db.pool import Database
from trioindex.ingest.discover import Discovery
from trioindex.ingest.results import DeletedDocument, SkippedFile, printable
from trioindex.removal import delete_documents
from trioindex.storage import AsyncObjectStore

__all__ = ["SyncPlan", "delete_missing", "plan_sync"]


@attrs.frozen
class SyncPlan:
    """What one sync covers: the key ``prefixes`` of its ``folders`` (one each, as recorded:
    ``recorded``), the keys the walk found (``present``), the keys under which nothing is
    deleted (``kept_under``), ``started`` (the database time before the walk: newer documents
    are kept), and ``blocked``: when set, why nothing is deleted at all."""

    prefixes: tuple[str, ...]
    present: frozenset[str]
    kept_under: tuple[str, ...]
    blocked: SkippedFile | None = None
    folders: tuple[Path, ...] = ()
    started: datetime | None = None
    recorded: tuple[IngestFolder, ...] = ()

    def covers(self, key: str) -> bool:
        """Whether ``key`` is under a prefix, not kept by the walk, and its file is missing
        (deleted if stored)."""
        if key in self.present or any(
            key == kept or key.startswith(kept + "/") for kept in self.kept_under
        ):
            return False
        paths = [
            folder / key[len(prefix) :]
            for prefix, folder in zip(self.prefixes, self.folders, strict=True)
            if key.startswith(prefix)
        ]
        return bool(paths) and not any(os.path.lexists(path) for path in paths)


def plan_sync(
    claimed: Sequence[tuple[Path, IngestFolder]],
    found: Discovery,
    *,
    started: datetime | None = None,
) -> SyncPlan:
    """The sync of the folder arguments ``claimed`` (each with its record), from the walk
    ``found`` (which began at the database time ``started``)."""
    folders = [path for path, _ in claimed]
    prefixes = [f"{f.key_root}/" if f.key_root else "" for _, f in claimed]
    present = frozenset(e.document_key for e in found.entries if e.document_key is not None)
    kept = tuple(
        e.document_key
        for e in found.entries
        if isinstance(e, SkippedFile) and e.document_key is not None
    )
    unnamed = [
        e
        for e in found.entries
        if isinstance(e, SkippedFile) and e.document_key is None and e.status == "error"
    ]
    blocked = None
    if unnamed and prefixes:
        blocked = SkippedFile(
            printable(folders[0]),
            None,
            "skipped",
            f"--sync deleted nothing: {len(unnamed)} entr{'y' if len(unnamed) == 1 else 'ies'} "
            "of the walk could not be read or named, so which documents still have files "
            "is unknown",
        )
    return SyncPlan(
        tuple(prefixes),
        present,
        kept,
        blocked,
        tuple(folders),
        started,
        tuple(f for _, f in claimed),
    )


async def delete_missing(
    db: Database, store: AsyncObjectStore, plan: SyncPlan
) -> list[DeletedDocument]:
    """Delete the documents the plan covers that no unrelated folder holds (those it only
    lets go of); one entry per deleted document, by key."""
    if plan.blocked is not None or not plan.prefixes:
        return []
    gone: set[str] = set()
    for folder in plan.recorded:
        candidates, related = await db.run(recorded.sync_candidates, folder)
        missing = [key for key in candidates if plan.covers(key)]
        if missing:
            kept = await db.run(recorded.release_shared, related, missing)
            gone.update(set(missing) - set(kept))
    if not gone:
        return []
    report = await delete_documents(db, store, sorted(gone), unchanged_since=plan.started)
    return [DeletedDocument(key) for key in report.deleted]
