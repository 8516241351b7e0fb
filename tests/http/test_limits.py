"""The service's concurrency bound (:class:`trioindex.http.limits.ConcurrencyLimit`) on Trio's
fake clock: only the wait for a place is bounded, never the request that got one."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from trioindex.http.errors import ApiError
from trioindex.http.limits import QUEUE_WAIT_SECONDS, ConcurrencyLimit

SLOW_SECONDS = QUEUE_WAIT_SECONDS * 6


def _scope(path: str = "/v1/search") -> dict[str, Any]:
    return {"type": "http", "path": path}


async def _nothing() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


class SlowApp:
    """An ASGI app whose every request but ``/healthz`` takes ``seconds`` on the clock, then
    answers."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.started = 0
        self.finished = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["path"] == "/healthz":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            return
        self.started += 1
        await trio.sleep(self.seconds)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        self.finished += 1


async def _sent(limit: ConcurrencyLimit, path: str = "/v1/search") -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    await limit(_scope(path), _nothing, send)
    return messages


async def test_a_request_let_in_runs_past_the_queue_wait(
    autojump_clock: trio.abc.Clock,
) -> None:
    app = SlowApp(SLOW_SECONDS)
    began = trio.current_time()
    messages = await _sent(ConcurrencyLimit(app, 2))
    assert [m["status"] for m in messages] == [200]
    assert app.finished == 1
    assert trio.current_time() - began == pytest.approx(SLOW_SECONDS)


async def test_a_request_that_finds_no_place_in_time_is_503_and_frees_nothing(
    autojump_clock: trio.abc.Clock,
) -> None:
    app = SlowApp(SLOW_SECONDS)
    limit = ConcurrencyLimit(app, 1)
    refused: list[ApiError] = []

    async def second() -> None:
        try:
            await _sent(limit)
        except ApiError as exc:
            refused.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(_sent, limit)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(second)
        await trio.sleep(QUEUE_WAIT_SECONDS + 1)
        # the refused request took no place: the first still holds the only one
        assert [e.status for e in refused] == [503]
        assert refused[0].code == "overloaded" and refused[0].headers == {"Retry-After": "1"}
        assert limit.limiter.borrowed_tokens == 1
    assert app.started == app.finished == 1
    assert limit.limiter.borrowed_tokens == 0


async def test_a_request_that_waits_less_than_the_bound_is_served(
    autojump_clock: trio.abc.Clock,
) -> None:
    app = SlowApp(QUEUE_WAIT_SECONDS / 2)
    limit = ConcurrencyLimit(app, 1)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_sent, limit)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(_sent, limit)
    assert app.finished == 2


async def test_the_health_check_is_never_held_back(autojump_clock: trio.abc.Clock) -> None:
    app = SlowApp(SLOW_SECONDS)
    limit = ConcurrencyLimit(app, 1)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_sent, limit)
        await trio.testing.wait_all_tasks_blocked()
        with trio.fail_after(1):
            assert [m["status"] for m in await _sent(limit, "/healthz")] == [200]
        nursery.cancel_scope.cancel()
