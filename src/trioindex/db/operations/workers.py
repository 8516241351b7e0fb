"""Workers as operators see them: the live and recently stopped ones (LOST when their
heartbeat is too old), whether a live one exists (on a host, or anywhere), and the jobs each
runs now."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

import attrs

from trioindex.db.operations.job_listings import JOB_SELECT
from trioindex.db.pool import Connection


@attrs.frozen
class WorkerView:
    id: UUID
    hostname: str
    pid: int
    status: str
    max_concurrency: int
    heartbeat_age_seconds: float
    running_jobs: int
    lost: bool

    @property
    def state(self) -> str:
        return "LOST" if self.lost else self.status


def worker_views(conn: Connection, *, heartbeat_timeout: float) -> tuple[WorkerView, ...]:
    """Workers not stopped, and those stopped within the last hour, newest first; LOST when
    their heartbeat is older than ``heartbeat_timeout`` seconds."""
    return tuple(
        WorkerView(
            id=row["id"],
            hostname=row["hostname"],
            pid=row["pid"],
            status=row["status"],
            max_concurrency=row["max_concurrency"],
            heartbeat_age_seconds=row["age"],
            running_jobs=row["running"],
            lost=row["status"] != "STOPPED" and row["age"] > heartbeat_timeout,
        )
        for row in conn.execute(
            """SELECT w.*, extract(epoch FROM now() - w.last_heartbeat_at)::float8 AS age,
                      (SELECT count(*) FROM embedding_jobs j
                        WHERE j.worker_id = w.id AND j.status = 'PROCESSING') AS running
               FROM indexing_workers w
               WHERE w.status <> 'STOPPED' OR w.stopped_at > now() - interval '1 hour'
               ORDER BY w.started_at DESC"""
        ).fetchall()
    )


def fresh_worker_on_host(conn: Connection, hostname: str, max_age_seconds: float) -> bool:
    """True when a RUNNING worker on ``hostname`` sent a heartbeat within ``max_age_seconds``."""
    row = conn.execute(
        """SELECT 1 FROM indexing_workers
           WHERE hostname = %s AND status = 'RUNNING'
             AND last_heartbeat_at > now() - make_interval(secs => %s) LIMIT 1""",
        (hostname, max_age_seconds),
    ).fetchone()
    return row is not None


def live_worker_count(conn: Connection, max_age_seconds: float) -> int:
    """RUNNING workers (any host) that sent a heartbeat within ``max_age_seconds``."""
    row = conn.execute(
        """SELECT count(*) AS n FROM indexing_workers
           WHERE status = 'RUNNING' AND last_heartbeat_at > now() - make_interval(secs => %s)""",
        (max_age_seconds,),
    ).fetchone()
    return int(row["n"]) if row else 0


@attrs.frozen
class RunningJob:
    """A PROCESSING job as its worker's row shows it."""

    job_id: UUID
    worker_id: UUID
    document_key: str
    version_no: int
    model: str
    progress: int
    attempt_count: int
    lease_expires_at: datetime | None


def running_jobs(conn: Connection) -> list[RunningJob]:
    """Every PROCESSING job, by worker, oldest claim first."""
    return [
        RunningJob(
            row["id"],
            row["worker_id"],
            row["external_key"],
            row["version_no"],
            row["model_name"],
            row["progress"],
            row["attempt_count"],
            row["lease_expires_at"],
        )
        for row in conn.execute(
            f"""{JOB_SELECT} WHERE j.status = 'PROCESSING' AND j.worker_id IS NOT NULL
                ORDER BY j.worker_id, j.locked_at, j.id"""
        ).fetchall()
    ]
