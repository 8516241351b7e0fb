"""The LISTEN task on the suite's real PostgreSQL: payloads delivered, a lost session reopened.

Each test name states the behaviour it checks.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import psycopg
import trio

from trioindex.worker.listen import listen

CHANNEL = "ti_listen_test"


def _run(url: str, sql: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql)


async def _sql(url: str, sql: str) -> None:
    await trio.to_thread.run_sync(_run, url, sql)


async def _until(condition: Callable[[], bool], what: str) -> None:
    with trio.move_on_after(20):
        while True:
            if condition():
                return
            await trio.sleep(0.01)  # real PostgreSQL: the NOTIFY arrives on its own clock
    raise AssertionError(f"20 s without {what}")


async def test_payloads_arrive_and_a_terminated_session_is_reopened(database_url: str) -> None:
    payloads: list[str] = []
    states: list[bool] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(
            functools.partial(
                listen,
                database_url,
                CHANNEL,
                payloads.append,
                on_listening=states.append,
                reconnect_pause=0.05,
            )
        )
        await _sql(database_url, f"NOTIFY {CHANNEL}, 'one'")
        await _sql(database_url, f"NOTIFY {CHANNEL}, 'two'")
        await _until(lambda: payloads == ["one", "two"], "the first payloads")
        await _sql(
            database_url,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            f" WHERE query = 'LISTEN {CHANNEL}'",
        )
        await _until(lambda: states == [True, False, True], "the session reopened")
        await _sql(database_url, f"NOTIFY {CHANNEL}, 'three'")
        await _until(lambda: payloads == ["one", "two", "three"], "a payload after reopening")
        nursery.cancel_scope.cancel()
    assert states[-1] is False  # cancelled: it said it stopped listening
