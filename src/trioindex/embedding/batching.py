"""Cutting a call's texts into batches, and running the batches under the in-flight cap.

Batches are contiguous, in order, never empty, at most ``max_batch_size`` texts and, when the
server has a token budget per request, at most ``max_batch_tokens`` estimated tokens (a single text
over the budget still goes, alone: the server decides whether it is too long). Results are put back
in the order of the texts whatever order the batches finish in.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import trio

from trioindex.errors import StepFailure

EmbedBatch = Callable[[Sequence[str]], Awaitable[list[list[float]]]]


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


async def run_batches(
    texts: Sequence[str],
    batches: Sequence[range],
    embed_batch: EmbedBatch,
    limiter: trio.CapacityLimiter,
) -> list[list[float]]:
    """Run ``embed_batch`` on every batch, each holding a ``limiter`` token, results in order.

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
            return await embed_batch(texts[batches[0].start : batches[0].stop])

    results: list[list[list[float]]] = [[] for _ in batches]
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
    return [vector for batch in results for vector in batch]
