"""A real PgBouncer (Debian's ``pgbouncer`` package) in transaction mode in front of a PostgreSQL
URL, on a free local port, for tests and benchmarks.

:func:`pgbouncer_binary` says where it is or why there is none (``just setup-pgbouncer`` installs
it as root); :func:`running_pgbouncer` writes a configuration that forwards every database name
to the server of the given URL with that URL's user and password (``auth_type = any``: clients
log in with any name and no password), starts it, waits for its port and stops it on exit. As
root it runs as the embedded server's user (PgBouncer refuses to run as root), which may use
that server's socket folder.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from testkit.processes import free_port, stop_process, wait_for_port

BINARY_PLACES = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer")


def pgbouncer_binary() -> Path | None:
    found = shutil.which("pgbouncer")
    candidates = [found] if found else []
    candidates += [place for place in BINARY_PLACES if Path(place).exists()]
    return Path(candidates[0]) if candidates else None


def _run_as() -> str | None:
    if os.geteuid() != 0:
        return None
    for user in ("embedded_postgres", "postgres", "nobody"):
        try:
            pwd.getpwnam(user)
        except KeyError:
            continue
        return user
    return None


@contextmanager
def running_pgbouncer(
    server_url: str, *, pool_size: int = 20, max_client_conn: int = 1000
) -> Iterator[str]:
    """PgBouncer (pool_mode = transaction) in front of ``server_url``'s server; yields the URL
    of ``server_url``'s database through it."""
    binary = pgbouncer_binary()
    if binary is None:
        raise RuntimeError("pgbouncer is not installed (just setup-pgbouncer)")
    target = conninfo_to_dict(server_url)
    port = free_port()
    folder = Path(tempfile.mkdtemp(prefix="trioindex-pgbouncer-"))
    folder.chmod(0o755)
    forward = " ".join(
        f"{key}={target[key]}" for key in ("host", "port", "user", "password") if target.get(key)
    )
    ini = folder / "pgbouncer.ini"
    ini.write_text(
        "[databases]\n"
        f"* = {forward}\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {port}\n"
        "unix_socket_dir =\n"
        "auth_type = any\n"
        "pool_mode = transaction\n"
        f"default_pool_size = {pool_size}\n"
        f"max_client_conn = {max_client_conn}\n"
        "ignore_startup_parameters = extra_float_digits,options\n"
        f"logfile = {folder / 'pgbouncer.log'}\n"
        f"pidfile = {folder / 'pgbouncer.pid'}\n"
    )
    ini.chmod(0o644)
    user = _run_as()
    if user is not None:
        shutil.chown(folder, user)
    command = [str(binary), *(["-u", user] if user else []), str(ini)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, process, 15, "pgbouncer")
        client = make_conninfo(
            "", host="127.0.0.1", port=str(port), dbname=target.get("dbname", "postgres")
        )
        client += " user=trioindex"
        yield client
    finally:
        stop_process(process)
        shutil.rmtree(folder, ignore_errors=True)
