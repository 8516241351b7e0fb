"""The schema: versioned migrations for tables, indexes and data, and one repeatable file for
every function and trigger, applied in one transaction under a PostgreSQL advisory lock.

Each ``NNNN_name.sql`` file in this package is one versioned migration; ``functions.sql`` holds
the current text of every ``trioindex_*`` function, trigger and view (Flyway's "repeatable
migration"). :func:`migrate` runs in one transaction that first takes a transaction-level
advisory lock, so that any number of processes may call it at once (the first applies what is
missing, the others wait and then find nothing left to do), through a transaction-pooling proxy
too: nothing is left on the session, the lock ends with the transaction. Each pending migration
runs with the row that records it; then, when the text of ``functions.sql`` differs from the one
last applied (its SHA-256 is recorded), every ``trioindex_*`` view and function (and with them
their triggers) is dropped and the file run, so the database holds exactly the functions the
tree defines, whatever it was migrated from. A failure leaves the schema as it was before the
call.
"""

from __future__ import annotations

import hashlib
import logging
import re
from importlib import resources
from typing import Any

import attrs
import psycopg

from trioindex.errors import ConfigError

logger = logging.getLogger(__name__)

# An arbitrary constant shared by every trioindex process ("trioidx" in ASCII).
MIGRATION_LOCK_KEY = 0x74_72_69_6F_69_64_78

_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
FUNCTIONS_FILE = "functions.sql"


@attrs.frozen
class Migration:
    version: int
    name: str
    sql: str = attrs.field(repr=False)


def available_migrations() -> list[Migration]:
    """Every migration shipped with the package, in version order."""
    found = []
    for entry in resources.files(__package__).iterdir():
        match = _NAME.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migration versions must be 1..n without gaps, found {versions}")
    return found


def functions_sql() -> str:
    """The text of every function and trigger (``functions.sql``)."""
    return resources.files(__package__).joinpath(FUNCTIONS_FILE).read_text(encoding="utf-8")


# Every trioindex_* view and function, as DROP takes it (views first: they may call functions).
_OUR_OBJECTS = """
SELECT 'VIEW ' || quote_ident(viewname) AS object, 0 AS pass FROM pg_views
WHERE schemaname = current_schema() AND viewname LIKE 'trioindex\\_%'
UNION ALL
SELECT 'FUNCTION ' || p.oid::regprocedure::text, 1
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = current_schema() AND p.proname LIKE 'trioindex\\_%'
ORDER BY pass
"""


def _apply_functions(conn: psycopg.Connection[Any]) -> str | None:
    """Re-create every function, trigger and view when ``functions.sql`` changed, in the
    caller's transaction; the new text's SHA-256 when it did, None when nothing changed."""
    text = functions_sql()
    digest = hashlib.sha256(text.encode()).hexdigest()
    conn.execute(
        """CREATE TABLE IF NOT EXISTS trioindex_schema_functions (
               id          boolean PRIMARY KEY DEFAULT true CHECK (id),
               sha256      text NOT NULL,
               applied_at  timestamptz NOT NULL DEFAULT now()
           )"""
    )
    row = conn.execute("SELECT sha256 FROM trioindex_schema_functions").fetchone()
    if row is not None and row[0] == digest:
        return None
    for name, _ in conn.execute(_OUR_OBJECTS).fetchall():
        conn.execute(f"DROP {name} CASCADE")
    conn.execute(text.encode())
    conn.execute(
        """INSERT INTO trioindex_schema_functions (sha256) VALUES (%s)
           ON CONFLICT (id) DO UPDATE SET sha256 = EXCLUDED.sha256, applied_at = now()""",
        (digest,),
    )
    return digest


def migrate(conninfo: str) -> list[int]:
    """Apply every pending migration, then ``functions.sql`` if its text changed, all in one
    transaction; return the versions this call applied.

    Blocking; safe to run from several processes at once, on PostgreSQL itself or through a
    transaction pooler (the lock is the transaction's, not the session's).
    """
    applied_now: list[int] = []
    with psycopg.connect(conninfo, autocommit=True) as conn:
        _require_utf8(conn)
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
            conn.execute(
                """
                CREATE TABLE IF NOT EXISTS trioindex_schema_migrations (
                    version     integer PRIMARY KEY,
                    name        text NOT NULL,
                    applied_at  timestamptz NOT NULL DEFAULT now()
                )
                """
            )
            rows = conn.execute("SELECT version FROM trioindex_schema_migrations").fetchall()
            done = {row[0] for row in rows}
            pending = [m for m in available_migrations() if m.version not in done]
            for migration in pending:
                conn.execute(migration.sql.encode())
                conn.execute(
                    "INSERT INTO trioindex_schema_migrations (version, name) VALUES (%s, %s)",
                    (migration.version, migration.name),
                )
                applied_now.append(migration.version)
            functions = _apply_functions(conn)
    for migration in pending:
        logger.info("applied migration %04d_%s", migration.version, migration.name)
    if functions is not None:
        logger.info("applied %s (%s)", FUNCTIONS_FILE, functions[:12])
    return applied_now


def _require_utf8(conn: psycopg.Connection[Any]) -> None:
    """Refuse a database whose encoding is not UTF8 before anything is created in it.

    Under SQL_ASCII the server hands text back undecoded, so every status read as bytes and the
    first claim failed deep inside the worker; other encodings cannot store every document's
    text. Either way the fix is a new database, which the message says how to make.
    """
    encoding = conn.info.parameter_status("server_encoding") or "unknown"
    if encoding.upper() not in {"UTF8", "UTF-8"}:
        raise ConfigError(
            f"database.url: the database uses encoding {encoding}; trioindex needs UTF8 "
            "(CREATE DATABASE ... ENCODING 'UTF8' TEMPLATE template0)"
        )


def current_version(conn: psycopg.Connection[Any]) -> int:
    """The highest applied migration, 0 on an empty database."""
    exists = conn.execute(
        "SELECT to_regclass('trioindex_schema_migrations') IS NOT NULL"
    ).fetchone()
    if not exists or not exists[0]:
        return 0
    row = conn.execute(
        "SELECT coalesce(max(version), 0) FROM trioindex_schema_migrations"
    ).fetchone()
    return int(row[0]) if row else 0
