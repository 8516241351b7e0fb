"""The worker-wide group committer: the finished steps of many jobs in one transaction.

Each job task hands its write to :meth:`GroupCommitter.submit` and waits for its own result. A
task in the worker's background nursery (:meth:`GroupCommitter.serve`) takes what has gathered
— after a short linger, at most ``max_items`` writes and ``max_weight`` rows — and runs the
group function once, in one thread call, one transaction and one round trip (the functions of
:mod:`trioindex.db.steps`). The group function fences every job on its own and returns one
result per write: a value, or the exception that refused that job alone.

One job's failure never decides another's: if the group call itself fails (a constraint, a
deadlock, a lost connection), every write of the group is retried alone and each gets the
outcome of its own transaction.

Cancellation: a write still waiting in the queue is withdrawn and never made. A write already
taken into a group is in a transaction that is never abandoned; the cancelled caller waits for
it (shielded; bounded by the statement) and is then cancelled, so it never reports a write as
not made when it was.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

import attrs
import trio

from trioindex.db.pool import Connection, Database

logger = logging.getLogger(__name__)

I = TypeVar("I")  # noqa: E741 - the item type, as in the docs
R = TypeVar("R")

GroupWrite = Callable[[Connection, Sequence[I]], list[R | Exception]]

# How long the committer waits for more writes after the first one arrives. Writes that arrive
# while a group is being committed wait for that group anyway, so the linger matters only when
# the worker is lightly loaded.
DEFAULT_LINGER = 0.002


@attrs.define(eq=False)
class _Entry(Generic[I, R]):
    item: I
    weight: int
    done: trio.Event = attrs.field(factory=trio.Event)
    taken: bool = False
    result: R | None = None
    error: BaseException | None = None


@attrs.define(eq=False)
class GroupCommitter(Generic[I, R]):
    """Gathers writes of one kind from many jobs; see the module docstring."""

    name: str
    db: Database
    write_group: GroupWrite[I, R]
    weight: Callable[[I], int] = lambda _item: 1
    max_items: int = 64
    max_weight: int = 4096
    linger: float = DEFAULT_LINGER
    parallel: int = 2
    groups: int = 0  # groups committed (counted for tests and logs)
    _pending: list[_Entry[I, R]] = attrs.field(factory=list)
    _arrived: trio.Event = attrs.field(factory=trio.Event)

    async def submit(self, item: I) -> R:
        """Write ``item`` with the next group; its result, or the exception refusing it."""
        entry: _Entry[I, R] = _Entry(item, max(1, self.weight(item)))
        self._pending.append(entry)
        self._arrived.set()
        try:
            await entry.done.wait()
        finally:
            if not entry.done.is_set():
                if entry.taken:
                    with trio.CancelScope(shield=True):
                        await entry.done.wait()
                else:
                    self._pending.remove(entry)
        if entry.error is not None:
            raise entry.error
        return entry.result  # type: ignore[return-value]

    async def serve(self) -> None:
        """Commit groups until cancelled, at most ``parallel`` groups in flight (the next group
        gathers while one is committing)."""
        try:
            async with trio.open_nursery() as nursery:
                for _ in range(self.parallel):
                    nursery.start_soon(self._loop)
        finally:
            self._stopped(self._pending)
            self._pending.clear()

    async def _loop(self) -> None:
        while True:
            while not self._pending:
                if self._arrived.is_set():
                    self._arrived = trio.Event()
                await self._arrived.wait()
            if len(self._pending) < self.max_items and self.linger > 0:
                await trio.sleep(self.linger)
            group = self._take()
            if not group:
                continue  # the other loop took them
            try:
                await self._commit(group)
            finally:
                # settled unless the fallback was cancelled between two writes
                self._stopped(group)
                # not kept while waiting for the next group: a large document's chunks or
                # vectors must not outlive its write (tests/worker/test_committer.py)
                del group

    def _stopped(self, entries: Sequence[_Entry[I, R]]) -> None:
        for entry in entries:
            if not entry.done.is_set():
                entry.error = RuntimeError(f"the {self.name} committer stopped")
                entry.done.set()

    def _take(self) -> list[_Entry[I, R]]:
        group: list[_Entry[I, R]] = []
        weight = 0
        while self._pending and len(group) < self.max_items:
            entry = self._pending[0]
            if group and weight + entry.weight > self.max_weight:
                break
            self._pending.pop(0)
            entry.taken = True
            group.append(entry)
            weight += entry.weight
        return group

    async def _commit(self, group: list[_Entry[I, R]]) -> None:
        items = [entry.item for entry in group]
        try:
            results = await self.db.run(self.write_group, items)
        except Exception as exc:
            if len(group) == 1:
                self._settle(group[0], exc)
                return
            logger.info(
                "%s group of %d failed (%s); writing each job alone",
                self.name,
                len(group),
                type(exc).__name__,
            )
            for entry in group:
                await self._commit([entry])
            return
        self.groups += 1
        for entry, result in zip(group, results, strict=True):
            self._settle(entry, result)

    @staticmethod
    def _settle(entry: _Entry[I, R], result: R | BaseException) -> None:
        if isinstance(result, BaseException):
            entry.error = result
        else:
            entry.result = result
        entry.done.set()
