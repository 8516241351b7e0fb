"""Small objects read for many tasks in a few worker-thread hops instead of one hop each.

A worker claims tens of jobs at once and each starts by reading its document. A
``trio.to_thread`` hop costs more CPU than reading a small file from a folder store (the
profile of a 2,000-document run: 8 % of the worker's samples were the hops of these reads), so
:class:`GroupedReads` gathers the reads asked for in the same few scheduler rounds and reads
them together: the first caller leads, lets the other tasks that are ready run (and ask for
their reads), then reads every gathered key in ``slices`` threads at most, and hands each
caller its own bytes or its own error. One missing or oversized object fails its caller
alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import trio

from trioindex.errors import StorageUnavailable
from trioindex.storage.contract import ObjectStore
from trioindex.storage.facade import AsyncObjectStore
from trioindex.storage.folder import FolderStore

# Scheduler rounds the leader lets pass while new reads keep arriving: jobs started together
# reach their read a round or two apart.
GATHER_ROUNDS = 4


@attrs.define(eq=False)
class _Read:
    key: str
    max_bytes: int
    done: trio.Event = attrs.field(factory=trio.Event)
    data: bytes | None = attrs.field(default=None, repr=False)
    error: Exception | None = None


def _read_all(reads: Sequence[_Read], store: ObjectStore) -> None:
    """Each read's bytes or its own error (in a worker thread)."""
    for read in reads:
        try:
            read.data = store.get(read.key, max_bytes=read.max_bytes)
        except Exception as exc:  # the caller's own failure, raised in its task
            read.error = exc


@attrs.define(eq=False)
class GroupedReads:
    """:meth:`get` as :meth:`AsyncObjectStore.get`, many callers' reads per thread hop.

    ``slices``: at most this many threads read one gathered group at once (a local folder
    store reads a small file in microseconds: one; a network store keeps its requests in
    flight side by side). Cancellation: a waiting caller that is cancelled leaves (its read
    may still happen, and is dropped); the leader's read is shielded, as every storage call
    runs to its end (bounded by the store's own timeouts), so no caller is left waiting.
    """

    store: AsyncObjectStore
    slices: int = 1
    _pending: list[_Read] = attrs.field(init=False, factory=list)
    _gathering: bool = attrs.field(init=False, default=False)
    hops: int = attrs.field(init=False, default=0)  # groups read (tests, profiles)

    @classmethod
    def over(cls, store: AsyncObjectStore) -> GroupedReads:
        """Reads grouped for ``store``: one thread per group for a folder store, else as many
        as the store's limiter allows."""
        local = isinstance(store.store, FolderStore)
        return cls(store, 1 if local else int(store.limiter.total_tokens))

    async def get(self, key: str, *, max_bytes: int) -> bytes:
        """The object's bytes (at most ``max_bytes``), or the store's error for this key."""
        read = _Read(key, max_bytes)
        self._pending.append(read)
        if self._gathering:
            await read.done.wait()
        else:
            await self._lead()
        if read.error is not None:
            raise read.error
        assert read.data is not None
        return read.data

    async def _lead(self) -> None:
        self._gathering = True
        try:
            seen = 0
            for _ in range(GATHER_ROUNDS):
                if len(self._pending) == seen:
                    break
                seen = len(self._pending)
                # never raises Cancelled: the gathered reads are read whatever happens to us
                await trio.lowlevel.cancel_shielded_checkpoint()
        finally:
            group, self._pending = self._pending, []
            self._gathering = False
        try:
            with trio.CancelScope(shield=True):
                self.hops += 1
                await self.store.run_slices(group, _read_all, slices=self.slices)
        finally:
            for read in group:
                if read.data is None and read.error is None:  # the hop itself ended early
                    read.error = StorageUnavailable("the storage read did not run")
                read.done.set()
