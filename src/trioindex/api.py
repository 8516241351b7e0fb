"""The Python API applications build on: :class:`Index` (Trio) and :class:`SyncIndex` (plain
synchronous code), over the same database, object store and embedding model as the CLI.

``Index.open(settings)`` opens the shared resources (:func:`trioindex.services.open_services`;
the schema is migrated and the configured model registered, as every command does). The
embedding model is opened on the first search that needs it, so a text-only search or an
ingest never loads it; with the local model, a search borrows the model a worker of the same
home has loaded when one lends it (:mod:`trioindex.embedding.warm`). ``SyncIndex`` runs one
Trio event loop in a background thread for its whole life and sends each call to it, so a
synchronous program pays the start-up (database, model) once, not per call.

A query that cannot be answered (too long, too many terms, a vector that cannot be ranked:
:mod:`trioindex.search.query`) is a :class:`~trioindex.search.QueryRefused`: ``search`` raises
it, ``search_many`` returns it in that query's place and answers the others.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar
from uuid import UUID

import attrs
import psycopg
import trio

from trioindex.config import Settings, load_settings
from trioindex.db.models import EmbeddingModel, check_serving, serving_model
from trioindex.embedding import Embedder
from trioindex.ingest import IngestEntry, IngestResult, ingest_paths
from trioindex.ingest.bucket import ingest_bucket, plain_paths
from trioindex.removal import DeleteReport, delete_documents
from trioindex.search import (
    DEFAULT_HNSW,
    DEFAULT_MODE,
    SEARCH_MODES,
    Bm25,
    ChunkHit,
    DocumentHit,
    Filters,
    HnswSettings,
    QueryRefused,
    RankedChunk,
    SearchMode,
    chunk_hits,
    document_hits,
    embed_queries,
    hybrid_fusion,
    prepare_query,
    text_ranking,
    vector_ranking,
)
from trioindex.search.marking import marked_chunk_hits, marked_document_hits
from trioindex.search.query import filter_text
from trioindex.services import (
    Services,
    open_configured_embedder,
    open_search_embedder,
    open_services,
)

__all__ = ["FailedDocument", "Index", "IngestReport", "SyncIndex", "connect"]

if TYPE_CHECKING:
    from trioindex.search.rerank import Reranker

T = TypeVar("T")
H = TypeVar("H")
#: One query's answer from ``search_many``: its hits, or why it was refused.
Answer = list[H] | QueryRefused

#: Ranked chunks fetched per requested document (a document's chunks are grouped from them).
CANDIDATES_PER_DOCUMENT = 4
#: The least depth of each ranking that document search fuses, of a text or re-ranked chunk
#: search, and of per-document grouping.
MIN_CANDIDATES = 50
MAX_CANDIDATES = 1000
#: How deep hybrid's two rankings are per chunk asked for when chunks are searched without a
#: re-ranker: each text result probes its served row; on `just eval`'s known-item set the fused
#: top 10 was the same with text lists 30 and 50 deep, and a vector list 20 deep instead of 50
#: moved one query's hit (docs/test-results/search.md). The vector list is ranked from the
#: candidates of a list as deep as the chunks asked for (20 per chunk:
#: :mod:`trioindex.db.vector_index`), as vector search takes: on 100k chunks the fused top 10
#: was the same for 200 queries of 200, at the vector search's cost instead of twice its
#: candidates'.
HYBRID_VECTOR_DEPTH_PER_CHUNK = 2
HYBRID_TEXT_DEPTH_PER_CHUNK = 3


@attrs.frozen
class FailedDocument:
    """A document whose job, waited for, ended ``FAILED``: the failure type and the job's
    bounded last failure message (never chunk text)."""

    document_key: str
    failure_type: str
    message: str | None


@attrs.frozen
class IngestReport:
    """What :meth:`Index.ingest` did: one entry per file (``created``, ``unchanged``,
    ``repaired``, ``skipped``, ``error``) and, when it waited, the documents whose job ended
    ``FAILED`` (``failures``) and the keys whose documents were deleted while it waited
    (``removed``: their jobs can never finish)."""

    entries: tuple[IngestEntry, ...]
    failures: tuple[FailedDocument, ...] = ()
    removed: tuple[str, ...] = ()

    @property
    def queued(self) -> tuple[UUID, ...]:
        """The jobs this ingest queued: new versions', and failed jobs it sent back."""
        return tuple(
            e.job_id
            for e in self.entries
            if isinstance(e, IngestResult) and e.job_id and (e.status == "created" or e.requeued)
        )

    @property
    def failed(self) -> tuple[tuple[str, str], ...]:
        """``(document_key, failure_type)`` of each failure."""
        return tuple((f.document_key, f.failure_type) for f in self.failures)

    @property
    def errors(self) -> tuple[IngestEntry, ...]:
        return tuple(e for e in self.entries if e.status == "error")


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
        search = settings.search
        self._bm25 = Bm25(search.bm25_k1, search.bm25_b)
        self._reranker: Reranker | None = None
        if search.rerank_url:
            # the HTTP client it brings is imported only by those who rerank
            from trioindex.search.rerank import Reranker

            self._reranker = Reranker(
                search.rerank_url, top_n=search.rerank_top_n, timeout=search.rerank_timeout
            )

    @classmethod
    def open(cls, settings: Settings | None = None) -> AbstractAsyncContextManager[Index]:
        """Open the index configured by ``settings`` (default: :func:`load_settings`, i.e.
        ``trioindex.toml`` and ``TRIOINDEX_*`` as the CLI reads them)."""
        return _open_index(cls, settings if settings is not None else load_settings())

    @classmethod
    def open_sync(cls, settings: Settings | None = None) -> SyncIndex:
        """A :class:`SyncIndex` (use it as a ``with`` block) for code that is not async."""
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
        return _raise_refused(hits)

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
        return _raise_refused(hits)

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
        if top_k < 1 or chunks_per_document < 1:
            raise ValueError("top_k and chunks_per_document must be at least 1")
        depth = max(MIN_CANDIDATES, top_k * chunks_per_document * CANDIDATES_PER_DOCUMENT)
        filters = _filters(key_prefix, content_types, low_confidence)
        ranked = await self._rank_many(queries, min(depth, MAX_CANDIDATES), mode, filters, hnsw)
        db = self._services.db
        return [
            r
            if isinstance(r, QueryRefused)
            else await db.run(marked_document_hits, q, document_hits(r, top_k, chunks_per_document))
            for q, r in zip(queries, ranked, strict=True)
        ]

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
        if top_k < 1:
            raise ValueError("top_k must be at least 1")
        if mode == "hybrid" and self._reranker is None:
            # a re-ranker re-orders the fused list's first top_n: it keeps both lists deep
            depth, vector_depth = (
                HYBRID_TEXT_DEPTH_PER_CHUNK * top_k,
                HYBRID_VECTOR_DEPTH_PER_CHUNK * top_k,
            )
        else:
            depth = vector_depth = top_k if mode == "vector" else max(top_k, MIN_CANDIDATES)
        filters = _filters(key_prefix, content_types, low_confidence)
        ranked = await self._rank_many(
            queries,
            min(depth, MAX_CANDIDATES),
            mode,
            filters,
            hnsw,
            vector_depth=min(vector_depth, depth, MAX_CANDIDATES),
            vector_candidates_for=top_k if vector_depth > top_k else None,
        )
        db = self._services.db
        return [
            r
            if isinstance(r, QueryRefused)
            else await db.run(marked_chunk_hits, q, chunk_hits(r, top_k))
            for q, r in zip(queries, ranked, strict=True)
        ]

    async def _rank_many(
        self,
        queries: Sequence[str],
        depth: int,
        mode: SearchMode,
        filters: Filters,
        hnsw: HnswSettings,
        *,
        vector_depth: int | None = None,
        vector_candidates_for: int | None = None,
    ) -> list[Answer[RankedChunk]]:
        """The ``depth`` best chunks per query in ``mode``, or why that query was refused;
        hybrid fuses both rankings, the text one ``depth`` deep and the vector one
        ``vector_depth`` deep (``depth`` when None), from the candidates of a vector list
        ``vector_candidates_for`` deep (its own depth when None)."""
        if mode not in SEARCH_MODES:
            raise ValueError(f"unknown search mode {mode!r}")
        db = self._services.db
        if mode == "text":
            model = await db.run(serving_model) or self.model
        else:
            # the query is embedded with the configured model: it must be the serving one
            model = await db.run(check_serving, self.model)
        texts = [_prepared(q) for q in queries]
        prepared = [(i, t) for i, t in enumerate(texts) if isinstance(t, str)]
        by_text: list[Answer[RankedChunk]] = [[] for _ in queries]
        by_vector: list[Answer[RankedChunk]] = [[] for _ in queries]

        async def rank_text(i: int, text: str) -> None:
            by_text[i] = await _answer(
                db.run(text_ranking, model, text, depth, filters=filters, bm25=self._bm25)
            )

        async def rank_vector(i: int, vector: list[float]) -> None:
            by_vector[i] = await _answer(
                db.run(
                    vector_ranking,
                    model,
                    vector,
                    depth if vector_depth is None else vector_depth,
                    filters=filters,
                    hnsw=hnsw,
                    candidates_for=vector_candidates_for,
                )
            )

        async def embed_then_rank(nursery: trio.Nursery) -> None:
            embedder = await self._query_embedder()
            vectors = await embed_queries(embedder, model, [t for _, t in prepared])
            for (i, _), vector in zip(prepared, vectors, strict=True):
                if isinstance(vector, QueryRefused):
                    by_vector[i] = vector
                else:
                    nursery.start_soon(rank_vector, i, vector)

        # hybrid: the text rankings run while the queries are embedded and ranked by vector
        async with trio.open_nursery() as nursery:
            if mode != "vector":
                for i, prepared_text in prepared:
                    nursery.start_soon(rank_text, i, prepared_text)
            if mode != "text" and prepared:
                nursery.start_soon(embed_then_rank, nursery)
        answers: list[Answer[RankedChunk]] = []
        for text, by_vec, by_txt in zip(texts, by_vector, by_text, strict=True):
            if isinstance(text, QueryRefused):
                answers.append(text)
            elif isinstance(by_vec, QueryRefused):
                answers.append(by_vec)
            elif isinstance(by_txt, QueryRefused):
                answers.append(by_txt)
            elif mode == "hybrid":
                answers.append(hybrid_fusion(by_vec, by_txt)[:depth])
            else:
                answers.append(by_txt if mode == "text" else by_vec)
        if mode == "hybrid" and self._reranker is not None:
            await self._rerank(queries, answers, self._reranker)
        return answers

    async def _rerank(
        self, queries: Sequence[str], answers: list[Answer[RankedChunk]], reranker: Reranker
    ) -> None:
        """Each answered query's fused chunks re-ordered by the re-ranker, concurrently."""

        async def rerank(i: int, fused: list[RankedChunk]) -> None:
            answers[i] = await reranker.rerank(queries[i], fused)

        async with trio.open_nursery() as nursery:
            for i, answer in enumerate(answers):
                if not isinstance(answer, QueryRefused):
                    nursery.start_soon(rerank, i, answer)

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
        if self._reranker is not None:
            await self._reranker.aclose()
        if self._embedder is not None:
            embedder, self._embedder = self._embedder, None
            await embedder.aclose()


def _raise_refused(answer: Answer[H]) -> list[H]:
    if isinstance(answer, QueryRefused):
        raise answer
    return answer


def _prepared(query: str) -> str | QueryRefused:
    try:
        return prepare_query(query)
    except QueryRefused as refused:
        return refused


async def _answer(ranking: Awaitable[list[RankedChunk]]) -> Answer[RankedChunk]:
    """One query's ranking, or its refusal: the query's own input refused by the ranking (too
    many terms) or by the database (a value or size its SQL cannot take). A lost connection is
    not this query's fault and fails the whole call."""
    try:
        return await ranking
    except QueryRefused as refused:
        return refused
    except psycopg.Error as exc:
        by_database = QueryRefused.for_database(exc)
        if by_database is None:
            raise
        return by_database


def _filters(
    key_prefix: str | None, content_types: Sequence[str], low_confidence: bool | None = None
) -> Filters:
    """The filters of a search, each value checked (:func:`filter_text`)."""
    return Filters(
        filter_text(key_prefix, "key_prefix") if key_prefix else None,
        tuple(filter_text(t, "content_types") for t in content_types),
        low_confidence,
    )


@asynccontextmanager
async def _open_index(cls: type[Index], settings: Settings) -> AsyncIterator[Index]:
    async with open_services(settings) as services:
        index = cls(settings, services)
        try:
            yield index
        finally:
            with trio.CancelScope(shield=True):
                await index.aclose()


class SyncIndex:
    """:class:`Index` for synchronous code: the same methods, blocking.

    ::

        with trioindex.connect() as index:
            for hit in index.search("how do workers share a queue"):
                print(hit.score, hit.document_key)

    One Trio event loop runs in a background thread from ``open()`` (or entering the ``with``
    block) to ``close()``; calls from any thread are sent to it.
    """

    def __init__(self, settings: Settings | None = None) -> None:
        self._settings = settings
        self._index: Index | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._thread: threading.Thread | None = None
        self._failure: list[BaseException] = []

    def open(self) -> SyncIndex:
        if self._thread is not None:
            raise RuntimeError("this SyncIndex is already open")
        settings = self._settings if self._settings is not None else load_settings()
        ready = threading.Event()

        async def serve() -> None:
            async with Index.open(settings) as index:
                self._index, self._stop = index, trio.Event()
                self._token = trio.lowlevel.current_trio_token()
                ready.set()
                await self._stop.wait()

        def run() -> None:
            try:
                trio.run(serve)
            except BaseException as exc:  # handed to the caller's thread
                self._failure.append(exc)
            finally:
                ready.set()

        self._thread = threading.Thread(target=run, name="trioindex-index", daemon=True)
        self._thread.start()
        ready.wait()
        if self._index is None:
            self._thread.join()
            raise self._failure[0]
        return self

    def close(self) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        if self._stop is not None and thread.is_alive():
            trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        thread.join()
        self._index = None
        if self._failure:
            raise self._failure[0]

    def __enter__(self) -> SyncIndex:
        return self if self._thread is not None else self.open()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _call(self, fn: Callable[[Index], Awaitable[T]]) -> T:
        index = self._index
        if index is None:
            raise RuntimeError("this SyncIndex is not open (use it in a `with` block)")
        return trio.from_thread.run(functools.partial(fn, index), trio_token=self._token)

    @property
    def model(self) -> EmbeddingModel:
        if self._index is None:
            raise RuntimeError("this SyncIndex is not open (use it in a `with` block)")
        return self._index.model

    def search(
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
        """:meth:`Index.search`, blocking."""
        return self._call(
            lambda index: index.search(
                query,
                top_k=top_k,
                mode=mode,
                key_prefix=key_prefix,
                content_types=content_types,
                low_confidence=low_confidence,
                chunks_per_document=chunks_per_document,
            )
        )

    def search_chunks(
        self,
        query: str,
        *,
        top_k: int = 5,
        mode: SearchMode = DEFAULT_MODE,
        key_prefix: str | None = None,
        content_types: Sequence[str] = (),
        low_confidence: bool | None = None,
    ) -> list[ChunkHit]:
        """:meth:`Index.search_chunks`, blocking."""
        return self._call(
            lambda index: index.search_chunks(
                query,
                top_k=top_k,
                mode=mode,
                key_prefix=key_prefix,
                content_types=content_types,
                low_confidence=low_confidence,
            )
        )

    def search_many(
        self,
        queries: Sequence[str],
        *,
        top_k: int = 5,
        mode: SearchMode = DEFAULT_MODE,
        key_prefix: str | None = None,
        content_types: Sequence[str] = (),
        low_confidence: bool | None = None,
        chunks_per_document: int = 3,
    ) -> list[Answer[DocumentHit]]:
        """:meth:`Index.search_many` (document hits, or a refusal per query), blocking."""
        return self._call(
            lambda index: index.search_many(
                queries,
                top_k=top_k,
                mode=mode,
                key_prefix=key_prefix,
                content_types=content_types,
                low_confidence=low_confidence,
                chunks_per_document=chunks_per_document,
            )
        )

    def ingest(
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
    ) -> IngestReport:
        """:meth:`Index.ingest`, blocking."""
        return self._call(
            lambda index: index.ingest(
                paths,
                wait=wait,
                priority=priority,
                follow_symlinks=follow_symlinks,
                key_as=key_as,
                sync=sync,
                include=include,
                exclude=exclude,
            )
        )

    def wait(self, report: IngestReport) -> IngestReport:
        """:meth:`Index.wait`, blocking."""
        return self._call(lambda index: index.wait(report))

    def delete(self, keys: Sequence[str] = (), *, prefix: str | None = None) -> DeleteReport:
        """:meth:`Index.delete`, blocking."""
        return self._call(lambda index: index.delete(keys, prefix=prefix))


def connect(settings: Settings | None = None) -> SyncIndex:
    """Open a :class:`SyncIndex` now (``with trioindex.connect() as index: ...``)."""
    return SyncIndex(settings).open()
