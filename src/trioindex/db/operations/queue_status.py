"""The queue at a glance: jobs by status, the oldest pending job's age, retries scheduled,
failures by type, the workers, the model serving search and a model switch under way."""

from __future__ import annotations

import attrs

from trioindex.db.models import ModelView, finish_switch, model_list
from trioindex.db.operations.workers import WorkerView, worker_views
from trioindex.db.pool import Connection
from trioindex.values import JobStatus


@attrs.frozen
class QueueStatus:
    jobs_by_status: dict[str, int]
    oldest_pending_age_seconds: float | None
    retries_scheduled: int
    failures_by_type: dict[str, int]
    workers: tuple[WorkerView, ...]
    serving_model: str | None = None
    switch: ModelView | None = None  # the model being switched to: covered / documents


def queue_status(conn: Connection, *, heartbeat_timeout: float) -> QueueStatus:
    finish_switch(conn)  # a model switch whose new model covers everything takes effect here
    with conn.transaction():
        by_status = {
            row["status"]: row["n"]
            for row in conn.execute(
                "SELECT status, count(*) AS n FROM embedding_jobs GROUP BY status"
            ).fetchall()
        }
        pending = conn.execute(
            """SELECT extract(epoch FROM now() - min(created_at))::float8 AS oldest,
                      count(*) FILTER (WHERE attempt_count > 0 AND available_at > now()) AS retries
               FROM embedding_jobs WHERE status = 'PENDING'"""
        ).fetchone()
        failures = {
            row["t"]: row["n"]
            for row in conn.execute(
                """SELECT last_failure_type AS t, count(*) AS n FROM embedding_jobs
                   WHERE status = 'FAILED' GROUP BY last_failure_type ORDER BY 2 DESC"""
            ).fetchall()
        }
        workers = worker_views(conn, heartbeat_timeout=heartbeat_timeout)
    assert pending is not None
    models = model_list(conn)
    return QueueStatus(
        jobs_by_status={s.value: by_status.get(s.value, 0) for s in JobStatus},
        oldest_pending_age_seconds=pending["oldest"],
        retries_scheduled=pending["retries"],
        failures_by_type=failures,
        workers=workers,
        serving_model=next((m.name for m in models if m.serving), None),
        switch=next((m for m in models if m.activating), None),
    )
