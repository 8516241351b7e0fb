"""The worker-wide group committer (worker/committer.py) over an in-memory database, on Trio's
virtual clock: what it keeps after a write. (Grouping, fencing and the per-job fallback run
against real PostgreSQL in tests/db/test_group_commit.py.)"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import trio
import trio.testing

from trioindex.worker.committer import GroupCommitter


class InMemoryDb:
    """``Database.run`` without a thread or a connection: the group function runs inline."""

    async def run(self, fn: Callable[..., Any], *args: object) -> Any:
        return fn(None, *args)


@attrs.define(eq=False)
class BigWrite:
    """Stands for a large document's chunks or vectors."""

    rows: int


def write_group(_conn: object, items: Sequence[BigWrite]) -> list[int | Exception]:
    return [item.rows for item in items]


async def test_a_committed_write_is_not_kept_while_the_committer_waits_for_the_next(
    autojump_clock: trio.testing.MockClock,
) -> None:
    committer: GroupCommitter[BigWrite, int] = GroupCommitter(
        "test",
        InMemoryDb(),  # type: ignore[arg-type]
        write_group,
    )
    # no cyclic collection during the test: the write must be freed by reference counting
    gc.disable()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(committer.serve)
            write = BigWrite(20_000)
            gone = weakref.ref(write)
            assert await committer.submit(write) == 20_000
            del write
            await trio.sleep(1)  # the committer's loops are idle, waiting for more writes
            assert committer.groups == 1
            assert gone() is None
            nursery.cancel_scope.cancel()
    finally:
        gc.enable()
