"""Prometheus metrics of the service, on their own registry, served at ``/metrics``.

Labels are the method, the route's template (``/v1/documents/{key:path}``, never a key) and
the status: a bounded set.
"""

from __future__ import annotations

import time  # sync-ok: perf_counter only, nothing sleeps

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

REGISTRY = CollectorRegistry(auto_describe=True)

REQUESTS = Counter(
    "trioindex_http_requests_total",
    "HTTP requests answered, by method, route and status.",
    ["method", "route", "status"],
    registry=REGISTRY,
)
SECONDS = Histogram(
    "trioindex_http_request_duration_seconds",
    "Time from a request's start to the end of its answer, by route.",
    ["route"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
    registry=REGISTRY,
)
IN_FLIGHT = Gauge(
    "trioindex_http_requests_in_flight", "Requests being handled now.", registry=REGISTRY
)
KEY_CHECKS = Counter(
    "trioindex_http_api_key_checks_total",
    "API keys checked, by where the key was found: cache (verified earlier) or database.",
    ["source"],
    registry=REGISTRY,
)
UPLOADED = Counter(
    "trioindex_http_uploaded_bytes_total",
    "Document bytes received by uploads.",
    registry=REGISTRY,
)


class MetricsMiddleware:
    """Counts and times every request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500
        start = time.perf_counter()

        async def recording(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        IN_FLIGHT.inc()
        try:
            await self.app(scope, receive, recording)
        finally:
            IN_FLIGHT.dec()
            route = str(getattr(scope.get("route"), "path", "unmatched"))
            REQUESTS.labels(scope["method"], route, str(status)).inc()
            SECONDS.labels(route).observe(time.perf_counter() - start)


async def metrics(request: Request) -> Response:
    return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)
