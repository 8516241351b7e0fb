"""The claim loop's batch size and its NOTIFY backoff, over in-memory fakes on Trio's virtual
clock (autojump_clock): one worker, or several sharing one fake queue.

Each test name states the behaviour it checks.
"""

from __future__ import annotations

import trio
import trio.testing

from tests.fakes.runtime import FakeQueue, FakeSteps
from tests.worker.test_runtime import NEW, assert_clean, drain, make_worker
from trioindex.worker.runtime import (
    CLAIM_BATCH,
    NOTIFY_BACKOFF_MAX,
    NOTIFY_BACKOFF_MIN,
    Worker,
)


def claims(queue: FakeQueue) -> list[tuple[float, int, int]]:
    """(time, asked, got) of every claim so far."""
    return [(t, k, got) for t, (k, got) in queue.of("claim")]  # type: ignore[misc]


async def notify(worker: Worker, queue: FakeQueue, *, jobs: int) -> float:
    """Enqueue ``jobs`` (0: another worker took them already) and wake ``worker`` as a NOTIFY
    does; return when it has claimed, with how long the claim came after the NOTIFY."""
    before = len(queue.of("claim"))
    queue.pending += [NEW] * jobs
    sent = trio.current_time()
    worker.wake()
    # virtual time: polled in steps far below NOTIFY_BACKOFF_MIN, to time the claim closely
    while True:
        if len(queue.of("claim")) > before:
            break
        await trio.sleep(0.001)
    return queue.of("claim")[before][0] - sent


async def test_a_claim_asks_for_at_most_the_claim_batch_and_a_full_one_claims_again_at_once(
    autojump_clock: trio.abc.Clock,
) -> None:
    queue = FakeQueue(pending=[NEW] * (2 * CLAIM_BATCH + 5))
    worker = make_worker(
        queue, FakeSteps(queue, duration=10), max_concurrency=4 * CLAIM_BATCH, polling_interval=100
    )
    start = trio.current_time()
    await drain(worker)
    asked = [k for _, k, _ in claims(queue)]
    assert max(asked) == CLAIM_BATCH
    # the backlog was claimed in three statements back to back, before any job finished
    assert [got for _, _, got in claims(queue)][:3] == [CLAIM_BATCH, CLAIM_BATCH, 5]
    assert [t for t, _, _ in claims(queue)][:3] == [start] * 3
    assert len(queue.of("complete")) == 2 * CLAIM_BATCH + 5
    assert_clean(worker)


async def test_a_lone_worker_claims_at_once_on_every_notify(
    autojump_clock: trio.abc.Clock,
) -> None:
    queue = FakeQueue()
    worker = make_worker(queue, FakeSteps(queue, duration=0), polling_interval=60)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.serve)
        await trio.sleep(1)
        delays = [await notify(worker, queue, jobs=1) for _ in range(10)]
        assert delays == [0.0] * 10
        assert len(queue.of("complete")) == 10
        worker.request_stop()


async def test_after_notifies_that_found_nothing_the_next_notify_claim_waits_a_bounded_jitter(
    autojump_clock: trio.abc.Clock,
) -> None:
    queue = FakeQueue()
    worker = make_worker(queue, FakeSteps(queue, duration=0), polling_interval=60)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.serve)
        await trio.sleep(1)
        first = await notify(worker, queue, jobs=0)  # taken by another worker: a miss
        misses = [await notify(worker, queue, jobs=0) for _ in range(20)]
        assert first == 0.0
        assert all(0 <= d <= NOTIFY_BACKOFF_MAX for d in misses)
        assert misses[0] <= NOTIFY_BACKOFF_MIN
        assert max(misses) > NOTIFY_BACKOFF_MIN  # the window widened
        # a NOTIFY that finds its job resets the window: the one after claims at once
        await notify(worker, queue, jobs=1)
        assert await notify(worker, queue, jobs=1) == 0.0
        worker.request_stop()


async def test_a_poll_never_waits_for_the_notify_backoff(autojump_clock: trio.abc.Clock) -> None:
    queue = FakeQueue()
    worker = make_worker(queue, FakeSteps(queue, duration=0), polling_interval=5)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.serve)
        for _ in range(5):
            await notify(worker, queue, jobs=0)  # misses widen the window
        seen = len(claims(queue))
        last = claims(queue)[-1][0]
        queue.pending.append(NEW)  # due without a NOTIFY (a retry coming due)
        await trio.sleep(6)
        # claimed on the polling interval's tick after the last claim, with no jitter added
        t, _, got = claims(queue)[seen]
        assert (t - last, got) == (5.0, 1)
        assert len(queue.of("complete")) == 1
        worker.request_stop()


async def test_a_backlog_released_to_a_fleet_at_once_is_shared_not_taken_by_the_first(
    autojump_clock: trio.abc.Clock,
) -> None:
    queue = FakeQueue()
    fleet = [
        make_worker(queue, FakeSteps(queue, duration=5), max_concurrency=256, polling_interval=60)
        for _ in range(8)
    ]
    async with trio.open_nursery() as nursery:
        for worker in fleet:
            await nursery.start(worker.serve)
        queue.pending += [NEW] * (8 * CLAIM_BATCH)
        for worker in fleet:
            worker.wake()  # one NOTIFY reaches every listener
        await trio.sleep(1)
        # every worker got a batch: none is idle while another holds hundreds
        held = sorted(w.running_jobs for w in fleet)
        # the backlog went to many workers, a batch or two each (a worker whose batch came
        # back full claims again at once), not all of it to the first one woken
        assert sum(held) == 8 * CLAIM_BATCH
        assert max(held) <= 2 * CLAIM_BATCH
        assert sum(1 for h in held if h) >= 6
        for worker in fleet:
            worker.request_stop()
