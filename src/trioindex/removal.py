"""Removing documents for callers with a database and a store open: the rows first, then the
blobs no version names any more (``trioindex delete``, ``Index.delete``, ``ingest --sync``).

The database work is :mod:`trioindex.db.documents` (one transaction); here the unreferenced
blobs are removed from the object store after that transaction committed. A blob is shared by
every version with the same bytes, so each is checked again just before it is removed; an
ingest of the same bytes racing that last check can still lose its blob, which the next
ingest of the file restores (``repaired``, docs/design/architecture.md "Repair").
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime

import attrs

from trioindex.db import documents
from trioindex.db.pool import Database
from trioindex.errors import StorageUnavailable
from trioindex.storage import AsyncObjectStore
from trioindex.storage.contract import OWN_BLOB_PREFIX

__all__ = ["DeleteReport", "delete_documents"]

logger = logging.getLogger(__name__)


@attrs.frozen
class DeleteReport:
    """``deleted`` / ``missing`` document keys, blobs removed from the store, and blobs that
    could not be removed (the store failed; they are left behind, harmless but unused)."""

    deleted: tuple[str, ...]
    missing: tuple[str, ...]
    blobs_removed: int
    blobs_left: int

    def as_json(self) -> dict[str, object]:
        return attrs.asdict(self)


async def delete_documents(
    db: Database,
    store: AsyncObjectStore,
    keys: Sequence[str] = (),
    *,
    prefix: str | None = None,
    unchanged_since: datetime | None = None,
) -> DeleteReport:
    """Delete documents by key and/or key prefix (those unchanged since ``unchanged_since``, a
    database time, when given); they leave search when the one database transaction commits,
    then their blobs no version names any more are removed — trioindex's own
    (``sha256/...``) only, never an application's object registered in place."""
    result = await db.run(
        documents.delete_documents, list(keys), prefix=prefix, unchanged_since=unchanged_since
    )
    removed = left = 0
    # only trioindex's own content-addressed blobs: an object registered in place (an
    # application's, from `ingest s3://` or a bucket notification) is never removed
    for blob in (b for b in result.unreferenced_blobs if b.startswith(OWN_BLOB_PREFIX)):
        try:
            if await db.run(documents.blob_unreferenced, blob):
                await store.delete(blob)
                removed += 1
        except StorageUnavailable as exc:
            left += 1
            logger.warning("delete: blob %s left in the store (%s)", blob, exc)
    if result.deleted:
        logger.info(
            "deleted %d document(s), %d version(s); %d blob(s) removed",
            len(result.deleted),
            result.versions,
            removed,
        )
    return DeleteReport(result.deleted, result.missing, removed, left)
