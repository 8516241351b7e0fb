"""Ingest: find the files, put each in object storage, then enqueue it in one transaction.

One module per stage of a run:

* :mod:`.discover` — what a run covers (:func:`discover`): files named directly, and every
  visible file under the folders named, without leaving them through a symbolic link unless
  asked to;
* :mod:`.files` — one file (:func:`ingest_file`): read + hash once, upload (or restore a lost
  blob) (:func:`prepare_file`), enqueue (:func:`enqueue_files`, many files at once);
* :mod:`trioindex.db.enqueue` — :func:`enqueue_versions`: document + version + job per file
  + one ``NOTIFY``, many files in one transaction;
* :mod:`.results` — what is reported per file (:class:`IngestResult`, :class:`SkippedFile`,
  :class:`DeletedDocument`);
* :mod:`.sync` — ``sync``: which documents the folders hold lost their files;
* :mod:`trioindex.db.folders` — each folder argument's recorded key root, and the documents
  its ingests found;
* here — :func:`ingest_paths`, a whole run: one entry per file, and a file that cannot be
  ingested is reported (:class:`SkippedFile`) instead of ending the run.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final
from uuid import UUID

import trio

from trioindex.db.documents import database_now
from trioindex.db.enqueue import (
    NOTIFY_CHANNEL,
    NewVersion,
    enqueue_version,
    enqueue_versions,
    latest_version,
    latest_versions,
    requeue_failed_job,
)
from trioindex.db.folders import claim_folders, folder_roots, hold_documents
from trioindex.db.pool import Database
from trioindex.ingest.discover import (
    MAX_KEY_CHARS,
    Discovery,
    SourceFile,
    argument_key,
    discover,
    is_text,
)
from trioindex.ingest.files import (
    PreparedFile,
    digest,
    enqueue_files,
    ingest_file,
    open_source,
    prepare_file_sync,
    storage_key_for,
)
from trioindex.ingest.indexable import skip_non_documents
from trioindex.ingest.results import (
    DeletedDocument,
    FileChanged,
    FileNotIngested,
    IngestEntry,
    IngestResult,
    SkippedFile,
    printable,
)
from trioindex.ingest.sync import delete_missing, plan_sync
from trioindex.storage import AsyncObjectStore, ObjectStore

__all__ = [
    "MAX_KEY_CHARS",
    "NOTIFY_CHANNEL",
    "DeletedDocument",
    "Discovery",
    "FileChanged",
    "FileNotIngested",
    "IngestEntry",
    "IngestResult",
    "NewVersion",
    "SkippedFile",
    "SourceFile",
    "digest",
    "discover",
    "enqueue_version",
    "enqueue_versions",
    "ingest_file",
    "ingest_paths",
    "latest_version",
    "latest_versions",
    "open_source",
    "printable",
    "requeue_failed_job",
    "storage_key_for",
]

logger = logging.getLogger(__name__)

# Files per enqueue transaction: one WAL flush and one NOTIFY for the group, not one per file
# (a run of small files was bound by those), while a transaction stays well under a second.
FILES_PER_TRANSACTION: Final = 256
# Slices of a group read, hashed and uploaded at once, each in one store thread (its files one
# after another: a thread hop costs more CPU than a small file). As many as the store has
# threads (services.py), so S3 keeps 8 uploads in flight; on a folder store 4 and 8 measured
# alike (more threads mostly contend for the GIL; its fsyncs wait once per slice).
FILES_AT_ONCE: Final = 8


async def ingest_paths(
    paths: Sequence[Path],
    *,
    db: Database,
    store: AsyncObjectStore,
    model_id: UUID,
    max_attempts: int,
    priority: int = 0,
    follow_symlinks: bool = False,
    key_as: str | None = None,
    sync: bool = False,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    max_document_bytes: int | None = None,
) -> list[IngestEntry]:
    """Ingest every file under ``paths``; one entry per file, in a stable order.

    Files are read and uploaded in :data:`FILES_AT_ONCE` slices at a time and enqueued
    :data:`FILES_PER_TRANSACTION` to a transaction (:func:`_ingest_files`); each file's entry is
    what ingesting it alone would have given.

    A file that cannot be ingested becomes an ``error`` :class:`SkippedFile` and the run goes
    on; entries left out by a rule are ``skipped``. A storage or database outage still ends
    the run (every later file would fail the same way, and a re-run is safe). Document keys:
    :func:`~trioindex.ingest.discover.argument_key` (``key_as`` is ``--as``).

    Each folder argument is recorded with its key root the first time
    (:mod:`trioindex.db.folders`); later runs key its files under that root from any current
    folder and by any name of it, unless ``key_as`` names another (then recorded instead).
    The documents of the files found under a folder are held by it.

    ``sync``: after every file, the documents each folder argument holds whose file is missing
    (and that got no version since the sync began, and that no unrelated folder holds) are
    deleted, one :class:`DeletedDocument` entry each, at the end (:mod:`trioindex.ingest.sync`).

    ``include`` / ``exclude``: globs that choose the files (:class:`~.discover.Globs`). With
    ``max_document_bytes``, files of a format trioindex does not index are ``skipped`` before
    upload (:mod:`.indexable`).
    """
    started = await db.run(database_now) if sync else None
    roots = await _folder_roots(db, paths, key_as=key_as)
    walk = functools.partial(
        discover,
        list(paths),
        follow_symlinks=follow_symlinks,
        key_as=key_as,
        include=include,
        exclude=exclude,
        roots={path: root for path, (_, root) in roots.items()},
    )
    found = await trio.to_thread.run_sync(walk)
    # recorded once the walk did not refuse the run (two files, one key)
    records = await db.run(claim_folders, list(roots.values())) if roots else []
    claimed = dict(zip(roots, records, strict=True))
    if max_document_bytes is not None:
        found = await trio.to_thread.run_sync(
            functools.partial(skip_non_documents, found, max_bytes=max_document_bytes)
        )
    plan = plan_sync(list(claimed.items()), found, started=started) if sync else None
    entries = await _ingest_files(
        found.entries,
        db=db,
        store=store,
        model_id=model_id,
        max_attempts=max_attempts,
        priority=priority,
    )
    held = [
        (claimed[source.folder].id, entry.document_id)
        for source, entry in zip(found.entries, entries, strict=True)
        if isinstance(source, SourceFile)
        and source.folder is not None
        and isinstance(entry, IngestResult)
    ]
    if held:
        await db.run(hold_documents, [f for f, _ in held], [d for _, d in held])
    for entry in entries:
        if isinstance(entry, SkippedFile):
            logger.info(
                "ingest %s: %s (%s)", entry.document_key or entry.path, entry.status, entry.reason
            )
    if plan is not None:
        if plan.blocked is not None:
            logger.warning("ingest %s: %s", plan.blocked.path, plan.blocked.reason)
            entries.append(plan.blocked)
        entries.extend(await delete_missing(db, store, plan))
    return entries


async def _folder_roots(
    db: Database, paths: Sequence[Path], *, key_as: str | None
) -> dict[Path, tuple[bytes, str]]:
    """Each folder argument's resolved path and key root (:func:`folder_roots`: the
    recorded one, unless ``key_as``; else :func:`argument_key`'s)."""

    def resolve() -> list[tuple[Path, bytes, str]]:
        return [
            (p, os.fsencode(os.path.realpath(p)), argument_key(p, key_as=key_as))
            for p in dict.fromkeys(paths)
            if p.is_dir()
        ]

    # a root that is not UTF-8 is no key (each file under it is an error): nothing to record
    folders = [f for f in await trio.to_thread.run_sync(resolve) if is_text(f[2])]
    if not folders:
        return {}
    roots = await db.run(
        folder_roots, [(real, root) for _, real, root in folders], override=key_as is not None
    )
    return {path: (real, root) for (path, real, _), root in zip(folders, roots, strict=True)}


async def _ingest_files(
    found: Sequence[SourceFile | SkippedFile],
    *,
    db: Database,
    store: AsyncObjectStore,
    model_id: UUID,
    max_attempts: int,
    priority: int,
) -> list[IngestEntry]:
    """Every file of ``found`` in groups of :data:`FILES_PER_TRANSACTION`: one query for the
    group's latest versions, its files read and uploaded (:func:`_prepare_group`), then one
    enqueue transaction; the entries in ``found``'s order."""
    entries: dict[int, IngestEntry] = {
        i: item for i, item in enumerate(found) if isinstance(item, SkippedFile)
    }
    sources = [(i, item) for i, item in enumerate(found) if isinstance(item, SourceFile)]
    for start in range(0, len(sources), FILES_PER_TRANSACTION):
        group = sources[start : start + FILES_PER_TRANSACTION]
        latest = await db.run(latest_versions, [source.document_key for _, source in group])
        prepared = await _prepare_group(group, latest, store)
        entries.update((i, p) for i, p in prepared.items() if isinstance(p, SkippedFile))
        ready = [(i, p) for i, p in sorted(prepared.items()) if isinstance(p, PreparedFile)]
        results = await enqueue_files(
            [p for _, p in ready],
            db=db,
            model_id=model_id,
            max_attempts=max_attempts,
            priority=priority,
        )
        entries.update((i, result) for (i, _), result in zip(ready, results, strict=True))
    return [entries[i] for i in range(len(found))]


async def _prepare_group(
    group: Sequence[tuple[int, SourceFile]],
    latest: Mapping[str, Mapping[str, object]],
    store: AsyncObjectStore,
) -> dict[int, PreparedFile | SkippedFile]:
    """:func:`prepare_file_sync` for each file of ``group``, in :data:`FILES_AT_ONCE` slices run
    at once, one store thread hop per slice (the store's limiter bounds them); a file that
    cannot be ingested becomes its ``error`` entry, and the first storage or database error
    cancels the rest and is raised (as itself, not in an exception group)."""

    def prepare_slice(
        files: Sequence[tuple[int, SourceFile]], blocking: ObjectStore
    ) -> dict[int, PreparedFile | SkippedFile]:
        slice_done: dict[int, PreparedFile | SkippedFile] = {}
        # the slice's uploads are durable before any of them is reported (and enqueued)
        with blocking.deferred_sync():
            for i, source in files:
                trio.from_thread.check_cancelled()  # a cancelled run stops between files
                try:
                    slice_done[i] = prepare_file_sync(
                        source, blocking, latest=latest.get(source.document_key)
                    )
                except FileNotIngested as exc:
                    slice_done[i] = SkippedFile(
                        printable(source.path), source.document_key, "error", exc.reason
                    )
        return slice_done

    done: dict[int, PreparedFile | SkippedFile] = {}
    for slice_done in await store.run_slices(group, prepare_slice, slices=FILES_AT_ONCE):
        done.update(slice_done)
    return done
