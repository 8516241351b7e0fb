"""Jobs, status and health over HTTP: ``GET /v1/jobs`` (newest first, by status),
``GET /v1/jobs/{id}`` (with attempts), ``POST /v1/jobs/{id}/retry`` (a FAILED job back to the
queue with a fresh attempt budget, as ``jobs retry``), ``GET /v1/status`` (what ``trioindex
status`` shows, and the models) and ``GET /healthz`` (the database answers)."""

from __future__ import annotations

from typing import Any, Final
from uuid import UUID

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from trioindex.db import operations as admin
from trioindex.db.documents import database_now
from trioindex.db.models import model_list
from trioindex.errors import NotFound
from trioindex.http.context import service
from trioindex.http.errors import ApiError, invalid
from trioindex.http.limits import int_param
from trioindex.values import JobStatus, as_json

MAX_JOBS: Final = 10_000


def _job_id(request: Request) -> UUID:
    try:
        return UUID(request.path_params["id"])
    except ValueError:
        raise invalid("a job id is a UUID") from None


async def jobs_list(request: Request) -> Response:
    params = request.query_params
    status = params.get("status")
    if status is not None and status not in JobStatus.__members__:
        raise invalid(f"status must be one of {', '.join(JobStatus)}")
    limit = int_param(params.get("limit"), "limit", default=50, low=1, high=MAX_JOBS)
    jobs = await service(request).services.db.run(
        admin.list_jobs, status=JobStatus(status) if status else None, limit=limit
    )
    return JSONResponse({"jobs": as_json(jobs)})


async def jobs_show(request: Request) -> Response:
    job = await service(request).services.db.run(admin.show_job, _job_id(request))
    return JSONResponse(as_json(job))


async def jobs_retry(request: Request) -> Response:
    svc = service(request)
    job_id = _job_id(request)
    job = await svc.services.db.run(admin.show_job, job_id)  # 404 for no such job
    try:
        job = await svc.services.db.run(
            admin.retry_failed_job, job_id, extra_attempts=svc.settings.worker.max_attempts
        )
    except NotFound:
        raise ApiError(
            409, "job_not_failed", f"job {job_id} is {job.status}; only FAILED jobs are retried"
        ) from None
    return JSONResponse(as_json(job))


async def status(request: Request) -> Response:
    svc = service(request)
    db = svc.services.db
    queue = await db.run(
        admin.queue_status, heartbeat_timeout=svc.settings.worker.heartbeat_timeout
    )
    payload: Any = as_json(queue)
    payload["workers"] = [{**as_json(w), "state": w.state} for w in queue.workers]  # type: ignore[dict-item]
    payload["models"] = as_json(await db.run(model_list))
    return JSONResponse(payload)


async def healthz(request: Request) -> Response:
    await service(request).services.db.run(database_now)
    return JSONResponse({"status": "ok"})
