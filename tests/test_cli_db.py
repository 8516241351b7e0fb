"""`trioindex db stop`: the embedded PostgreSQL a killed client left running, stopped on demand.

Real processes end to end: the CLI in subprocesses on embedded defaults with a private home, a
client killed with SIGKILL (no exit hook runs), and the server's own process checked by pid.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from testkit.processes import base_env, cli, spawn, wait_for
from trioindex.db.pool import stop_embedded

pytestmark = pytest.mark.slow


@pytest.fixture
def home() -> Iterator[Path]:
    """A TRIOINDEX_HOME outside pytest's 0700 temp folders (the server runs as its own user)."""
    folder = Path(tempfile.mkdtemp(prefix="trioindex-home-"))
    yield folder
    stop_embedded(folder)  # whatever the test left running
    shutil.rmtree(folder, ignore_errors=True)


def server_pid(home: Path) -> int:
    """The postmaster's pid, from the first line of its pid file."""
    return int((home / "pgdata" / "postmaster.pid").read_text().split("\n", 1)[0])


def running(pid: int) -> bool:
    """The process exists and is not a zombie (the container's init may reap it late)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_db_stop_stops_the_server_a_killed_ingest_wait_left_running(
    home: Path, tmp_path: Path
) -> None:
    env = base_env(TRIOINDEX_HOME=str(home))
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "note.txt").write_text("a document nobody will index: no worker runs")
    log = tmp_path / "ingest.log"
    client = spawn(env, "ingest", "--wait", str(docs), log=log)
    try:
        wait_for(lambda: "no live worker" in log.read_text(), 60, "`ingest --wait` waiting")
        client.kill()  # SIGKILL: its exit hook never runs, so the server it started stays up
        client.wait(10)
    finally:
        client.kill()
    pid = server_pid(home)
    assert running(pid)

    status = cli(env, "status")
    assert status.returncode == 0, status.stderr
    assert "embedded PostgreSQL" in status.stdout and "`trioindex db stop`" in status.stdout
    assert running(pid)  # a later command joins the server and leaves it up

    stop = cli(env, "db", "stop")
    assert stop.returncode == 0, stop.stderr
    assert stop.stdout.startswith("stopped the embedded PostgreSQL under")
    assert not running(pid)
    assert not (home / "pgdata" / "postmaster.pid").exists()

    again = cli(env, "db", "stop")
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("no embedded PostgreSQL is running under")
