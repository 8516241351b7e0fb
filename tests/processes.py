"""Helpers for tests that run `trioindex` as real processes: the environment, the command,
a spawned worker, a query on the test database, and a wait for a state with a deadline.

Shared by tests/test_process.py, tests/test_cli.py and the other process-level tests, so that
no test module imports another.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row


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
