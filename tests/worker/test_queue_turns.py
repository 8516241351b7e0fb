"""Which of a worker's statements take turns in :class:`JobQueue` (its upkeep lock), over a
database whose calls wait at a gate: what reached the database, and when."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import trio
import trio.testing

from trioindex.values import BackoffPolicy
from trioindex.worker.queue import JobQueue


class GatedDatabase:
    """Every call waits for ``gate``; ``reached`` lists the functions that got this far."""

    def __init__(self) -> None:
        self.gate = trio.Event()
        self.reached: list[str] = []

    async def run(self, fn: Callable[..., Any], *args: object, **kwargs: object) -> Any:
        self.reached.append(fn.__name__)
        await self.gate.wait()
        return True if fn.__name__ == "heartbeat" else []


def gated_queue() -> tuple[JobQueue, GatedDatabase]:
    db = GatedDatabase()
    backoff = BackoffPolicy(initial=1.0, maximum=2.0, jitter=0.0)
    return JobQueue(db, lease_seconds=30, backoff=backoff), db  # type: ignore[arg-type]


async def test_a_claim_made_while_another_is_in_flight_does_not_wait_for_its_turn(
    autojump_clock: trio.abc.Clock,
) -> None:
    queue, db = gated_queue()
    worker = uuid.uuid4()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(queue.claim, worker, 4)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(queue.heartbeat, worker)
        nursery.start_soon(queue.claim, worker, 2)
        await trio.testing.wait_all_tasks_blocked()
        # the second claim is at the database beside the first; the heartbeat waits its turn
        assert db.reached == ["claim_jobs", "claim_jobs"]
        db.gate.set()
    assert db.reached == ["claim_jobs", "claim_jobs", "heartbeat"]


async def test_upkeep_statements_take_turns_with_a_claim(autojump_clock: trio.abc.Clock) -> None:
    queue, db = gated_queue()
    worker = uuid.uuid4()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(queue.heartbeat, worker)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(queue.claim, worker, 4)
        nursery.start_soon(queue.recover)
        await trio.testing.wait_all_tasks_blocked()
        assert db.reached == ["heartbeat"]  # one at a time: an idle worker's one connection
        db.gate.set()
    assert sorted(db.reached) == ["claim_jobs", "heartbeat", "recover_expired"]
