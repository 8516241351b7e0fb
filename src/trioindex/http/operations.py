"""Jobs, status and health over HTTP: ``GET /v1/jobs`` (newest first, filtered by status,
failure type, model, key prefix and creation time, paged), ``GET /v1/jobs/{id}`` (with
attempts and events), ``POST /v1/jobs/{id}/retry`` (a FAILED job back to the queue with a
fresh attempt budget, as ``jobs retry``), ``GET /v1/status`` (what ``trioindex status`` shows,
and the models) and ``GET /healthz`` (the database answers)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Final
from uuid import UUID

from starlette.datastructures import QueryParams
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from trioindex.db.documents import database_now
from trioindex.db.models import model_list
from trioindex.db.operations.job_listings import (
    JobFilter,
    count_jobs,
    list_jobs,
    retry_failed_job,
    show_job,
)
from trioindex.db.operations.job_timeline import job_events
from trioindex.db.operations.queue_status import queue_status
from trioindex.errors import FailureType, NotFound
from trioindex.http.context import service
from trioindex.http.errors import ApiError, invalid
from trioindex.http.limits import check_text, int_param
from trioindex.values import JobStatus, as_json

MAX_JOBS: Final = 10_000
MAX_OFFSET: Final = 1_000_000


def _job_id(request: Request) -> UUID:
    try:
        return UUID(request.path_params["id"])
    except ValueError:
        raise invalid("a job id is a UUID") from None


def failure_type_param(raw: str | None) -> FailureType | None:
    if raw is None or raw == "":
        return None
    if raw not in FailureType.__members__:
        raise invalid(f"failure_type must be one of {', '.join(FailureType)}")
    return FailureType(raw)


def _job_filter(params: QueryParams) -> JobFilter:
    status = params.get("status") or None
    if status is not None and status not in JobStatus.__members__:
        raise invalid(f"status must be one of {', '.join(JobStatus)}")
    model = params.get("model") or None
    prefix = params.get("prefix") or ""
    since = params.get("since") or None
    try:
        when = datetime.fromisoformat(since) if since else None
    except ValueError:
        raise invalid("since must be an ISO 8601 time, e.g. 2026-01-31T14:00:00Z") from None
    if when is not None and when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return JobFilter(
        status=JobStatus(status) if status else None,
        failure_type=failure_type_param(params.get("failure_type")),
        model=check_text("model", model) if model else None,
        key_prefix=check_text("prefix", prefix) if prefix else "",
        since=when,
    )


async def jobs_list(request: Request) -> Response:
    params = request.query_params
    where = _job_filter(params)
    limit = int_param(params.get("limit"), "limit", default=50, low=1, high=MAX_JOBS)
    offset = int_param(params.get("offset"), "offset", default=0, low=0, high=MAX_OFFSET)
    db = service(request).services.db
    jobs = await db.run(list_jobs, where=where, limit=limit, offset=offset)
    total = await db.run(count_jobs, where)
    return JSONResponse({"jobs": as_json(jobs), "total": total, "offset": offset})


async def jobs_show(request: Request) -> Response:
    db = service(request).services.db
    job_id = _job_id(request)
    payload: Any = as_json(await db.run(show_job, job_id))
    payload["events"] = as_json(await db.run(job_events, job_id))
    return JSONResponse(payload)


async def jobs_retry(request: Request) -> Response:
    svc = service(request)
    job_id = _job_id(request)
    job = await svc.services.db.run(show_job, job_id)  # 404 for no such job
    try:
        job = await svc.services.db.run(
            retry_failed_job, job_id, extra_attempts=svc.settings.worker.max_attempts
        )
    except NotFound:
        raise ApiError(
            409, "job_not_failed", f"job {job_id} is {job.status}; only FAILED jobs are retried"
        ) from None
    return JSONResponse(as_json(job))


async def status(request: Request) -> Response:
    svc = service(request)
    db = svc.services.db
    queue = await db.run(queue_status, heartbeat_timeout=svc.settings.worker.heartbeat_timeout)
    payload: Any = as_json(queue)
    payload["workers"] = [{**as_json(w), "state": w.state} for w in queue.workers]  # type: ignore[dict-item]
    payload["models"] = as_json(await db.run(model_list))
    return JSONResponse(payload)


async def healthz(request: Request) -> Response:
    await service(request).services.db.run(database_now)
    return JSONResponse({"status": "ok"})
