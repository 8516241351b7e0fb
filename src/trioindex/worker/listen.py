"""LISTEN/NOTIFY wake-ups: a dedicated psycopg connection read by Trio's own I/O wait.

The connection is opened and its ``LISTEN`` run in a thread (they block); from then on the
task waits for its socket to become readable (``trio.lowlevel.wait_readable``), reads what
arrived (``consume_input``) and hands over every notification libpq parsed. An idle listener
so costs nothing until a NOTIFY arrives: psycopg's own ``notifies()`` generator wakes every
100 ms to check for cancellation, which in every idle worker of a fleet is ten wake-ups a
second through an event loop. It is an optimisation: polling alone keeps the worker correct, so
a dropped connection is logged and reopened after a pause, and nothing else waits on it.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import psycopg
import trio

from trioindex.db.pool import describe_conninfo
from trioindex.ingest import NOTIFY_CHANNEL

logger = logging.getLogger(__name__)

#: ``application_name`` of the LISTEN connection when the URL names none: an operator counting
#: a worker's connections in ``pg_stat_activity`` tells it from the pool's (``trioindex``).
LISTEN_APPLICATION_NAME = "trioindex listen"


async def listen_for_jobs(
    conninfo: str,
    on_notify: Callable[[], None],
    on_listening: Callable[[bool], None] = lambda _listening: None,
    *,
    reconnect_pause: float = 2.0,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Call ``on_notify`` for every NOTIFY on the jobs channel, reconnecting forever;
    ``on_listening`` as :func:`listen` calls it.

    ``task_status.started()`` fires once the first LISTEN is in place.
    """
    await listen(
        conninfo,
        NOTIFY_CHANNEL,
        lambda _payload: on_notify(),
        on_listening=on_listening,
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
    while True:
        try:
            # abandoned if cancelled mid-connect: the thread's connection is closed when dropped
            conn = await trio.to_thread.run_sync(
                functools.partial(
                    psycopg.connect,
                    conninfo,
                    autocommit=True,
                    fallback_application_name=LISTEN_APPLICATION_NAME,
                ),
                abandon_on_cancel=True,
            )
            try:
                await trio.to_thread.run_sync(conn.execute, f"LISTEN {channel}")
                logger.debug("listening on %s at %s", channel, describe_conninfo(conninfo))
                on_listening(True)
                if not started:
                    started = True
                    task_status.started()
                await _read_notifies(conn, on_notify)
            finally:
                on_listening(False)
                conn.close()
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


async def _read_notifies(conn: psycopg.Connection[Any], on_notify: Callable[[str], None]) -> None:
    """Hand every notification ``conn`` receives to ``on_notify``, until its connection fails
    (``consume_input`` raises ``OperationalError`` once the server has gone)."""
    pgconn = conn.pgconn
    encoding = conn.info.encoding
    while True:
        await trio.lowlevel.wait_readable(pgconn.socket)
        pgconn.consume_input()
        while (notify := pgconn.notifies()) is not None:
            on_notify(notify.extra.decode(encoding))
