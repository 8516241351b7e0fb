"""Ingest: find the files, put each in object storage, then enqueue it in one transaction.

One module per stage of a run:

* :mod:`.discover` — what a run covers (:func:`discover`): files named directly, and every
  visible file under the folders named, without leaving them through a symbolic link unless
  asked to;
* :mod:`.files` — one file (:func:`ingest_file`): read + hash once, upload (or restore a lost
  blob), enqueue;
* :mod:`.enqueue` — :func:`enqueue_version`: document + version + job + ``NOTIFY`` in one
  transaction;
* :mod:`.results` — what is reported per file (:class:`IngestResult`, :class:`SkippedFile`);
* here — :func:`ingest_paths`, a whole run: one entry per file, and a file that cannot be
  ingested is reported (:class:`SkippedFile`) instead of ending the run.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from uuid import UUID

import trio

from trioindex.db.pool import Database
from trioindex.ingest.discover import MAX_KEY_CHARS, Discovery, SourceFile, discover
from trioindex.ingest.enqueue import (
    NOTIFY_CHANNEL,
    enqueue_version,
    latest_version,
    requeue_failed_job,
)
from trioindex.ingest.files import digest, ingest_file, open_source, storage_key_for
from trioindex.ingest.results import (
    FileChanged,
    FileNotIngested,
    IngestEntry,
    IngestResult,
    SkippedFile,
    printable,
)
from trioindex.storage import AsyncObjectStore

__all__ = [
    "MAX_KEY_CHARS",
    "NOTIFY_CHANNEL",
    "Discovery",
    "FileChanged",
    "FileNotIngested",
    "IngestEntry",
    "IngestResult",
    "SkippedFile",
    "SourceFile",
    "digest",
    "discover",
    "enqueue_version",
    "ingest_file",
    "ingest_paths",
    "latest_version",
    "open_source",
    "printable",
    "requeue_failed_job",
    "storage_key_for",
]

logger = logging.getLogger(__name__)


async def ingest_paths(
    paths: Sequence[Path],
    *,
    db: Database,
    store: AsyncObjectStore,
    model_id: UUID,
    max_attempts: int,
    priority: int = 0,
    follow_symlinks: bool = False,
) -> list[IngestEntry]:
    """Ingest every file under ``paths``, one after another; one entry per file, in a stable order.

    A file that cannot be ingested becomes an ``error`` :class:`SkippedFile` and the run goes
    on; entries left out by a rule are ``skipped``. A storage or database outage still ends
    the run (every later file would fail the same way, and a re-run is safe).
    """
    found = await trio.to_thread.run_sync(
        functools.partial(discover, list(paths), follow_symlinks=follow_symlinks)
    )
    one_file = functools.partial(
        ingest_file,
        db=db,
        store=store,
        model_id=model_id,
        max_attempts=max_attempts,
        priority=priority,
    )
    entries: list[IngestEntry] = []
    for item in found.entries:
        entry: IngestEntry = (
            item if isinstance(item, SkippedFile) else await _ingest_or_report(one_file, item)
        )
        if isinstance(entry, SkippedFile):
            logger.info(
                "ingest %s: %s (%s)", entry.document_key or entry.path, entry.status, entry.reason
            )
        entries.append(entry)
    return entries


async def _ingest_or_report(
    one_file: Callable[[SourceFile], Awaitable[IngestResult]], source: SourceFile
) -> IngestEntry:
    try:
        return await one_file(source)
    except FileNotIngested as exc:
        return SkippedFile(printable(source.path), source.document_key, "error", exc.reason)
