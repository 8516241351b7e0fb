"""Cutting a call's texts into batches, and running the batches under the in-flight cap.

Batches are contiguous, in order, never empty, at most ``max_batch_size`` texts and, when the
server has a token budget per request, at most ``max_batch_tokens`` estimated tokens (a single text
over the budget still goes, alone: the server decides whether it is too long). Results are put back
in the order of the texts whatever order the batches finish in. A batch the server refuses as too
long is sent again in smaller requests, a text refused alone in pieces
(:mod:`trioindex.embedding.fitting`).

:class:`EmbeddingCoalescer` is the worker-wide side: it gathers the texts of many jobs into
full requests (by count and tokens, a short linger, the in-flight cap) and hands each job
exactly its vectors.
"""

from __future__ import annotations

import collections
import functools
import logging
import math
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import TYPE_CHECKING

import attrs
import numpy as np
import numpy.typing as npt
import trio

from trioindex.embedding.fitting import EmbedBatch, LimitFitter
from trioindex.embedding.vectors import Vectors
from trioindex.errors import ResultInvalid, StepFailure

if TYPE_CHECKING:
    from trioindex.embedding.base import EmbedderInfo

logger = logging.getLogger(__name__)


def estimate_tokens(text: str) -> int:
    """A cautious token estimate for HTTP servers whose tokenizer we do not have.

    UTF-8 bytes / 3 is ~len/3 for Latin text (English runs ~4 characters per token, so this
    over-counts, which only makes batches smaller) and one token per character for Hangul and CJK,
    where character counts would badly under-count. +2 for the special tokens.
    """
    return len(text.encode("utf-8")) // 3 + 2


def plan_batches(
    texts: Sequence[str],
    *,
    max_batch_size: int,
    max_batch_tokens: int | None = None,
    estimate: Callable[[str], int] = estimate_tokens,
) -> list[range]:
    """Index ranges of ``texts``, greedily filled by count and (if given) estimated tokens."""
    if max_batch_size < 1:
        raise ValueError("max_batch_size must be >= 1")
    batches: list[range] = []
    start = 0
    tokens = 0
    for index, text in enumerate(texts):
        cost = estimate(text) if max_batch_tokens is not None else 0
        full = index - start >= max_batch_size or (
            max_batch_tokens is not None and index > start and tokens + cost > max_batch_tokens
        )
        if full:
            batches.append(range(start, index))
            start = index
            tokens = 0
        tokens += cost
    if start < len(texts):
        batches.append(range(start, len(texts)))
    return batches


async def embed_in_batches(
    texts: Sequence[str],
    info: EmbedderInfo,
    embed_batch: EmbedBatch,
    limiter: trio.CapacityLimiter,
) -> Vectors:
    """A provider's ``Embedder.embed``: batches planned by ``info``'s limits, run under
    ``limiter``, one vector per text in order; a batch refused as too long is fitted
    (:mod:`trioindex.embedding.fitting`)."""
    if not texts:
        return Vectors.empty(info.dimension or 0)
    plan = functools.partial(
        plan_batches, max_batch_size=info.max_batch_size, max_batch_tokens=info.max_batch_tokens
    )
    fitter = LimitFitter(embed_batch, plan, info.max_input_tokens)
    parts = await run_batches(texts, plan(texts), fitter.embed, limiter)
    vectors = Vectors.joined(parts)
    if fitter.cut:
        limit = f" ({fitter.limit} tokens)" if fitter.limit else ""
        logger.warning(
            "%d of %d texts were longer than the embedding server's input limit%s: each was "
            "embedded in pieces and given the mean of their vectors",
            fitter.cut,
            len(texts),
            limit,
        )
    return vectors


async def run_batches(
    texts: Sequence[str],
    batches: Sequence[range],
    embed_batch: EmbedBatch,
    limiter: trio.CapacityLimiter,
) -> list[Vectors]:
    """Run ``embed_batch`` on every batch, each holding a ``limiter`` token: each batch's
    vectors, in the order of ``batches``.

    At most ``limiter.total_tokens`` tasks per call pull batches in order, so one call with
    thousands of chunks queues a few batches on the shared limiter, not all of them, and
    concurrent calls take turns. The first :class:`StepFailure` cancels the other batches and is
    raised alone; nothing partial is returned.

    Cancellation handling: cancelling the caller cancels every batch in flight.
    """
    if not batches:
        return []
    if len(batches) == 1:
        async with limiter:
            return [await embed_batch(texts[batches[0].start : batches[0].stop])]

    results: list[Vectors | None] = [None for _ in batches]
    pending = iter(enumerate(batches))
    failure: StepFailure | None = None

    async def pull(cancel_scope: trio.CancelScope) -> None:
        nonlocal failure
        # Sharing one iterator is safe: tasks only switch at awaits, never inside next().
        for index, span in pending:
            try:
                async with limiter:
                    results[index] = await embed_batch(texts[span.start : span.stop])
            except StepFailure as exc:
                if failure is None:
                    failure = exc
                cancel_scope.cancel()
                return

    workers = int(min(limiter.total_tokens, len(batches)))
    async with trio.open_nursery() as nursery:
        for _ in range(workers):
            nursery.start_soon(pull, nursery.cancel_scope)
    if failure is not None:
        raise failure
    return [vectors for vectors in results if vectors is not None]


# ---------------------------------------------------------------------------------------------
# the worker-wide coalescer

EmbedOne = Callable[[Sequence[str]], Awaitable[Vectors]]

# How long a request that is not full waits for more texts once a request slot is free.
DEFAULT_LINGER = 0.005
# ... and while callers are expected (EmbeddingCoalescer.expect): jobs claimed together reach
# their embed step a few milliseconds apart, and a request that waits for them carries their
# texts in one request instead of several.
DEFAULT_BACKLOG_LINGER = 0.025


@attrs.define(eq=False)
class _Request:
    """One caller's texts: which spans are still to send, and the rows received so far."""

    texts: Sequence[str] = attrs.field(repr=False)
    dimension: int
    matrix: npt.NDArray[np.float32] = attrs.field(repr=False)
    # the caller's list, handed over: a text is dropped (set to "") once its vector arrived
    released: list[str] | None = attrs.field(repr=False)
    todo: collections.deque[tuple[int, int]]
    remaining: int
    arrived: float
    # told how many of this caller's vectors arrived, each time some do (progress lines)
    on_arrived: Callable[[int], None] | None = None
    done: trio.Event = attrs.field(factory=trio.Event)
    error: BaseException | None = None
    # after a shared request failed, this caller's texts go alone, so its fate is its own
    isolated: bool = False
    withdrawn: bool = False

    @property
    def finished(self) -> bool:
        return self.done.is_set() or self.withdrawn


Piece = tuple[_Request, int, int]


@attrs.define(eq=False)
class EmbeddingCoalescer:
    """Gathers the texts of many jobs into full embedding requests; hands each job exactly its
    vectors.

    A job calls :meth:`embed` with its texts and waits. :meth:`serve` (a task in the worker's
    background nursery) first takes one of ``max_in_flight`` request slots — while every slot
    is busy, texts keep gathering, so requests fill up under load — then waits until a full
    request's worth is pending (``max_batch_size`` texts, and at most ``max_batch_tokens``
    estimated tokens when the server has a budget) or until the oldest pending text has waited
    ``linger``, and sends one request of texts taken from the callers in turn (a caller with
    more texts left goes to the back of the line, so a long document does not hold up short
    ones). Each answer (:class:`~trioindex.embedding.vectors.Vectors`, checked by the
    embedder that made it) is checked for its count and dimension and its float32 rows are
    copied straight into each caller's matrix.
    While callers are :meth:`expect`-ed (jobs in flight that will call :meth:`embed` soon), a
    request that is not full waits up to ``backlog_linger`` instead of ``linger``: a backlog
    fills requests, and a lone caller, expecting no one, waits only ``linger``.

    A failed request shared by several callers does not decide for them: each caller's texts
    are sent again alone, and only a request of one caller's texts fails that caller (with the
    provider's :class:`~trioindex.errors.StepFailure`). A cancelled caller's texts that are
    not sent yet are withdrawn.
    """

    embed_one: EmbedOne
    max_batch_size: int
    max_in_flight: int
    max_batch_tokens: int | None = None
    linger: float = DEFAULT_LINGER
    backlog_linger: float = DEFAULT_BACKLOG_LINGER
    estimate: Callable[[str], int] = estimate_tokens
    requests: int = 0  # requests sent (tests, logs)
    _queue: collections.deque[_Request] = attrs.field(factory=collections.deque)
    _queued: int = 0
    _changed: trio.Event = attrs.field(factory=trio.Event)
    _expected: set[Hashable] = attrs.field(factory=set)

    @property
    def expecting(self) -> int:
        """How many callers are expected (tests, logs)."""
        return len(self._expected)

    def expect(self, key: Hashable) -> None:
        """A caller will soon call :meth:`embed` with ``key`` (or :meth:`settle` it)."""
        self._expected.add(key)

    def settle(self, key: Hashable) -> None:
        """``key`` is no longer expected (its caller embeds now, or ended without embedding)."""
        if key in self._expected:
            self._expected.discard(key)
            self._changed.set()  # a request waiting for it need not wait any longer

    async def embed(
        self,
        texts: Sequence[str],
        dimension: int,
        *,
        release: bool = False,
        on_arrived: Callable[[int], None] | None = None,
        key: Hashable | None = None,
    ) -> npt.NDArray[np.float32]:
        """One float32 row per text, in order; raises the :class:`StepFailure` of a request
        that held this caller's texts alone.

        ``release``: ``texts`` is a list the caller hands over (and keeps no other reference
        to its strings): each entry is replaced by ``""`` as soon as its vector has arrived,
        so a long document's text is freed while it is embedded rather than after.
        ``on_arrived`` is called with the number of vectors each time some of this caller's
        arrive. ``key``: what :meth:`expect` was told, no longer expected from now on."""
        if key is not None:
            self.settle(key)
        released: list[str] | None = None
        if release:
            if not isinstance(texts, list):
                raise TypeError("release=True needs the texts as a list")
            released = texts
        request = _Request(
            texts=texts,
            dimension=dimension,
            matrix=np.empty((len(texts), dimension), dtype=np.float32),
            released=released,
            todo=collections.deque([(0, len(texts))] if texts else []),
            remaining=len(texts),
            arrived=trio.current_time(),
            on_arrived=on_arrived,
        )
        if not texts:
            return request.matrix
        self._queue.append(request)
        self._queued += len(texts)
        self._changed.set()
        try:
            await request.done.wait()
        finally:
            if not request.done.is_set():
                request.withdrawn = True
                self._withdraw(request)
        if request.error is not None:
            raise request.error
        return request.matrix

    async def serve(self) -> None:
        """Send requests until cancelled (cancelling it cancels the requests in flight)."""
        slots = trio.CapacityLimiter(self.max_in_flight)
        async with trio.open_nursery() as nursery:
            while True:
                slot = object()
                await slots.acquire_on_behalf_of(slot)
                try:
                    await self._wait_for_batch()
                    pieces = self._take()
                except BaseException:
                    slots.release_on_behalf_of(slot)
                    raise
                nursery.start_soon(self._send, pieces, slots, slot)
                # not kept while waiting for the next slot: the pieces hold their callers'
                # requests, and a finished request holds its caller's whole matrix
                del pieces

    async def _wait_for_batch(self) -> None:
        while True:
            while not self._queue:
                await self._wait_changed(None)
            if self._queued >= self.max_batch_size:
                return
            linger = self.backlog_linger if self._expected else self.linger
            deadline = min(r.arrived for r in self._queue) + linger
            if trio.current_time() >= deadline:
                return
            await self._wait_changed(deadline)

    async def _wait_changed(self, deadline: float | None) -> None:
        self._changed = trio.Event()
        with trio.move_on_at(math.inf if deadline is None else deadline):
            await self._changed.wait()

    def _take(self) -> list[Piece]:
        """Texts for one request, taken from the callers in turn."""
        pieces: list[Piece] = []
        count = tokens = 0
        while self._queue and count < self.max_batch_size:
            request = self._queue[0]
            if request.isolated and pieces:
                break  # an isolated caller's texts go alone
            start, stop = request.todo.popleft()
            end = start
            while end < stop and count < self.max_batch_size:
                cost = self.estimate(request.texts[end]) if self.max_batch_tokens else 0
                if self.max_batch_tokens and count and tokens + cost > self.max_batch_tokens:
                    break
                tokens += cost
                count += 1
                end += 1
            if end > start:
                pieces.append((request, start, end))
                self._queued -= end - start
            if end < stop:
                request.todo.appendleft((end, stop))
            self._queue.popleft()
            if request.todo:
                self._queue.append(request)  # more to send: to the back of the line
            if request.isolated or end < stop:
                break  # the request is full (by count or tokens), or isolated
        return pieces

    async def _send(self, pieces: list[Piece], slots: trio.CapacityLimiter, slot: object) -> None:
        try:
            live = [p for p in pieces if not p[0].finished]
            if not live:
                return
            texts = [r.texts[i] for r, start, stop in live for i in range(start, stop)]
            self.requests += 1
            try:
                answer = await self.embed_one(texts)
                if len(answer) != len(texts):
                    raise ResultInvalid(
                        f"embedding response has {len(answer)} vectors for {len(texts)} inputs"
                    )
                # checked when it was made (Vectors): finite, and each row has a direction
                matrix = answer.matrix()
                del answer
            except Exception as exc:
                self._failed(live, exc)
                return
            row = 0
            for request, start, stop in live:
                rows = matrix[row : row + stop - start]
                row += stop - start
                if request.finished:
                    continue
                if rows.shape[1] != request.dimension:
                    request.error = ResultInvalid(
                        f"embedding has dimension {rows.shape[1]}, expected {request.dimension}"
                    )
                    self._finish(request)
                    continue
                request.matrix[start:stop] = rows
                if request.released is not None:
                    request.released[start:stop] = [""] * (stop - start)
                request.remaining -= stop - start
                if request.on_arrived is not None:
                    request.on_arrived(stop - start)
                if request.remaining == 0:
                    self._finish(request)
        finally:
            slots.release_on_behalf_of(slot)

    def _failed(self, pieces: list[Piece], error: Exception) -> None:
        callers = {id(p[0]): p[0] for p in pieces}
        if len(callers) == 1:
            request = pieces[0][0]
            request.error = error
            self._finish(request)
            return
        # shared: send each caller's texts again, alone, ahead of everything else
        for request, start, stop in reversed(pieces):
            request.isolated = True
            request.todo.appendleft((start, stop))
            self._queued += stop - start
            if request in self._queue:
                self._queue.remove(request)
            self._queue.appendleft(request)
        self._changed.set()

    def _finish(self, request: _Request) -> None:
        request.done.set()
        self._withdraw(request)

    def _withdraw(self, request: _Request) -> None:
        """Drop whatever of ``request`` is not sent yet."""
        self._queued -= sum(stop - start for start, stop in request.todo)
        request.todo.clear()
        if request in self._queue:
            self._queue.remove(request)
