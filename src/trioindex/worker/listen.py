"""LISTEN/NOTIFY wake-ups: a dedicated psycopg ``AsyncConnection`` run through trio-asyncio.

psycopg's async API speaks asyncio only, so the listener opens a trio-asyncio loop for itself
and iterates the connection's notifications as a Trio async iterator. It is an optimisation:
polling alone keeps the worker correct, so a dropped connection is logged and reopened after a
pause, and nothing else waits on it.

Why this module patches ``psycopg.waiting.get_running_loop`` when it is imported: psycopg's
async wait functions find their loop with ``get_running_loop``, a name ``psycopg.waiting``
binds once, at its own import (``from asyncio import get_running_loop``). trio-asyncio keeps
its loop in a context variable, not in asyncio's running-loop slot, and makes
``asyncio.get_running_loop`` find it by replacing that function when ``trio_asyncio`` is
imported. psycopg is imported first here (the database pool module imports it), so its
binding is still the original function, which sees no loop inside ``aio_as_trio`` and fails
with "no running event loop". Neither library offers a supported way around it: psycopg has
no setting to choose its wait function or loop lookup, and trio-asyncio's only mechanism is its
own replacement of ``asyncio.get_running_loop``, which reaches just the code that looks the
name up when it runs. The only other route is importing trio_asyncio before anything imports
psycopg, which would make every command import trio-asyncio first and break silently the day
an import moves. So the binding is pointed at trio-asyncio's function. It is safe everywhere
else: outside a Trio task, and in Trio tasks with no trio-asyncio loop, that function answers
exactly as the original does.
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

# The patch the module docstring explains: psycopg's import-time binding of
# ``get_running_loop`` must see the loop trio-asyncio keeps in a context variable.
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
    await listen(
        conninfo,
        NOTIFY_CHANNEL,
        lambda _payload: on_notify(),
        meanwhile="polling continues",
        reconnect_pause=reconnect_pause,
        task_status=task_status,
    )


async def listen(
    conninfo: str,
    channel: str,
    on_notify: Callable[[str], None],
    *,
    on_listening: Callable[[bool], None] = lambda _listening: None,
    meanwhile: str = "",
    reconnect_pause: float = 2.0,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Call ``on_notify`` with the payload of every NOTIFY on ``channel``, reconnecting
    forever; ``on_listening(True)`` once a LISTEN is in place, ``on_listening(False)`` when
    its connection is lost (notifications may be missed until the next True). ``meanwhile``
    says in the warning what the process does without them.

    ``task_status.started()`` fires once the first LISTEN is in place (or the first try failed).
    """
    started = False
    async with trio_asyncio.open_loop():
        while True:
            try:
                conn = await trio_asyncio.aio_as_trio(psycopg.AsyncConnection.connect)(
                    conninfo, autocommit=True
                )
                try:
                    await trio_asyncio.aio_as_trio(conn.execute)(f"LISTEN {channel}")
                    logger.debug("listening on %s at %s", channel, describe_conninfo(conninfo))
                    on_listening(True)
                    if not started:
                        started = True
                        task_status.started()
                    async for notify in trio_asyncio.aio_as_trio(conn.notifies()):
                        on_notify(notify.payload)
                finally:
                    on_listening(False)
                    with trio.move_on_after(2, shield=True):
                        await trio_asyncio.aio_as_trio(conn.close)()
            except Exception as exc:
                logger.warning(
                    "%s notifications unavailable (%s); %sretrying in %.0fs",
                    "job" if channel == NOTIFY_CHANNEL else channel,
                    type(exc).__name__,
                    f"{meanwhile}, " if meanwhile else "",
                    reconnect_pause,
                )
            if not started:
                started = True
                task_status.started()
            await trio.sleep(reconnect_pause)
