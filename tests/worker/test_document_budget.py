"""The worker's byte budget for large documents (worker/document_budget.py), on Trio's virtual
clock: which jobs hold their document at the same time, in which order they are admitted, and
what a cancelled wait leaves behind."""

from __future__ import annotations

import uuid

import trio
import trio.testing

from trioindex.worker.document_budget import (
    LARGE_DOCUMENT_BYTES,
    DocumentBudget,
    return_freed_memory,
)

MIB = 1024 * 1024


async def _hold(
    budget: DocumentBudget, size: int, seconds: float, log: list[tuple[str, float]], name: str
) -> None:
    job = uuid.uuid4()
    await budget.reserve(job, size)
    log.append((f"{name} in", trio.current_time()))
    await trio.sleep(seconds)
    log.append((f"{name} out", trio.current_time()))
    budget.release(job)


async def test_documents_that_fit_together_are_held_at_once(autojump_clock: object) -> None:
    budget = DocumentBudget(total=20 * MIB)
    log: list[tuple[str, float]] = []
    async with trio.open_nursery() as nursery:
        for name in "ab":
            nursery.start_soon(_hold, budget, 8 * MIB, 1.0, log, name)
    assert [t for _, t in log if _.endswith(" in")] == [0.0, 0.0]
    assert budget.in_use == 0


async def test_a_document_that_does_not_fit_waits_for_the_holder(autojump_clock: object) -> None:
    # two 19 MB documents never overlap: their sum is over the budget
    budget = DocumentBudget(total=20 * MIB)
    log: list[tuple[str, float]] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_hold, budget, 19 * MIB, 1.0, log, "a")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(_hold, budget, 19 * MIB, 1.0, log, "b")
    assert log == [("a in", 0.0), ("a out", 1.0), ("b in", 1.0), ("b out", 2.0)]


async def test_a_document_over_the_whole_budget_is_admitted_alone(autojump_clock: object) -> None:
    budget = DocumentBudget(total=20 * MIB)
    log: list[tuple[str, float]] = []
    with trio.fail_after(10):  # a document never admitted would wait forever
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_hold, budget, 5 * MIB, 1.0, log, "small")
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(_hold, budget, 50 * MIB, 1.0, log, "huge")
    assert log == [("small in", 0.0), ("small out", 1.0), ("huge in", 1.0), ("huge out", 2.0)]


async def test_waiters_are_admitted_in_arrival_order(autojump_clock: object) -> None:
    # "big" waits for "first"; "late" would fit beside "first" but must not overtake "big"
    budget = DocumentBudget(total=20 * MIB)
    log: list[tuple[str, float]] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_hold, budget, 12 * MIB, 1.0, log, "first")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(_hold, budget, 15 * MIB, 1.0, log, "big")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(_hold, budget, 4 * MIB, 1.0, log, "late")
    entered = [name for name, _ in log if name.endswith(" in")]
    assert entered == ["first in", "big in", "late in"]
    assert dict(log)["big in"] == 1.0


async def test_small_documents_and_a_repeated_reserve_take_nothing(autojump_clock: object) -> None:
    budget = DocumentBudget(total=20 * MIB)
    job = uuid.uuid4()
    await budget.reserve(uuid.uuid4(), LARGE_DOCUMENT_BYTES)
    assert budget.in_use == 0
    await budget.reserve(job, 10 * MIB)
    await budget.reserve(job, 10 * MIB)  # a retried step of the same job
    assert budget.in_use == 10 * MIB
    budget.release(job)
    budget.release(job)
    assert budget.in_use == 0


async def test_a_cancelled_wait_leaves_no_reservation_and_lets_the_next_in(
    autojump_clock: object,
) -> None:
    budget = DocumentBudget(total=20 * MIB)
    holder, cancelled, next_job = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    await budget.reserve(holder, 15 * MIB)
    with trio.move_on_after(1.0):
        await budget.reserve(cancelled, 15 * MIB)
    assert not budget.holds(cancelled)
    # the cancelled waiter was first in line; the next one must not wait behind it
    with trio.fail_after(1.0):
        await budget.reserve(next_job, 5 * MIB)
    assert budget.in_use == 20 * MIB


async def test_freed_memory_is_returned_after_a_large_document_s_phases_and_at_its_end(
    autojump_clock: object,
) -> None:
    returned: list[float] = []
    budget = DocumentBudget(
        total=20 * MIB, return_memory=lambda: returned.append(trio.current_time())
    )
    large, small = uuid.uuid4(), uuid.uuid4()
    await budget.reserve(large, 8 * MIB)
    await budget.reserve(small, LARGE_DOCUMENT_BYTES)
    await trio.sleep(1)
    budget.phase_done(large)
    budget.phase_done(small)  # a small document holds no share: nothing to give back
    await trio.sleep(1)
    budget.release(small)
    budget.release(large)
    budget.release(uuid.uuid4())  # a job that held nothing
    budget.phase_done(large)  # after its end
    assert returned == [1.0, 2.0]


def test_returning_freed_memory_works_on_this_c_library() -> None:
    # the worker's image and CI run glibc, where malloc_trim exists
    assert return_freed_memory() is True
