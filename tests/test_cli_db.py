"""The embedded PostgreSQL's life: a killed user does not keep it running, and `db stop` stops
it on demand.

Real processes end to end: the CLI in subprocesses on embedded defaults with a private home, a
client killed with SIGKILL (no exit hook runs), and the server's own process checked by pid.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
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


def killed_waiting_ingest(env: dict[str, str], tmp_path: Path) -> None:
    """An ``ingest --wait`` that started (or joined) the server, killed with SIGKILL mid-wait:
    its exit hook never runs, so its pid stays in the server's list of users."""
    docs = tmp_path / "docs"
    docs.mkdir(exist_ok=True)
    (docs / "note.txt").write_text("a document nobody will index: no worker runs")
    log = tmp_path / "ingest.log"
    client = spawn(env, "ingest", "--wait", str(docs), log=log)
    try:
        wait_for(lambda: "no live worker" in log.read_text(), 60, "`ingest --wait` waiting")
    finally:
        client.kill()
        client.wait(10)


@contextlib.contextmanager
def holder(env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    """Another process using the server (as a running worker does) until its stdin closes."""
    hold = "import sys; from pathlib import Path; from trioindex.db.pool import start_embedded"
    hold += "; start_embedded(Path(sys.argv[1])); print('up', flush=True); sys.stdin.read()"
    proc = subprocess.Popen(
        [sys.executable, "-c", hold, env["TRIOINDEX_HOME"]],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
        yield proc
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(60)


def test_a_server_whose_only_user_was_killed_is_stopped_by_the_next_command(
    home: Path, tmp_path: Path
) -> None:
    env = base_env(TRIOINDEX_HOME=str(home))
    killed_waiting_ingest(env, tmp_path)
    pid = server_pid(home)
    assert running(pid)

    status = cli(env, "status")
    assert status.returncode == 0, status.stderr
    line = status.stdout.splitlines()[-1]
    assert "left running by a process that died (pid " in line, status.stdout
    assert "it stops when this command exits" in line
    wait_for(lambda: not running(pid), 30, "the orphaned server to stop")
    assert not (home / "pgdata" / "postmaster.pid").exists()

    # the next command starts it for itself only, and says so
    again = cli(env, "status")
    assert again.stdout.splitlines()[-1].endswith("started for this command only"), again.stdout


def test_the_last_live_user_stops_the_server_though_another_user_was_killed(
    home: Path, tmp_path: Path
) -> None:
    env = base_env(TRIOINDEX_HOME=str(home))
    with holder(env):
        killed_waiting_ingest(env, tmp_path)
        pid = server_pid(home)
        status = cli(env, "status")
        assert "running (it stops when the last" in status.stdout, status.stdout
        assert running(pid)  # the holder still uses it
    wait_for(lambda: not running(pid), 30, "the server to stop with its last live user")


def test_db_stop_stops_the_server_now_whoever_uses_it(home: Path) -> None:
    env = base_env(TRIOINDEX_HOME=str(home))
    with holder(env):
        pid = server_pid(home)
        stop = cli(env, "db", "stop")
        assert stop.returncode == 0, stop.stderr
        assert stop.stdout.startswith("stopped the embedded PostgreSQL under")
        assert not running(pid)
        assert not (home / "pgdata" / "postmaster.pid").exists()

        again = cli(env, "db", "stop")
        assert again.returncode == 0, again.stderr
        assert again.stdout.startswith("no embedded PostgreSQL is running under")
