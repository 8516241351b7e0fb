"""``ingest --sync``: delete the documents under a folder's key prefix whose files are gone.

The prefix comes from the one key rule (:func:`~trioindex.ingest.discover.argument_key`): a
folder keyed ``docs`` covers the keys ``docs/...``; a folder keyed ``""`` (``ingest .``) covers
every key. A document is deleted only when its file was seen missing: the key maps back to its
path under the folder, and nothing exists there (``os.path.lexists``, checked after every file
was ingested) — a file the walk leaves out (a dot-name, a link) is never "gone". A document is
also kept when the walk found an entry with its key, when it lies under an entry the walk
could not read or left out (a folder link, an unreadable folder with a key), and when it got a
version after the sync started (another ingest added it meanwhile: the deletion decides that
under the document's lock, :func:`trioindex.db.documents.delete_documents`).
When the walk has an error it cannot name a key for (an unreadable folder, a name that is not
UTF-8), nothing is deleted: which documents still have files is then unknown. A folder outside
the current one without ``--as`` is refused: its keys start below it, so they share one
namespace with every other such folder, and syncing one would delete the others.

Only folder arguments sync; files named directly are ingested as usual. Deleting is
:func:`trioindex.removal.delete_documents` (rows, then blobs), after every file was ingested.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

import attrs

from trioindex.db import documents
from trioindex.db.pool import Database
from trioindex.errors import TrioindexError
from trioindex.ingest.discover import Discovery, argument_key, keyed_by_itself
from trioindex.ingest.results import DeletedDocument, SkippedFile, printable
from trioindex.removal import delete_documents
from trioindex.storage import AsyncObjectStore

__all__ = ["SyncPlan", "SyncRefused", "delete_missing", "plan_sync"]


class SyncRefused(TrioindexError):
    """``--sync`` cannot tell which documents belong to the folder (nothing was ingested)."""


@attrs.frozen
class SyncPlan:
    """What one sync covers: the key ``prefixes`` of its ``folders`` (one each), the keys the
    walk found (``present``), the keys under which nothing is deleted (``kept_under``),
    ``started`` (the database time before the walk: newer documents are kept), and
    ``blocked``: when set, why nothing is deleted at all."""

    prefixes: tuple[str, ...]
    present: frozenset[str]
    kept_under: tuple[str, ...]
    blocked: SkippedFile | None = None
    folders: tuple[Path, ...] = ()
    started: datetime | None = None

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
    paths: Sequence[Path],
    found: Discovery,
    *,
    cwd: Path | None = None,
    key_as: str | None = None,
    started: datetime | None = None,
) -> SyncPlan:
    """The sync of the folder arguments among ``paths``, from the walk ``found`` (which began
    at the database time ``started``).

    Raises :class:`SyncRefused` for a folder outside ``cwd`` without ``key_as`` (call it
    before ingesting anything).
    """
    folders = [p for p in paths if p.is_dir()]
    outside = [] if key_as is not None else keyed_by_itself(folders, cwd=cwd)
    if outside:
        raise SyncRefused(
            f"--sync: {printable(outside[0])} is outside the current folder, so its keys start "
            "below it and could be another folder's; give it a key prefix with --as NAME, or "
            "run from a folder that contains it"
        )
    prefixes = []
    for folder in folders:
        key = argument_key(folder, cwd=cwd, key_as=key_as)
        prefixes.append(f"{key}/" if key else "")
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
    return SyncPlan(tuple(prefixes), present, kept, blocked, tuple(folders), started)


async def delete_missing(
    db: Database, store: AsyncObjectStore, plan: SyncPlan
) -> list[DeletedDocument]:
    """Delete the stored documents the plan covers; one entry per deleted document, by key."""
    if plan.blocked is not None or not plan.prefixes:
        return []
    stored: set[str] = set()
    for prefix in set(plan.prefixes):
        stored.update(await db.run(documents.keys_under, prefix))
    gone = sorted(key for key in stored if plan.covers(key))
    if not gone:
        return []
    report = await delete_documents(db, store, gone, unchanged_since=plan.started)
    return [DeletedDocument(key) for key in report.deleted]
