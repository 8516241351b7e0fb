"""How many bytes of large documents one worker holds at once.

A job's memory grows with its document: the bytes, the extracted text, the chunks and one
vector per chunk (a 20 MB text file is about 20,000 chunks, 80 MB of 1024-dimension vectors).
Dozens of small documents can be in flight; large ones must not add up. A job whose document is
larger than ``LARGE_DOCUMENT_BYTES`` reserves its size from the worker's budget before its bytes
are read and keeps it until the job ends, so the large documents in flight sum to at most the
budget — several mid-sized ones at once, a 20 MB one alone. A document larger than the whole
budget is admitted alone (it reserves all of it), never refused.

Waiters are admitted in arrival order, so a large document is not overtaken forever by smaller
ones that would fit beside the current holders.
"""

from __future__ import annotations

import collections
from uuid import UUID

import attrs
import trio

# Documents up to this size are not counted (a worker holds many of them cheaply).
LARGE_DOCUMENT_BYTES = 1024 * 1024
# The default budget: one 20 MB document at a time (a worker peaked at about 560 MiB with it,
# docs/test-results/memory.md), or several smaller ones.
DEFAULT_BUDGET_BYTES = 20 * 1024 * 1024


@attrs.define(eq=False)
class DocumentBudget:
    """A byte budget shared by the large documents of one worker's jobs."""

    total: int = DEFAULT_BUDGET_BYTES
    _held: dict[UUID, int] = attrs.field(factory=dict)
    _queue: collections.deque[UUID] = attrs.field(factory=collections.deque)
    _changed: trio.Event = attrs.field(factory=trio.Event)

    @property
    def in_use(self) -> int:
        return sum(self._held.values())

    def holds(self, job_id: UUID) -> bool:
        return job_id in self._held

    async def reserve(self, job_id: UUID, size: int) -> None:
        """Wait until ``size`` bytes (at most the whole budget) fit, then hold them for
        ``job_id``. A document under ``LARGE_DOCUMENT_BYTES``, or a job that already holds its
        share, returns at once."""
        if size <= LARGE_DOCUMENT_BYTES or job_id in self._held:
            return
        share = min(size, self.total)
        self._queue.append(job_id)
        try:
            while self._queue[0] != job_id or self.in_use + share > self.total:
                changed = self._changed
                await changed.wait()
        finally:
            self._queue.remove(job_id)
            self._wake()
        self._held[job_id] = share

    def release(self, job_id: UUID) -> None:
        """Give back what ``job_id`` holds (nothing if it holds nothing)."""
        if self._held.pop(job_id, None) is not None:
            self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()
