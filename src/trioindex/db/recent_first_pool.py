"""The connection pool's order: the connection returned last is handed out first.

Every PostgreSQL backend fills its own catalog caches, compiles each PL/pgSQL function and
plans each statement five times before it keeps a generic plan (about 22 ms of server CPU for
the claim and the completion, measured: docs/test-results/queue.md). psycopg_pool hands out
the connection returned first, which spreads every statement over every connection, so each
of them pays that, and none stays unused long enough to be closed as idle. Taken newest
first, the work runs on as few connections as are busy at once; the pool still closes the
one unused the longest when it shrinks (psycopg_pool takes that one from the left).
"""

from __future__ import annotations

from typing import Any, TypeVar

import psycopg
from psycopg_pool import ConnectionPool

ConnectionT = TypeVar("ConnectionT", bound=psycopg.Connection[Any])


class RecentFirstPool(ConnectionPool[ConnectionT]):
    """A :class:`psycopg_pool.ConnectionPool` that hands out the connection returned last.

    It overrides psycopg_pool's ``_get_ready_connection`` and reads its ``_pool`` deque (both
    private; ``tests/db/test_pool.py`` fails if a release changes them)."""

    def _get_ready_connection(self, timeout: float | None) -> ConnectionT | None:
        # called with the pool's lock held; the parent takes the oldest from the left
        conn = super()._get_ready_connection(timeout)
        if conn is not None and self._pool:
            self._pool.appendleft(conn)
            conn = self._pool.pop()
        return conn
