"""Helpers for running `trioindex` and its dependencies as real processes: the environment,
the command, a spawned worker, a query on the database, a wait for a state with a deadline, a
free port and a wait for it to listen, and stopping a child.

Shared by the process-level tests, the chaos run and the benchmarks.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

REPO_ROOT = Path(__file__).resolve().parent.parent


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def query(url: str, sql: str, *params: object) -> list[dict[str, Any]]:
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        cursor = conn.execute(sql, params)
        return cursor.fetchall() if cursor.description else []


def try_query(url: str, sql: str, *params: object) -> list[dict[str, Any]] | None:
    """:func:`query`, or None while the database is down (during a restart)."""
    try:
        return query(url, sql, *params)
    except psycopg.OperationalError:
        return None


def cli(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trioindex.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def spawn(env: dict[str, str], *args: str, log: Path) -> subprocess.Popen[bytes]:
    handle = log.open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "trioindex.cli", *args], env=env, stdout=handle, stderr=handle
    )


FAST_WORKER = {
    "TRIOINDEX_WORKER_POLLING_INTERVAL": "200ms",
    "TRIOINDEX_WORKER_LEASE_DURATION": "3s",
    "TRIOINDEX_WORKER_LEASE_RENEWAL_INTERVAL": "1s",
    "TRIOINDEX_WORKER_RECOVERY_INTERVAL": "500ms",
    "TRIOINDEX_WORKER_HEARTBEAT_INTERVAL": "1s",
    "TRIOINDEX_WORKER_HEARTBEAT_TIMEOUT": "5s",
    "TRIOINDEX_WORKER_RETRY_BACKOFF_INITIAL": "100ms",
    "TRIOINDEX_WORKER_SHUTDOWN_GRACE_PERIOD": "2s",
}


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIOINDEX_")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def tei_env(database_url: str, root: Path, embed_url: str, **extra: str) -> dict[str, str]:
    """:func:`base_env` for trioindex commands on ``database_url`` with a folder store and
    ``TRIOINDEX_HOME`` under ``root`` and a TEI embedder (the fake server's 1024 dimensions)
    at ``embed_url``; ``extra`` adds or overrides settings (full names)."""
    return base_env(
        TRIOINDEX_DATABASE_URL=database_url,
        TRIOINDEX_STORAGE_URL=(root / "blobs").as_uri(),
        TRIOINDEX_EMBEDDING_API="tei",
        TRIOINDEX_EMBEDDING_URL=embed_url,
        TRIOINDEX_EMBEDDING_MODEL="BAAI/bge-m3",
        TRIOINDEX_EMBEDDING_DIMENSION="1024",
        TRIOINDEX_HOME=str(root / "home"),
        **extra,
    )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for_port(port: int, process: subprocess.Popen[bytes], timeout: float, what: str) -> None:
    """Wait until something listens on ``port``; raise if ``process`` exits or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with status {process.returncode} at start")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not listen on port {port} within {timeout:.0f}s")


def stop_process(popen: subprocess.Popen[bytes]) -> None:
    """SIGTERM our own child, then SIGKILL (by handle) if it is still there after 10 s."""
    if popen.poll() is None:
        popen.terminate()
        try:
            popen.wait(10)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()
