"""LISTEN/NOTIFY wake-ups: a dedicated psycopg ``AsyncConnection`` run through trio-asyncio.

psycopg's async API speaks asyncio only, so the listener opens a trio-asyncio loop for itself
and iterates the connection's notifications as a Trio async iterator. It is an optimisation:
polling alone keeps the worker correct, so a dropped connection is logged and reopened after a
pause, and nothing else waits on it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import psycopg
import psycopg.waiting
import trio
import trio_asyncio  # patches asyncio.get_running_loop to know about trio-asyncio loops

from trioindex.db.pool import describe_conninfo
from trioindex.ingest import NOTIFY_CHANNEL

logger = logging.getLogger(__name__)

# psycopg binds ``asyncio.get_running_loop`` at import time; when psycopg was imported before
# trio_asyncio (the database module does), that binding misses trio-asyncio's loop. Point it at
# the patched function so psycopg finds the loop this module opens.
psycopg.waiting.get_running_loop = asyncio.get_running_loop  # type: ignore[attr-defined]


async def listen_for_jobs(
    conninfo: str,
    on_notify: Callable[[], None],
    *,
    reconnect_pause: float = 2.0,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Call ``on_notify`` for every NOTIFY on the jobs channel, reconnecting forever.

    ``task_status.started()`` fires once the first LISTEN is in place.
    """
    started = False
    async with trio_asyncio.open_loop():
        while True:
            try:
                conn = await trio_asyncio.aio_as_trio(psycopg.AsyncConnection.connect)(
                    conninfo, autocommit=True
                )
                try:
                    await trio_asyncio.aio_as_trio(conn.execute)(f"LISTEN {NOTIFY_CHANNEL}")
                    logger.debug("listening for jobs on %s", describe_conninfo(conninfo))
                    if not started:
                        started = True
                        task_status.started()
                    async for _ in trio_asyncio.aio_as_trio(conn.notifies()):
                        on_notify()
                finally:
                    with trio.move_on_after(2, shield=True):
                        await trio_asyncio.aio_as_trio(conn.close)()
            except Exception as exc:
                logger.warning(
                    "job notifications unavailable (%s); polling continues, retrying in %.0fs",
                    type(exc).__name__,
                    reconnect_pause,
                )
            if not started:
                started = True
                task_status.started()
            await trio.sleep(reconnect_pause)
