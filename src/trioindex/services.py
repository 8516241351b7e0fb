"""The shared resources a command opens from :class:`Settings`: the database (migrated), the
object store, the configured embedding model's row, and (when asked) the embedder.

Every command that needs one gets it here — the worker too (:mod:`trioindex.worker.wiring`
builds the worker on top) — so "which database / storage / embedder is in use" is decided and
logged (one line each, never a credential) in one place. Settings flow in only: the opened
:class:`Services` do not carry them on.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING

import attrs
import trio

from trioindex.config import Settings
from trioindex.db.models import EmbeddingModel, ensure_model
from trioindex.db.pool import (
    Database,
    describe_conninfo,
    open_database,
    session_conninfo,
    start_embedded,
)
from trioindex.storage import AsyncObjectStore, open_store, redact_url

if TYPE_CHECKING:  # imported when an embedder is opened: `status` and `jobs` need none of it
    from trioindex.embedding import Embedder

logger = logging.getLogger(__name__)


async def resolve_database_url(settings: Settings) -> str:
    if settings.database.url:
        logger.info("database: PostgreSQL at %s", describe_conninfo(settings.database.url))
        return settings.database.url
    url = await trio.to_thread.run_sync(start_embedded, settings.home)
    logger.info("database: embedded PostgreSQL under %s", settings.home / "pgdata")
    return url


def storage_url(settings: Settings) -> str:
    return settings.storage.url or (settings.home / "blobs").resolve().as_uri()


async def open_storage(settings: Settings) -> AsyncObjectStore:
    url = storage_url(settings)
    store = AsyncObjectStore(open_store(url), trio.CapacityLimiter(8))
    await store.ensure_ready()
    kind = "folder store" if url.startswith("file:") else "S3 store"
    logger.info("storage: %s %s", kind, redact_url(url) if settings.storage.url else url)
    return store


async def open_configured_embedder(settings: Settings) -> Embedder:
    from trioindex.embedding import open_embedder

    e = settings.embedding
    embedder = await open_embedder(
        api=e.api,
        url=e.url,
        model=e.model,
        dimension=e.dimension,
        batch_size=e.batch_size,
        max_in_flight=e.max_in_flight,
        request_timeout=e.request_timeout,
        api_key=e.api_key,
    )
    where = "in-process" if e.api == "local" else f"{e.api} at {redact_url(e.url or '')}"
    logger.info("embedding: %s (%s, %d dimensions)", e.model, where, e.dimension)
    return embedder


async def open_search_embedder(settings: Settings) -> Embedder:
    """The embedder for queries: with the local model, one that borrows the model a worker of
    the same home has loaded (:mod:`trioindex.embedding.warm`) and loads its own only when
    none answers; an embedding server's client otherwise."""
    if settings.embedding.api != "local":
        return await open_configured_embedder(settings)
    from trioindex.embedding import EmbedderInfo
    from trioindex.embedding.warm import open_query_embedder

    e = settings.embedding
    info = EmbedderInfo.configured(e.model, e.dimension, e.batch_size)
    return await open_query_embedder(
        settings.home, info, functools.partial(open_configured_embedder, settings)
    )


@attrs.define(eq=False)
class Services:
    """What :func:`open_services` opened; ``embedder`` is None unless it was asked for."""

    database_url: str = attrs.field(repr=False)  # carries the password
    db: Database
    storage: AsyncObjectStore
    model: EmbeddingModel
    embedder: Embedder | None
    # PostgreSQL itself, for what needs a session (LISTEN, index builds); None behind a
    # transaction pooler when database.direct-url is unset (workers then poll)
    direct_url: str | None = attrs.field(default=None, repr=False)


@asynccontextmanager
async def open_services(settings: Settings, *, embedder: bool = False) -> AsyncIterator[Services]:
    """Open what a command needs; migrate the database and register the configured model."""
    async with AsyncExitStack() as stack:
        url = await resolve_database_url(settings)
        d = settings.database
        direct = session_conninfo(url, pooler=d.pooler != "none", direct=d.direct_url)
        db = await stack.enter_async_context(
            open_database(
                url,
                pool_size=d.pool_size,
                max_idle=d.pool_max_idle,
                pooler=d.pooler != "none",
                direct_conninfo=direct,
            )
        )
        model = await db.run(ensure_model, settings.embedding.model, settings.embedding.dimension)
        store = await open_storage(settings)
        opened: Embedder | None = None
        if embedder:
            opened = await open_configured_embedder(settings)
            stack.push_async_callback(opened.aclose)
        yield Services(url, db, store, model, opened, direct)
