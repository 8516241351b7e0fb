""":class:`SyncIndex`, :class:`~trioindex.api.index.Index` for plain synchronous code, and
:func:`connect`. ``SyncIndex`` runs one Trio event loop in a background thread for its whole
life and sends each call to it, so a synchronous program pays the start-up (database, model)
once, not per call.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TypeVar

import trio

from trioindex.api.index import Index
from trioindex.api.reports import IngestReport
from trioindex.config import Settings, load_settings
from trioindex.db.models import EmbeddingModel
from trioindex.removal import DeleteReport
from trioindex.search import DEFAULT_MODE, ChunkHit, DocumentHit, SearchMode
from trioindex.search.answers import Answer

__all__ = ["SyncIndex", "connect"]

T = TypeVar("T")


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
