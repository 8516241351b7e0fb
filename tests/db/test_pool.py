"""The pool follows the work: one connection while idle, more only while threads use them at
once; a server refusing connections for too many clients is waited out, said in one line."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import psycopg
import pytest
import trio
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row

from testkit.chaos.faults import _Pipe as Pipe  # the chaos proxies' two pump threads
from testkit.postgres import admin
from trioindex.db.pgvector_types import PgvectorTypes
from trioindex.db.pool import (
    DEFAULT_MAX_IDLE,
    Connection,
    Database,
    connect,
    open_database,
    session_conninfo,
)
from trioindex.errors import DatabaseUnavailable


def _backends(admin_url: str, dbname: str) -> int:
    rows = admin(
        admin_url,
        "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND backend_type = 'client backend'",
        [dbname],
    )
    return int(rows[0][0])


def _dbname(conn: Connection) -> str:
    row = conn.execute("SELECT current_database() AS d").fetchone()
    assert row is not None
    return str(row["d"])


def _hold_all(db: Database, n: int) -> None:
    """``n`` threads each hold a pooled connection at the same time, then give it back."""
    barrier = threading.Barrier(n)
    threads = [
        threading.Thread(target=db.call, args=(lambda conn: barrier.wait(timeout=10),))
        for _ in range(n)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)


def _wait_until(check: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return bool(check())


def test_the_pool_grows_for_concurrent_work_and_shrinks_back_to_one_when_idle(
    database_url: str, pg_server_url: str
) -> None:
    db = Database(database_url, pool_size=4, max_idle=0.3)
    db.open()
    try:
        dbname = db.call(_dbname)
        assert db.connections_open() == 1
        _hold_all(db, 4)
        assert db.connections_open() == 4
        # the pool closes one unused connection per max_idle period, down to its one
        assert _wait_until(lambda: db.connections_open() == 1, timeout=10)
        assert _backends(pg_server_url, dbname) == 1
    finally:
        db.close()


def _backend_pid(conn: Connection) -> int:
    row = conn.execute("SELECT pg_backend_pid() AS pid").fetchone()
    assert row is not None
    return int(row["pid"])


def test_one_caller_at_a_time_gets_the_connection_returned_last(database_url: str) -> None:
    """After three connections were busy at once, work done one call at a time runs on one
    backend (the connection returned last), not on each of the three in turn: every backend
    pays its own catalog caches and plans."""
    db = Database(database_url, pool_size=3, max_idle=60)
    db.open()
    try:
        _hold_all(db, 3)
        assert db.connections_open() == 3
        backends = [db.call(_backend_pid) for _ in range(6)]
    finally:
        db.close()
    assert len(set(backends)) == 1, backends


def _aborted(url: str) -> Connection:
    """A connection whose transaction failed: it refuses every statement until rolled back."""
    conn = psycopg.connect(url, row_factory=dict_row)
    with pytest.raises(psycopg.errors.DivisionByZero):
        conn.execute("SELECT 1 / 0")
    return conn


def test_a_pools_later_connections_get_pgvector_without_reading_the_catalog(
    database_url: str,
) -> None:
    configure = PgvectorTypes()
    first = psycopg.connect(database_url, autocommit=True, row_factory=dict_row)
    later, unconfigured = _aborted(database_url), _aborted(database_url)
    try:
        configure(first)
        configure(later)  # would raise if it looked the types up: the transaction refuses
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            PgvectorTypes()(unconfigured)  # a first connection does look them up
        later.rollback()
        vector = np.array([1.5, -2.0, 3.25], dtype=np.float32)
        for conn in (first, later):
            row = conn.execute("SELECT %s::vector AS t, %b::vector AS b", (vector, vector))
            got = row.fetchone()
            assert got is not None
            # pgvector's loader: a Vector, where an unadapted connection reads text
            assert [got[k].to_numpy().tolist() for k in ("t", "b")] == [vector.tolist()] * 2
    finally:
        for conn in (first, later, unconfigured):
            conn.close()


def test_the_default_idle_time_closes_a_spare_connection_within_seconds(database_url: str) -> None:
    db = Database(database_url, pool_size=2)
    assert db._pool.max_idle == DEFAULT_MAX_IDLE <= 30


@pytest.fixture
def limited_url(database_url: str, pg_server_url: str) -> Iterator[str]:
    """``database_url`` as a role that may hold one connection at a time."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    admin(pg_server_url, "DROP ROLE IF EXISTS ti_one_conn")
    admin(pg_server_url, "CREATE ROLE ti_one_conn LOGIN PASSWORD 'one-secret' CONNECTION LIMIT 1")
    parts = conninfo_to_dict(database_url)
    parts.update(user="ti_one_conn", password="one-secret")
    try:
        yield make_conninfo("", **parts)
    finally:
        admin(
            pg_server_url,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'ti_one_conn'",
        )
        admin(pg_server_url, "DROP ROLE IF EXISTS ti_one_conn")


async def test_a_server_refusing_for_too_many_clients_is_waited_out_with_one_line(
    limited_url: str, caplog: pytest.LogCaptureFixture, autojump_clock: trio.abc.Clock
) -> None:
    caplog.set_level(logging.WARNING, logger="trioindex.db.pool")
    occupant = connect(limited_url)  # the role's one connection is taken
    opened: list[Database] = []

    async def open_it() -> None:
        async with open_database(limited_url, pool_size=1, run_migrations=False) as db:
            opened.append(db)

    retrying = trio.Event()

    class _Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            retrying.set()

    handler = _Seen(logging.WARNING)
    logging.getLogger("trioindex.db.pool").addHandler(handler)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(open_it)
            await retrying.wait()
            occupant.close()
    finally:
        logging.getLogger("trioindex.db.pool").removeHandler(handler)
    assert len(opened) == 1
    warnings = [r.getMessage() for r in caplog.records if r.name == "trioindex.db.pool"]
    line = warnings[0]
    assert "\n" not in line
    assert "too many clients" in line and "max_connections" in line
    assert "database.pool-size" in line
    assert "one-secret" not in " ".join(warnings)


async def test_other_connection_failures_are_not_retried(database_url: str) -> None:
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    parts = conninfo_to_dict(database_url)
    parts.update(password="wrong-password", user="nobody_here")
    with pytest.raises(DatabaseUnavailable):
        async with open_database(make_conninfo("", **parts), pool_size=1, run_migrations=False):
            pass


def test_a_bounded_call_leaves_no_statement_timeout_on_the_session(db: Database) -> None:
    """The timeout is the transaction's own: nothing stays on a server connection that a
    transaction-pooling proxy would hand to another client next."""
    db.call_bounded(5, lambda conn: conn.execute("SELECT 1"))
    with db.connection() as conn:
        row = conn.execute("SHOW statement_timeout").fetchone()
    assert row is not None and row["statement_timeout"] == "0"


def test_a_pooler_database_prepares_no_statements(database_url: str) -> None:
    db = Database(database_url, pool_size=1, pooler=True)
    db.open()
    try:
        for _ in range(8):
            db.call(lambda conn: conn.execute("SELECT 1").fetchall())
        with db.connection() as conn:
            assert conn.prepare_threshold is None
            prepared = conn.execute("SELECT count(*) AS n FROM pg_prepared_statements").fetchone()
        assert prepared is not None and prepared["n"] == 0
    finally:
        db.close()


def test_session_work_goes_to_the_direct_url_and_a_pooler_without_one_means_polling() -> None:
    assert session_conninfo("host=pg", pooler=False, direct=None) == "host=pg"
    assert session_conninfo("host=bouncer", pooler=True, direct=None) is None
    assert session_conninfo("host=bouncer", pooler=True, direct="host=pg") == "host=pg"


class SlowProxy:
    """A loopback TCP proxy in front of PostgreSQL that holds each new connection for ``delay``
    seconds before passing it on (a server or machine too loaded to connect quickly); the
    delay can change while it runs."""

    def __init__(self, upstream_url: str, delay: float) -> None:
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        parts = conninfo_to_dict(upstream_url)
        host, port = str(parts.get("host") or "localhost"), int(parts.get("port") or 5432)
        self.upstream: tuple[int, Any] = (
            (socket.AF_UNIX, f"{host}/.s.PGSQL.{port}")
            if host.startswith("/")
            else (socket.AF_INET, (host, port))
        )
        self.delay = delay
        self.accepted = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        parts.update(host="127.0.0.1", port=str(self._listener.getsockname()[1]))
        self.url = make_conninfo("", **parts)
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._closed.set()
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._serve, args=(client, self.delay), daemon=True).start()

    def _serve(self, client: socket.socket, delay: float) -> None:
        if self._closed.wait(delay):
            client.close()
            return
        server = socket.socket(self.upstream[0])
        server.connect(self.upstream[1])
        Pipe(client, server, on_close=lambda _pipe: None).start()


@pytest.fixture
def slow_proxy(database_url: str) -> Iterator[SlowProxy]:
    proxy = SlowProxy(database_url, delay=1.0)
    yield proxy
    proxy.close()


async def test_a_pool_too_slow_to_open_is_tried_again_until_the_server_answers_in_time(
    slow_proxy: SlowProxy, caplog: pytest.LogCaptureFixture
) -> None:
    """The first plain connection gets through (slowly), the pool's does not within its open
    timeout: one warning line per try, and the worker opens once connections are quick."""
    caplog.set_level(logging.WARNING, logger="trioindex.db.pool")

    class _Watch(logging.Handler):
        """At the second warning the proxy speeds up: the third try opens."""

        seen = 0

        def emit(self, record: logging.LogRecord) -> None:
            self.seen += 1
            if self.seen == 2:
                slow_proxy.delay = 0.0

    handler = _Watch(logging.WARNING)
    logging.getLogger("trioindex.db.pool").addHandler(handler)
    try:
        with trio.fail_after(60):
            async with open_database(
                slow_proxy.url, pool_size=2, run_migrations=False, open_timeout=0.3, open_tries=5
            ) as db:
                answer = await db.run(lambda conn: conn.execute("SELECT 1 AS one").fetchone())
    finally:
        logging.getLogger("trioindex.db.pool").removeHandler(handler)
    assert answer == {"one": 1}
    warnings = [r.getMessage() for r in caplog.records if r.name == "trioindex.db.pool"]
    assert len(warnings) == 2
    for n, line in enumerate(warnings, start=2):
        assert "\n" not in line
        assert "no connection within 0.3s" in line and f"(try {n} of 5)" in line
    password = str(conninfo_to_dict(slow_proxy.url).get("password") or "no password")
    assert password not in " ".join(warnings)


async def test_a_pool_that_never_opens_in_time_gives_up_with_one_line(
    slow_proxy: SlowProxy, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="trioindex.db.pool")
    with trio.fail_after(60), pytest.raises(DatabaseUnavailable) as raised:
        async with open_database(
            slow_proxy.url, pool_size=2, run_migrations=False, open_timeout=0.3, open_tries=3
        ):
            pass
    message = str(raised.value)
    assert "\n" not in message
    assert "no connection within 0.3s" in message and "gave up after 3 tries" in message
    warnings = [r.getMessage() for r in caplog.records if r.name == "trioindex.db.pool"]
    assert len(warnings) == 2  # tries 2 and 3; the third's failure is the error itself
