"""The Trio API applications build on: :class:`Index`, over the same database, object store and
embedding model as the CLI.

``Index.open(settings)`` opens the shared resources (:func:`trioindex.services.open_services`;
the schema is migrated and the configured model registered, as every command does). The
embedding model is opened on the first search that needs it, so a text-only search or an
ingest never loads it; with the local model, a search borrows the model a worker of the same
home has loaded when one lends it (:mod:`trioindex.embedding.warm`). Queries are answered by
:class:`~trioindex.search.answers.QueryAnswerer`; ingest, wait and delete go to
:mod:`trioindex.ingest`, :mod:`trioindex.progress` and :mod:`trioindex.removal`.

A query that cannot be answered (too long, too many terms, a vector that cannot be ranked:
:mod:`trioindex.search.query`) is a :class:`~trioindex.search.QueryRefused`: ``search`` raises
it, ``search_many`` returns it in that query's place and answers the others.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from trioindex.api.reports import FailedDocument, IngestReport
from trioindex.config import Settings, load_settings
from trioindex.db.models import EmbeddingModel
from trioindex.embedding import Embedder
from trioindex.ingest import IngestEntry, IngestResult, ingest_paths
from trioindex.ingest.bucket import ingest_bucket, plain_paths
from trioindex.removal import DeleteReport, delete_documents
from trioindex.search import (
    DEFAULT_HNSW,
    DEFAULT_MODE,
    ChunkHit,
    DocumentHit,
    HnswSettings,
    SearchMode,
)
from trioindex.search.answers import Answer, QueryAnswerer, raise_refused
from trioindex.services import (
    Services,
    open_configured_embedder,
    open_search_embedder,
    open_services,
)

__all__ = ["Index"]

if TYPE_CHECKING:
    from trioindex.api.sync_index import SyncIndex


class Index:
    """An open trioindex: search it, ingest into it, delete from it.

    Use from Trio::

        async with Index.open(settings) as index:
            hits = await index.search("how do workers share a queue")

    Every method may be called from several tasks at once (database calls share the pool).
    """

    def __init__(self, settings: Settings, services: Services) -> None:
        self._settings = settings
        self._services = services
        self._embedder: Embedder | None = None
        self._embedder_lock = trio.Lock()
        self._answerer = QueryAnswerer.configured(
            settings.search, services.db, services.model, self._query_embedder
        )

    @classmethod
    def open(cls, settings: Settings | None = None) -> AbstractAsyncContextManager[Index]:
        """Open the index configured by ``settings`` (default: :func:`load_settings`, i.e.
        ``trioindex.toml`` and ``TRIOINDEX_*`` as the CLI reads them)."""
        return _open_index(cls, settings if settings is not None else load_settings())

    @classmethod
    def open_sync(cls, settings: Settings | None = None) -> SyncIndex:
        """A :class:`SyncIndex` (use it as a ``with`` block) for code that is not async."""
        # sync_index builds on this module: imported when asked for
        from trioindex.api.sync_index import SyncIndex

        return SyncIndex(settings)

    @property
    def model(self) -> EmbeddingModel:
        """The configured embedding model: queries are embedded with it, and new documents
        are indexed with it. Vector and hybrid searches need it to be the model serving search
        (``trioindex models``); otherwise they raise ``ModelNotServing`` naming that model."""
        return self._services.model

    async def search(
        self,
        query: str,
        *,
        top_k: int = 5,
        mode: SearchMode = DEFAULT_MODE,
        key_prefix: str | None = None,
        content_types: Sequence[str] = (),
        low_confidence: bool | None = None,
        chunks_per_document: int = 3,
    ) -> list[DocumentHit]:
        """The ``top_k`` documents that best answer ``query``, best first, each with its best
        ``chunks_per_document`` chunks. ``key_prefix`` keeps documents whose key starts with it
        (a folder: ``"papers/"``); ``content_types`` keeps documents of those types
        (``"text/markdown"``, or a family: ``"text"``); ``low_confidence`` True keeps only the
        documents whose version OCR marked as of low confidence, False only the others. Raises
        :class:`~trioindex.search.QueryRefused` for a query it cannot answer."""
        (hits,) = await self.search_many(
            [query],
            top_k=top_k,
            mode=mode,
            key_prefix=key_prefix,
            content_types=content_types,
            low_confidence=low_confidence,
            chunks_per_document=chunks_per_document,
        )
        return raise_refused(hits)

    async def search_chunks(
        self,
        query: str,
        *,
        top_k: int = 5,
        mode: SearchMode = DEFAULT_MODE,
        key_prefix: str | None = None,
        content_types: Sequence[str] = (),
        low_confidence: bool | None = None,
    ) -> list[ChunkHit]:
        """The ``top_k`` best chunks, best first, however many come from one document."""
        (hits,) = await self.search_chunks_many(
            [query],
            top_k=top_k,
            mode=mode,
            key_prefix=key_prefix,
            content_types=content_types,
            low_confidence=low_confidence,
        )
        return raise_refused(hits)

    async def search_many(
        self,
        queries: Sequence[str],
        *,
        top_k: int = 5,
        mode: SearchMode = DEFAULT_MODE,
        key_prefix: str | None = None,
        content_types: Sequence[str] = (),
        low_confidence: bool | None = None,
        chunks_per_document: int = 3,
        hnsw: HnswSettings = DEFAULT_HNSW,
    ) -> list[Answer[DocumentHit]]:
        """One list of document hits (as :meth:`search`) per query, in order: the queries are
        embedded together (in the embedder's batches) and ranked concurrently on the pool. A
        query that cannot be answered gets its :class:`~trioindex.search.QueryRefused` in its
        place; the others are answered all the same."""
        return await self._answerer.documents(
            queries,
            top_k=top_k,
            mode=mode,
            key_prefix=key_prefix,
            content_types=content_types,
            low_confidence=low_confidence,
            chunks_per_document=chunks_per_document,
            hnsw=hnsw,
        )

    async def search_chunks_many(
        self,
        queries: Sequence[str],
        *,
        top_k: int = 5,
        mode: SearchMode = DEFAULT_MODE,
        key_prefix: str | None = None,
        content_types: Sequence[str] = (),
        low_confidence: bool | None = None,
        hnsw: HnswSettings = DEFAULT_HNSW,
    ) -> list[Answer[ChunkHit]]:
        """One list of chunk hits (as :meth:`search_chunks`) per query, in order, as
        :meth:`search_many` ranks (or refuses) them."""
        return await self._answerer.chunks(
            queries,
            top_k=top_k,
            mode=mode,
            key_prefix=key_prefix,
            content_types=content_types,
            low_confidence=low_confidence,
            hnsw=hnsw,
        )

    async def open_model(self) -> Embedder:
        """Open the embedding model now instead of at the first search that needs it (a
        service that answers searches keeps it open from its start): this process's own,
        never one borrowed from a worker; returns it."""
        async with self._embedder_lock:
            if self._embedder is None:
                self._embedder = await open_configured_embedder(self._settings)
            return self._embedder

    async def _query_embedder(self) -> Embedder:
        async with self._embedder_lock:
            if self._embedder is None:
                self._embedder = await open_search_embedder(self._settings)
            return self._embedder

    async def ingest(
        self,
        paths: Sequence[str | Path],
        *,
        wait: bool = False,
        priority: int = 0,
        follow_symlinks: bool = False,
        key_as: str | None = None,
        sync: bool = False,
        include: Sequence[str] = (),
        exclude: Sequence[str] = (),
        show_progress: bool = False,
    ) -> IngestReport:
        """Upload files and folders and enqueue a job per new or changed document, as
        ``trioindex ingest`` does (``key_as`` is ``--as``; ``sync`` is ``--sync``: delete the
        documents each folder's ingests found whose files are gone; ``include`` /
        ``exclude`` are the globs of ``--include`` / ``--exclude``). Files of a format
        trioindex does not index are ``skipped``. An ``s3://BUCKET/PREFIX`` argument registers
        the objects already in the configured bucket in place, without uploading them
        (:mod:`trioindex.ingest.bucket`). ``wait=True`` returns once every job it queued has
        ended, as :meth:`wait` does."""
        services = self._services
        local, buckets = plain_paths(paths)
        entries: list[IngestEntry] = []
        for location in buckets:
            entries += await ingest_bucket(
                location,
                db=services.db,
                store=services.storage,
                model_id=services.model.id,
                max_attempts=self._settings.worker.max_attempts,
                max_bytes=self._settings.parsing.max_document_bytes,
                priority=priority,
                sync=sync,
            )
        if local or not buckets:
            entries += await ingest_paths(
                local,
                db=services.db,
                store=services.storage,
                model_id=services.model.id,
                max_attempts=self._settings.worker.max_attempts,
                priority=priority,
                follow_symlinks=follow_symlinks,
                key_as=key_as,
                sync=sync,
                include=include,
                exclude=exclude,
                max_document_bytes=self._settings.parsing.max_document_bytes,
            )
        report = IngestReport(tuple(entries))
        return await self.wait(report, show_progress=show_progress) if wait else report

    async def wait(self, report: IngestReport, *, show_progress: bool = False) -> IngestReport:
        """Wait until every job ``report``'s ingest queued has ended (a worker must be running;
        ``show_progress`` shows the progress on stdout and says when no live worker is
        registered); ``report`` with the documents that failed and those deleted meanwhile."""
        from trioindex.progress import wait_for_jobs

        entries = report.entries
        waited = await wait_for_jobs(
            self._services.db,
            list(report.queued),
            show=show_progress,
            heartbeat_timeout=self._settings.worker.heartbeat_timeout,
        )
        failures = tuple(
            FailedDocument(f["external_key"], f["last_failure_type"], f["last_failure_message"])
            for f in waited.finals
            if f["status"] == "FAILED"
        )
        removed = tuple(
            sorted(
                e.document_key
                for e in entries
                if isinstance(e, IngestResult) and e.job_id in waited.removed
            )
        )
        return IngestReport(entries, failures, removed)

    async def delete(self, keys: Sequence[str] = (), *, prefix: str | None = None) -> DeleteReport:
        """Delete documents by key and/or key prefix, as ``trioindex delete`` does: they leave
        search when one transaction commits; then the blobs no version names any more are
        removed from the store."""
        return await delete_documents(
            self._services.db, self._services.storage, keys, prefix=prefix
        )

    async def aclose(self) -> None:
        await self._answerer.aclose()
        if self._embedder is not None:
            embedder, self._embedder = self._embedder, None
            await embedder.aclose()


@asynccontextmanager
async def _open_index(cls: type[Index], settings: Settings) -> AsyncIterator[Index]:
    async with open_services(settings) as services:
        index = cls(settings, services)
        try:
            yield index
        finally:
            with trio.CancelScope(shield=True):
                await index.aclose()
