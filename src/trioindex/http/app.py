"""The route table and the application built from it.

:data:`ENDPOINTS` is the one list of what the service answers: method, path, the least role
it needs (None: no API key), the handler, and what ``/openapi.json`` says of it. Every route
is guarded by its role here, in one place (:func:`_guarded`). Middleware, outermost first:
metrics, errors as JSON, the concurrency limit.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from importlib.metadata import version
from typing import Any, Final

import attrs
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from trioindex.db.api_keys import Role
from trioindex.http import batch, console, documents, hooks, monitor, openapi, operations, search
from trioindex.http.context import Service, service
from trioindex.http.errors import ErrorMiddleware
from trioindex.http.limits import ConcurrencyLimit
from trioindex.http.metrics import MetricsMiddleware, metrics

Handler = Callable[[Request], Awaitable[Response]]

_SEARCH_QUERY: Final = (
    ("q", "the query (1 to 2000 characters)"),
    ("mode", "vector, text or hybrid (default)"),
    ("top_k", "documents (or chunks) returned, 1 to 1000 (default 5)"),
    ("prefix", "only documents whose key starts with this"),
    ("content_type[]", "only documents of this type (text/markdown) or family (text); repeat"),
    ("chunks", "true: chunk hits instead of documents"),
    ("chunks_per_document", "best chunks per document, 1 to 100 (default 3)"),
)


@attrs.frozen
class Endpoint:
    """One route: what it answers and who may call it."""

    method: str
    path: str
    role: Role | None
    handler: Handler
    summary: str
    query: tuple[tuple[str, str], ...] = ()
    body: str | None = None
    body_type: str = "application/json"
    body_schema: dict[str, Any] | None = None


async def _openapi(request: Request) -> Response:
    return JSONResponse(openapi.document(ENDPOINTS, version("trioindex")))


ENDPOINTS: Final[tuple[Endpoint, ...]] = (
    Endpoint(
        "POST",
        "/v1/documents/{key:path}",
        Role.WRITE,
        documents.upload,
        "Upload a document (the body is its bytes) and enqueue its indexing",
        (
            ("name", "original file name (default: the key's last segment)"),
            ("priority", "job priority"),
        ),
        body="the document's bytes; Content-Type is kept unless generic",
        body_type="application/octet-stream",
    ),
    Endpoint(
        "POST",
        "/v1/documents",
        Role.WRITE,
        batch.upload_batch,
        "Upload many documents in one request (one multipart part each) and enqueue them;"
        " one result per part, in order",
        (("priority", "job priority of every document of the batch"),),
        body=f"multipart/form-data, at most {batch.MAX_PARTS} parts: each part's field name is"
        " its document key, its filename the original name (default: the key's last segment),"
        " its Content-Type kept unless generic; a part is refused alone (invalid_key,"
        " invalid_name, invalid_content_type, document_too_large, duplicate_key)",
        body_type="multipart/form-data",
        body_schema={
            "type": "object",
            "additionalProperties": {
                "type": "string",
                "contentMediaType": "application/octet-stream",
            },
        },
    ),
    Endpoint(
        "DELETE",
        "/v1/documents/{key:path}",
        Role.WRITE,
        documents.delete,
        "Delete a document: it leaves search at once",
    ),
    Endpoint(
        "GET",
        "/v1/documents",
        Role.READ,
        documents.list_all,
        "Documents in key order, each with its newest version and every model's state",
        (
            ("prefix", "only keys starting with this"),
            ("after", "the next_after of the previous page"),
            ("limit", "1 to 1000 (default 100)"),
            ("low_confidence", "true: only documents OCR read with low confidence; false: others"),
        ),
    ),
    Endpoint(
        "GET",
        "/v1/documents/{key:path}",
        Role.READ,
        documents.show,
        "One document: every version with every model's job",
    ),
    Endpoint("GET", "/v1/search", Role.READ, search.search_one, "Search one query", _SEARCH_QUERY),
    Endpoint(
        "POST",
        "/v1/search",
        Role.READ,
        search.search_many,
        "Search many queries at once",
        body='{"queries": ["..." or {"id": ..., "text": "..."}], "mode", "top_k", "prefix",'
        ' "content_types", "chunks", "chunks_per_document"}',
    ),
    Endpoint(
        "GET",
        "/v1/jobs",
        Role.READ,
        operations.jobs_list,
        "Jobs, newest first, with how many the filter matches (total)",
        (
            ("status", "PENDING, PROCESSING, SUCCEEDED or FAILED"),
            ("failure_type", "only jobs whose last failure is of this type"),
            ("model", "only jobs of this model"),
            ("prefix", "only jobs of documents whose key starts with this"),
            ("since", "only jobs created at or after this ISO 8601 time"),
            ("limit", "1 to 10000 (default 50)"),
            ("offset", "jobs to skip (default 0)"),
        ),
    ),
    Endpoint(
        "GET",
        "/v1/jobs/{id}",
        Role.READ,
        operations.jobs_show,
        "One job with its attempts and its events",
    ),
    Endpoint(
        "POST",
        "/v1/jobs/retry-failed",
        Role.ADMIN,
        monitor.retry_failed,
        "Send every FAILED job of one failure type back to the queue",
        body='{"failure_type": "<failure type>"}',
    ),
    Endpoint(
        "POST",
        "/v1/jobs/{id}/retry",
        Role.ADMIN,
        operations.jobs_retry,
        "Send a FAILED job back to the queue with a fresh attempt budget",
    ),
    Endpoint("GET", "/v1/status", Role.READ, operations.status, "Queue, workers and models"),
    Endpoint(
        "GET",
        "/v1/workers",
        Role.READ,
        monitor.workers,
        "Live and recently stopped workers, with the jobs each runs now",
    ),
    Endpoint(
        "GET",
        "/v1/activity",
        Role.READ,
        monitor.activity,
        "Jobs succeeded, chunks, failures by type and lease recoveries, in time buckets",
        (("window", "hour (1-minute buckets, default) or day (30-minute buckets)"),),
    ),
    Endpoint(
        "POST",
        "/v1/hooks/s3",
        None,
        hooks.s3_event,
        "Bucket notifications (S3 event JSON, authenticated by http.webhook-token)",
        body='S3 event JSON: {"Records": [...]}',
    ),
    Endpoint("GET", "/healthz", None, operations.healthz, "The service and its database answer"),
    Endpoint("GET", "/metrics", Role.READ, metrics, "Prometheus metrics", body_type="text/plain"),
    Endpoint("GET", "/openapi.json", Role.READ, _openapi, "This description"),
    Endpoint("GET", "/console", None, console.root, "The web console (redirects to /console/)"),
    Endpoint("GET", "/console/", None, console.index, "The web console's page"),
    Endpoint(
        "POST",
        "/console/session",
        None,
        console.sign_in,
        "Sign the console in with an API key: sets an HttpOnly session cookie",
        body='{"key": "<API key>"}',
    ),
    Endpoint(
        "GET",
        "/console/session",
        None,
        console.whoami,
        "The console session's key name, role and CSRF token (401 without a session)",
    ),
    Endpoint(
        "DELETE",
        "/console/session",
        None,
        console.sign_out,
        "Sign the console out (needs X-CSRF-Token)",
    ),
    Endpoint(
        "GET",
        "/console/{name}",
        None,
        console.page,
        "The web console's style sheet, script and icon",
    ),
)


def _guarded(endpoint: Endpoint) -> Handler:
    if endpoint.role is None:
        return endpoint.handler
    needed = endpoint.role

    async def guarded(request: Request) -> Response:
        await service(request).guard.check(request, needed)
        return await endpoint.handler(request)

    guarded.__name__ = endpoint.handler.__name__
    return guarded


class _Handled:
    """A route's handler as a plain ASGI application: the request, the handler's response.
    (Starlette's own wrapper looks up exception handlers for every request; every error here
    is answered by :class:`ErrorMiddleware` instead.)"""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = await self.handler(Request(scope, receive, send))
        await response(scope, receive, send)


class _Service(Starlette):
    """Starlette with only the service's middleware: its default outer layers (the
    server-error page and the exception-handler lookup) would wrap every request's messages
    twice more for what :class:`ErrorMiddleware` already answers (Starlette's 404 and 405
    included, as JSON)."""

    def build_middleware_stack(self) -> ASGIApp:
        app: ASGIApp = self.router
        for cls, args, kwargs in reversed(self.user_middleware):
            app = cls(app, *args, **kwargs)
        return app


def build_app(svc: Service) -> Starlette:
    """The ASGI application of ``svc``."""
    app = _Service(
        routes=[
            Route(e.path, _Handled(_guarded(e)), methods=[e.method], name=f"{e.method} {e.path}")
            for e in ENDPOINTS
        ],
        middleware=[
            Middleware(MetricsMiddleware),
            Middleware(ErrorMiddleware),
            Middleware(ConcurrencyLimit, limit=svc.settings.http.max_concurrent_requests),
        ],
    )
    app.state.service = svc
    return app
