"""The worker-wide embedding coalescer (embedding/batching.py) over an in-memory embedder, on
Trio's virtual clock: linger, request size, the in-flight cap, per-caller failure, withdrawal."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Sequence

import attrs
import numpy as np
import pytest
import trio
import trio.testing

from trioindex.embedding.batching import EmbeddingCoalescer
from trioindex.embedding.vectors import Vectors, validate_vectors
from trioindex.errors import ProviderRejectedInput

DIM = 3


def vector(text: str) -> list[float]:
    return [float(len(text)), float(sum(map(ord, text)) % 97), 1.0]


@attrs.define
class FakeServer:
    """Answers each request after ``latency`` virtual seconds; refuses one holding ``bad``."""

    latency: float = 1.0
    sent: list[tuple[float, list[str]]] = attrs.field(factory=list)
    in_flight: int = 0
    max_in_flight: int = 0

    async def embed(self, texts: Sequence[str]) -> Vectors:
        self.sent.append((trio.current_time(), list(texts)))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await trio.sleep(self.latency)
        finally:
            self.in_flight -= 1
        if "bad" in texts:
            raise ProviderRejectedInput("the server rejected the input")
        return validate_vectors(
            [vector(t) for t in texts], expected_count=len(texts), dimension=DIM
        )


def coalescer(server: FakeServer, **changes: object) -> EmbeddingCoalescer:
    options: dict[str, object] = {"max_batch_size": 4, "max_in_flight": 2, "linger": 0.005}
    options.update(changes)
    return EmbeddingCoalescer(embed_one=server.embed, **options)  # type: ignore[arg-type]


async def embed_all(c: EmbeddingCoalescer, callers: list[list[str]]) -> list[object]:
    results: list[object] = [None] * len(callers)

    async def one(i: int) -> None:
        try:
            results[i] = await c.embed(callers[i], DIM)
        except ProviderRejectedInput as exc:
            results[i] = exc

    async with trio.open_nursery() as nursery:
        nursery.start_soon(c.serve)
        async with trio.open_nursery() as callers_nursery:
            for i in range(len(callers)):
                callers_nursery.start_soon(one, i)
        nursery.cancel_scope.cancel()
    return results


async def test_a_request_that_is_not_full_waits_the_linger_then_goes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = FakeServer()
    began = trio.current_time()
    (result,) = await embed_all(coalescer(server, linger=0.25), [["only"]])
    assert [(at - began, texts) for at, texts in server.sent] == [(0.25, ["only"])]
    assert np.array_equal(result, np.array([vector("only")], dtype=np.float32))  # type: ignore[arg-type]


async def test_callers_share_full_requests_and_each_gets_exactly_its_rows(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = FakeServer()
    callers = [[f"c{i}-t{j}" for j in range(i + 1)] for i in range(5)]  # 15 texts
    results = await embed_all(coalescer(server, max_in_flight=1), callers)
    assert sorted(len(texts) for _, texts in server.sent) == [3, 4, 4, 4]
    for texts, result in zip(callers, results, strict=True):
        expected = np.array([vector(t) for t in texts], dtype=np.float32)
        assert np.array_equal(result, expected)  # type: ignore[arg-type]


async def test_requests_in_flight_never_exceed_the_cap(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = FakeServer()
    callers = [[f"c{i}-t{j}" for j in range(4)] for i in range(10)]
    await embed_all(coalescer(server, max_in_flight=3), callers)
    assert server.max_in_flight == 3
    assert len(server.sent) == 10


async def test_a_long_document_does_not_hold_up_short_ones(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = FakeServer()
    long = [f"long-{j}" for j in range(40)]
    c = coalescer(server, max_in_flight=1)
    results = await embed_all(c, [long, ["short"]])
    short_sent = next(i for i, (_, texts) in enumerate(server.sent) if "short" in texts)
    assert short_sent <= 1  # in the first or second request, not after all ten of the long one
    assert np.array_equal(results[0], np.array([vector(t) for t in long], dtype=np.float32))  # type: ignore[arg-type]


async def test_a_failed_shared_request_is_decided_per_caller(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = FakeServer()
    good, bad = ["fine", "also fine"], ["bad"]
    results = await embed_all(coalescer(server), [good, bad])
    assert isinstance(results[1], ProviderRejectedInput)
    assert np.array_equal(results[0], np.array([vector(t) for t in good], dtype=np.float32))  # type: ignore[arg-type]
    # one shared request, then each caller's texts alone
    assert sorted(len(texts) for _, texts in server.sent) == [1, 2, 3]


async def test_a_cancelled_caller_s_texts_are_withdrawn(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = FakeServer(latency=10.0)
    c = coalescer(server, max_in_flight=1, max_batch_size=2)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(c.serve)
        with trio.move_on_after(1.0):
            await c.embed(["a", "b", "c", "d", "e", "f"], DIM)
        await trio.sleep(30)
        nursery.cancel_scope.cancel()
    assert [texts for _, texts in server.sent] == [["a", "b"]]


@pytest.mark.parametrize("budget", [10, 25])
async def test_requests_respect_the_token_budget(
    autojump_clock: trio.testing.MockClock, budget: int
) -> None:
    server = FakeServer()
    texts = [f"text {i:02d}" for i in range(8)]
    c = coalescer(server, max_batch_tokens=budget, estimate=lambda _t: 5, max_batch_size=32)
    await embed_all(c, [texts])
    per_request = budget // 5
    sizes = [len(sent) for _, sent in server.sent]
    assert sizes == [per_request] * (8 // per_request) + (
        [8 % per_request] if 8 % per_request else []
    )


async def test_released_texts_are_dropped_as_their_vectors_arrive(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = FakeServer()
    originals = [f"chunk-{j}" for j in range(12)]
    texts = list(originals)
    seen: list[list[str]] = []  # the caller's list as each request goes out
    embed_one = server.embed

    async def watching(batch: Sequence[str]) -> list[list[float]]:
        seen.append(list(texts))
        return await embed_one(batch)

    c = coalescer(server, max_in_flight=1)
    c.embed_one = watching
    async with trio.open_nursery() as nursery:
        nursery.start_soon(c.serve)
        result = await c.embed(texts, DIM, release=True)
        nursery.cancel_scope.cancel()
    assert [batch for _, batch in server.sent] == [originals[0:4], originals[4:8], originals[8:]]
    # each request's texts are gone once it was answered, not before
    assert seen == [originals, [""] * 4 + originals[4:], [""] * 8 + originals[8:]]
    assert texts == [""] * 12
    assert np.array_equal(result, np.array([vector(t) for t in originals], dtype=np.float32))


async def test_released_texts_of_a_failed_shared_request_are_sent_again_intact(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = FakeServer()
    good = ["fine", "also fine"]
    texts = list(good)
    c = coalescer(server)
    results: list[object] = []

    async def bad_caller() -> None:
        try:
            await c.embed(["bad"], DIM)
        except ProviderRejectedInput as exc:
            results.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(c.serve)
        nursery.start_soon(bad_caller)
        result = await c.embed(texts, DIM, release=True)
        nursery.cancel_scope.cancel()
    assert isinstance(results[0], ProviderRejectedInput)
    # one shared request that failed, then each caller's texts alone: the good ones unchanged
    assert sorted(len(batch) for _, batch in server.sent) == [1, 2, 3]
    assert [batch for _, batch in server.sent if "bad" not in batch] == [good]
    assert np.array_equal(result, np.array([vector(t) for t in good], dtype=np.float32))
    assert texts == ["", ""]


async def test_release_needs_a_list_it_can_clear() -> None:
    c = coalescer(FakeServer())
    with pytest.raises(TypeError):
        await c.embed(("a", "b"), DIM, release=True)
    assert c.requests == 0


async def test_a_caller_s_vectors_are_not_kept_once_it_has_them(
    autojump_clock: trio.testing.MockClock,
) -> None:
    c = coalescer(FakeServer())
    gc.disable()  # freed by reference counting, not by a later collection
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(c.serve)
            result = await c.embed([f"chunk-{j}" for j in range(6)], DIM)
            gone = weakref.ref(result)
            del result
            await trio.sleep(1)  # the coalescer waits for the next texts
            assert gone() is None
            nursery.cancel_scope.cancel()
    finally:
        gc.enable()


async def _embed_at(c: EmbeddingCoalescer, at: float, texts: list[str], key: str | None) -> None:
    await trio.sleep_until(at)
    await c.embed(texts, DIM, key=key)


async def _settle_at(c: EmbeddingCoalescer, at: float, key: str) -> None:
    await trio.sleep_until(at)
    c.settle(key)


@pytest.mark.parametrize(
    ("expected", "late", "settled_at", "requests"),
    [
        # no one expected: the first text waits the short linger and goes alone
        ([], ("b", 0.02), None, [(0.005, ["a1"]), (0.025, ["b1"])]),
        # an expected caller arriving within the backlog linger joins the request at once
        (["b"], ("b", 0.02), None, [(0.02, ["a1", "b1"])]),
        # an expected caller that never comes holds each request for the backlog linger only
        (["b"], ("c", 0.08), None, [(0.05, ["a1"]), (0.13, ["c1"])]),
        # an expected caller whose job ended (settled) holds it no longer
        (["b"], ("c", 0.08), 0.01, [(0.01, ["a1"]), (0.085, ["c1"])]),
    ],
)
async def test_a_request_waits_for_expected_callers_up_to_the_backlog_linger(
    autojump_clock: trio.testing.MockClock,
    expected: list[str],
    late: tuple[str, float],
    settled_at: float | None,
    requests: list[tuple[float, list[str]]],
) -> None:
    server = FakeServer(latency=0.001)
    c = coalescer(server, max_batch_size=8, linger=0.005, backlog_linger=0.05)
    began = trio.current_time()
    for key in expected:
        c.expect(key)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(c.serve)
        async with trio.open_nursery() as callers:
            callers.start_soon(_embed_at, c, began, ["a1"], "a")
            key, at = late
            callers.start_soon(_embed_at, c, began + at, [f"{key}1"], key)
            if settled_at is not None:
                callers.start_soon(_settle_at, c, began + settled_at, "b")
        nursery.cancel_scope.cancel()
    assert [(round(at - began, 6), texts) for at, texts in server.sent] == requests
