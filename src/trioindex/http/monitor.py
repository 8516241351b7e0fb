"""What the console watches, over HTTP: ``GET /v1/workers`` (live and recently stopped workers,
heartbeat age, slots used of their maximum, and the jobs each runs now), ``GET /v1/activity``
(throughput and failures in buckets over the last hour or day) and ``POST /v1/jobs/retry-failed``
(every FAILED job of one failure type back to the queue, through the same function as
``jobs retry``)."""

from __future__ import annotations

from typing import Any, Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from trioindex.db.operations.activity import activity as read_activity
from trioindex.db.operations.job_listings import failed_job_ids, retry_failed_job
from trioindex.db.operations.workers import running_jobs, worker_views
from trioindex.errors import NotFound
from trioindex.http.context import service
from trioindex.http.errors import invalid
from trioindex.http.limits import read_json
from trioindex.http.operations import failure_type_param
from trioindex.values import as_json

#: ``window`` of ``GET /v1/activity``: its length and its bucket, in seconds.
WINDOWS: Final = {"hour": (3600, 60), "day": (86_400, 1800)}


async def workers(request: Request) -> Response:
    svc = service(request)
    db = svc.services.db
    found = await db.run(worker_views, heartbeat_timeout=svc.settings.worker.heartbeat_timeout)
    running: dict[str, list[Any]] = {}
    for job in await db.run(running_jobs):
        running.setdefault(str(job.worker_id), []).append(as_json(job))
    shown = []
    for worker in found:
        payload: Any = as_json(worker)
        payload["state"] = worker.state
        payload["jobs"] = running.get(str(worker.id), [])
        shown.append(payload)
    return JSONResponse({"workers": shown})


async def activity(request: Request) -> Response:
    window = request.query_params.get("window", "hour")
    if window not in WINDOWS:
        raise invalid(f"window must be one of {', '.join(WINDOWS)}")
    seconds, bucket = WINDOWS[window]
    found = await service(request).services.db.run(
        read_activity, window_seconds=seconds, bucket_seconds=bucket
    )
    return JSONResponse(as_json(found))


async def retry_failed(request: Request) -> Response:
    body = await read_json(request)
    if not isinstance(body, dict) or set(body) != {"failure_type"}:
        raise invalid('the body is {"failure_type": "<failure type>"}')
    raw = body["failure_type"]
    failure_type = failure_type_param(raw if isinstance(raw, str) else "?")
    if failure_type is None:
        raise invalid("failure_type must be given")
    svc = service(request)
    extra = svc.settings.worker.max_attempts

    def retry(conn: Any) -> list[str]:
        retried = []
        for job_id in failed_job_ids(conn, failure_type):
            try:
                retry_failed_job(conn, job_id, extra_attempts=extra)
            except NotFound:  # retried (or gone) since it was listed
                continue
            retried.append(str(job_id))
        return retried

    retried = await svc.services.db.run(retry)
    return JSONResponse({"failure_type": failure_type, "retried": len(retried), "jobs": retried})
