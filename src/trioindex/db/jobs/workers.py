"""Worker rows: a worker registers RUNNING before it may claim, touches its heartbeat, and
moves to STOPPING, then STOPPED; each move writes its event."""

from __future__ import annotations

from uuid import UUID

from trioindex.db.events import record_event
from trioindex.db.pool import Connection
from trioindex.values import CHARACTER_CHUNKING, WorkerStatus


def register_worker(
    conn: Connection,
    *,
    hostname: str,
    pid: int,
    version: str,
    max_concurrency: int,
    chunking: str = CHARACTER_CHUNKING,
) -> UUID:
    """Write the worker row as RUNNING; only after this may the worker claim. ``chunking``
    names the chunk set its chunker makes; its claims carry it."""
    with conn.transaction():
        row = conn.execute(
            """INSERT INTO indexing_workers
                   (hostname, pid, version, status, max_concurrency, chunking)
               VALUES (%s, %s, %s, 'RUNNING', %s, %s) RETURNING id""",
            (hostname, pid, version, max_concurrency, chunking),
        ).fetchone()
        assert row is not None
        worker_id: UUID = row["id"]
        record_event(
            conn,
            "WORKER_REGISTERED",
            worker_id=worker_id,
            detail={"hostname": hostname, "pid": pid, "max_concurrency": max_concurrency},
        )
    return worker_id


def heartbeat(conn: Connection, worker_id: UUID) -> bool:
    """Touch the heartbeat; False when the row is gone or already STOPPED."""
    row = conn.execute(
        """UPDATE indexing_workers SET last_heartbeat_at = now()
           WHERE id = %s AND status <> 'STOPPED' RETURNING id""",
        (worker_id,),
    ).fetchone()
    return row is not None


_WORKER_STATUS_SQL = {
    WorkerStatus.STOPPING: """UPDATE indexing_workers SET status = 'STOPPING'
                              WHERE id = %s AND status = 'RUNNING' RETURNING id""",
    WorkerStatus.STOPPED: """UPDATE indexing_workers SET status = 'STOPPED', stopped_at = now()
                             WHERE id = %s AND status <> 'STOPPED' RETURNING id""",
}


def set_worker_status(conn: Connection, worker_id: UUID, status: WorkerStatus) -> None:
    """Move the worker RUNNING → STOPPING, or to STOPPED (final)."""
    sql = _WORKER_STATUS_SQL.get(status)
    if sql is None:
        raise ValueError(f"a worker can only be moved to STOPPING or STOPPED, not {status}")
    with conn.transaction():
        row = conn.execute(sql, (worker_id,)).fetchone()
        if row is not None:
            record_event(conn, f"WORKER_{status.value}", worker_id=worker_id)
