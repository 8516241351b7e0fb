"""The Trio side of storage: the only place storage calls go through ``trio.to_thread``, and
:func:`open_store`, which turns a ``storage.url`` into a store.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO, TypeVar, Unpack

import attrs
import trio

from trioindex.errors import ConfigError
from trioindex.storage.contract import ObjectInfo, ObjectStore, PutOptions
from trioindex.storage.folder import FolderStore
from trioindex.storage.urls import FolderLocation, StorageUrlError, parse_storage_url, redact_url

T = TypeVar("T")
Item = TypeVar("Item")


def open_store(url: str) -> ObjectStore:
    """A store for a ``storage.url`` (grammar: :mod:`trioindex.storage.urls`).

    ``ConfigError`` naming the key and the broken rule, with the URL redacted, if it is bad. A
    relative ``file://.trioindex/blobs`` is resolved against the working directory now.
    """

    def bad(reason: str) -> ConfigError:
        return ConfigError(f"storage.url: {reason} (got {redact_url(url)!r})")

    try:
        location = parse_storage_url(url)
    except StorageUrlError as exc:
        raise bad(str(exc)) from None
    if isinstance(location, FolderLocation):
        return FolderStore(Path(os.path.normpath(Path.cwd() / location.root)))
    from trioindex.storage.s3 import S3Store  # minio: imported only when S3 is configured

    try:
        return S3Store(
            endpoint=location.endpoint,
            bucket=location.bucket,
            access_key=location.access_key,
            secret_key=location.secret_key,
            secure=location.secure,
            region=location.region,
        )
    except ValueError:
        # minio validates the endpoint; its message is not needed to fix the URL.
        raise bad("invalid S3 endpoint") from None


@attrs.define(eq=False)
class AsyncObjectStore:
    """Runs an :class:`ObjectStore` in worker threads, bounded by ``limiter``.

    Cancellation handling: calls use ``trio.to_thread.run_sync`` with the default
    ``abandon_on_cancel=False``, so a cancelled caller waits for the blocking call to end
    (bounded by the store's own connect/read timeouts) and no thread outlives its caller.
    """

    store: ObjectStore
    limiter: trio.CapacityLimiter = attrs.field(repr=False)

    @property
    def description(self) -> str:
        return self.store.description

    async def put(
        self, key: str, data: bytes | BinaryIO, **options: Unpack[PutOptions]
    ) -> ObjectInfo:
        call = functools.partial(self.store.put, key, data, **options)
        return await trio.to_thread.run_sync(call, limiter=self.limiter)

    async def get(self, key: str, *, max_bytes: int) -> bytes:
        call = functools.partial(self.store.get, key, max_bytes=max_bytes)
        return await trio.to_thread.run_sync(call, limiter=self.limiter)

    async def digest(self, key: str, *, max_bytes: int) -> ObjectInfo:
        call = functools.partial(self.store.digest, key, max_bytes=max_bytes)
        return await trio.to_thread.run_sync(call, limiter=self.limiter)

    async def stat(self, key: str) -> ObjectInfo:
        return await trio.to_thread.run_sync(self.store.stat, key, limiter=self.limiter)

    async def delete(self, key: str) -> None:
        await trio.to_thread.run_sync(self.store.delete, key, limiter=self.limiter)

    async def run(self, work: Callable[[ObjectStore], T]) -> T:
        """``work(store)`` in one worker thread: several blocking calls for one hop, as ingest
        does for a slice of files (a hop costs more CPU than a small file's upload)."""
        return await trio.to_thread.run_sync(work, self.store, limiter=self.limiter)

    async def run_slices(
        self,
        items: Sequence[Item],
        work: Callable[[Sequence[Item], ObjectStore], T],
        *,
        slices: int,
    ) -> list[T]:
        """``work(slice, store)`` for ``items`` cut into at most ``slices`` slices, each in a
        worker thread of its own (:meth:`run`), all at once; their results in slice order. The
        first error cancels the other slices and is raised as itself (not in an exception
        group)."""
        size = max(1, -(-len(items) // slices))
        parts = [items[start : start + size] for start in range(0, len(items), size)]
        results: list[T] = []
        done: dict[int, T] = {}
        errors: list[Exception] = []

        async def one(n: int) -> None:
            try:
                done[n] = await self.run(functools.partial(work, parts[n]))
            except Exception as exc:
                errors.append(exc)
                nursery.cancel_scope.cancel()

        async with trio.open_nursery() as nursery:
            for n in range(len(parts)):
                nursery.start_soon(one, n)
        if errors:
            raise errors[0]
        results.extend(done[n] for n in range(len(parts)))
        return results

    async def ensure_ready(self) -> None:
        await trio.to_thread.run_sync(self.store.ensure_ready, limiter=self.limiter)
