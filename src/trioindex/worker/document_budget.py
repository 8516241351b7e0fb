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

Between the phases of a large document (:meth:`DocumentBudget.phase_done`) and when its share
comes back, the worker hands the memory it freed back to the operating system
(:func:`return_freed_memory`). glibc keeps freed heap memory for reuse, but only by the thread
arena it came from: the parse result is received on the event loop thread, the chunk set's
statement parameters are built in a database thread, the vectors arrive on the event loop
thread again, so without this each phase's freed memory stayed resident under the next one's
(docs/test-results/memory.md).
"""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import functools
from collections.abc import Callable
from uuid import UUID

import attrs
import trio

# Documents up to this size are not counted (a worker holds many of them cheaply).
LARGE_DOCUMENT_BYTES = 1024 * 1024
# The default budget: one 20 MB document at a time (three of them in a row took a worker to
# about 340-350 MiB, docs/test-results/memory.md), or several smaller ones.
DEFAULT_BUDGET_BYTES = 20 * 1024 * 1024


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        trim: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError, TypeError):
        return None  # not glibc (musl, macOS): nothing to call
    return trim


def return_freed_memory() -> bool:
    """Give the heap memory the process has freed back to the operating system (glibc's
    ``malloc_trim``, every arena); False where the C library has no such call."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


@attrs.define(eq=False)
class DocumentBudget:
    """A byte budget shared by the large documents of one worker's jobs."""

    total: int = DEFAULT_BUDGET_BYTES
    # called when a large document's phase ended or its share came back
    return_memory: Callable[[], object] = return_freed_memory
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
            self.return_memory()

    def phase_done(self, job_id: UUID) -> None:
        """``job_id``'s step has dropped a large intermediate form of its document (the parse
        result's buffers, a statement's parameters): if it holds a large share, give the freed
        memory back before the next phase allocates its own, maybe in another thread."""
        if job_id in self._held:
            self.return_memory()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()
