"""Small objects read for many tasks in one thread hop (storage/grouped_reads.py), on a real
folder store: every caller gets its own bytes or its own error, a cancelled caller does not
strand the others."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import pytest
import trio

from trioindex.errors import ContentInvalid, ObjectNotFound
from trioindex.storage import AsyncObjectStore, FolderStore
from trioindex.storage.grouped_reads import GroupedReads


def folder(tmp_path: Path, count: int) -> tuple[AsyncObjectStore, list[str]]:
    store = FolderStore(tmp_path / "blobs")
    store.ensure_ready()
    keys = []
    for i in range(count):
        data = f"document {i}".encode() * (i + 1)
        key = f"k/{i}"
        store.put(
            key, data, size=len(data), sha256=hashlib.sha256(data).hexdigest(), content_type=None
        )
        keys.append(key)
    return AsyncObjectStore(store, trio.CapacityLimiter(8)), keys


def expected(i: int) -> bytes:
    return f"document {i}".encode() * (i + 1)


async def read_all(
    reads: GroupedReads, keys: list[str], max_bytes: int = 1 << 20
) -> list[bytes | Exception]:
    """Every key read by a task of its own, all started together (as a claim starts its jobs)."""
    results: list[bytes | Exception] = [b""] * len(keys)

    async def one(n: int) -> None:
        try:
            results[n] = await reads.get(keys[n], max_bytes=max_bytes)
        except Exception as exc:
            results[n] = exc

    with trio.fail_after(10):  # a caller never woken fails here, not by hanging
        async with trio.open_nursery() as nursery:
            for n in range(len(keys)):
                nursery.start_soon(one, n)
    return results


async def test_reads_started_together_take_one_hop_each_caller_its_own_bytes(
    tmp_path: Path,
) -> None:
    store, keys = folder(tmp_path, 30)
    reads = GroupedReads.over(store)
    assert reads.slices == 1  # a folder store: one thread per group
    assert await read_all(reads, keys) == [expected(i) for i in range(30)]
    assert reads.hops == 1
    # later reads make groups of their own
    assert await read_all(reads, keys[:3]) == [expected(i) for i in range(3)]
    assert reads.hops == 2


@pytest.mark.parametrize("slices", [1, 4])
async def test_a_missing_or_oversized_object_fails_its_caller_alone(
    tmp_path: Path, slices: int
) -> None:
    store, keys = folder(tmp_path, 6)
    reads = GroupedReads(store, slices)
    keys[2] = "k/missing"
    results = await read_all(reads, keys, max_bytes=len(expected(4)))
    assert isinstance(results[2], ObjectNotFound)
    assert isinstance(results[5], ContentInvalid)  # larger than max_bytes
    assert [results[i] for i in (0, 1, 3, 4)] == [expected(i) for i in (0, 1, 3, 4)]
    assert reads.hops == 1


class GatedStore(FolderStore):
    """A folder store whose reads wait until the test opens the gate."""

    gate = threading.Event()

    def get(self, key: str, *, max_bytes: int) -> bytes:
        assert self.gate.wait(5)
        return super().get(key, max_bytes=max_bytes)


async def test_a_cancelled_caller_leaves_and_the_others_still_get_their_bytes(
    tmp_path: Path,
) -> None:
    """The first caller leads the group: cancelled while the group is read, it still reads it
    for the others (shielded, as every storage call runs to its end) and the cancellation
    reaches it at its next checkpoint; a cancelled follower leaves at once."""
    _, keys = folder(tmp_path, 4)  # written through a plain folder store
    gated = GatedStore(tmp_path / "blobs")
    reads = GroupedReads.over(AsyncObjectStore(gated, trio.CapacityLimiter(8)))
    results: dict[int, bytes] = {}
    cancelled: list[int] = []
    asked: list[int] = []  # the first to ask leads (Trio may run a batch in either order)

    async def one(n: int, scope: trio.CancelScope) -> None:
        with scope:
            asked.append(n)
            results[n] = await reads.get(keys[n], max_bytes=1 << 20)
            await trio.lowlevel.checkpoint()
        if scope.cancelled_caught:
            cancelled.append(n)

    scopes = [trio.CancelScope() for _ in keys]
    GatedStore.gate.clear()
    async with trio.open_nursery() as nursery:
        for n in range(len(keys)):
            nursery.start_soon(one, n, scopes[n])
        try:
            await trio.testing.wait_all_tasks_blocked()  # the leader waits for its thread
            leader, *followers = asked
            scopes[leader].cancel()
            scopes[followers[-1]].cancel()
            await trio.testing.wait_all_tasks_blocked()
            assert cancelled == [followers[-1]]
            assert results == {}
        finally:
            GatedStore.gate.set()
    assert sorted(cancelled) == sorted([leader, followers[-1]])
    assert results == {n: expected(n) for n in (leader, *followers[:-1])}
    assert reads.hops == 1
