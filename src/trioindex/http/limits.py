"""What one request may ask for, and how many are served at once.

* Bodies: an upload up to ``indexing.parsing.max-document-size`` (larger documents could never
  be indexed), any JSON body up to :data:`MAX_JSON_BYTES`; a declared ``Content-Length`` over
  the bound is refused before a byte is read, a body that grows past it as soon as it does.
* Concurrency: at most ``http.max-concurrent-requests`` requests are handled at once
  (:class:`ConcurrencyLimit`, one Trio ``CapacityLimiter``); a request that finds no place
  within :data:`QUEUE_WAIT_SECONDS` gets 503 ``overloaded`` with ``Retry-After``. ``/healthz``
  is never held back, so a busy service still answers its health check.
* Search: a query is 1 to ``trioindex.search.query.MAX_QUERY_CHARS`` characters (the search
  layer's own bound; what else it refuses is a 400 ``query_refused``), ``top_k`` 1 to the
  candidates one ranking fetches (``trioindex.search.answers.MAX_CANDIDATES``),
  ``chunks_per_document`` 1 to :data:`MAX_CHUNKS_PER_DOCUMENT`, a ``POST /v1/search`` at most
  :data:`MAX_QUERIES` queries (as ``search --queries`` ranks them together).
* Text from outside (keys, queries, names) must be UTF-8 without NUL
  (:func:`trioindex.config.units.text_problem`), as on the command line.
"""

from __future__ import annotations

import json
from typing import Any, Final

import trio
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from trioindex.cli.common import PRIORITY_MAX, PRIORITY_MIN
from trioindex.config.units import text_problem
from trioindex.http.errors import ApiError, invalid
from trioindex.search.answers import MAX_CANDIDATES

MAX_JSON_BYTES: Final = 1 << 20
MAX_TOP_K: Final = MAX_CANDIDATES
MAX_CHUNKS_PER_DOCUMENT: Final = 100
MAX_QUERIES: Final = 64
MAX_CONTENT_TYPES: Final = 16
#: A document key, prefix or original name (documents.external_key's CHECK).
MAX_KEY_CHARS: Final = 1024
QUEUE_WAIT_SECONDS: Final = 5.0
#: Paths served whatever the load.
UNLIMITED_PATHS: Final = frozenset({"/healthz"})


class ConcurrencyLimit:
    """At most ``limit`` requests inside at once; the others wait up to
    :data:`QUEUE_WAIT_SECONDS`, then get 503 ``overloaded``."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limiter = trio.CapacityLimiter(limit)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNLIMITED_PATHS:
            await self.app(scope, receive, send)
            return
        # only the wait for a place is bounded: a request let in runs as long as it needs
        with trio.move_on_after(QUEUE_WAIT_SECONDS) as waiting:
            await self.limiter.acquire()
        if waiting.cancelled_caught:
            raise ApiError(
                503,
                "overloaded",
                f"{self.limiter.total_tokens:g} requests are being served; retry shortly",
                {"Retry-After": "1"},
            )
        try:
            await self.app(scope, receive, send)
        finally:
            self.limiter.release()


def declared_length(request: Request, limit: int, code: str) -> None:
    """Refuse (413 ``code``) a body whose declared ``Content-Length`` is over ``limit``."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.strip().isdigit() and int(declared) > limit:
        raise too_large(code, limit)


def too_large(code: str, limit: int) -> ApiError:
    return ApiError(413, code, f"the body is over the limit of {limit} bytes")


async def read_json(request: Request, limit: int = MAX_JSON_BYTES) -> Any:
    """The JSON body, read up to ``limit`` bytes (413 ``body_too_large`` past it)."""
    declared_length(request, limit, "body_too_large")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise too_large("body_too_large", limit)
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise invalid("the body is not JSON") from None


def check_text(name: str, value: object, max_chars: int = MAX_KEY_CHARS) -> str:
    """``value`` if it is text of 1 to ``max_chars`` characters that can be stored, else 400
    naming ``name``."""
    if not isinstance(value, str) or not value:
        raise invalid(f"{name} must be a non-empty string")
    if len(value) > max_chars:
        raise invalid(f"{name} is longer than {max_chars} characters")
    problem = text_problem(value)
    if problem is not None:
        raise invalid(f"{name} {problem}")
    return value


def int_param(raw: object, name: str, *, default: int, low: int, high: int) -> int:
    """An integer parameter (query text or JSON number) within ``low``..``high``."""
    if raw is None:
        return default
    value: int | None = None
    if isinstance(raw, bool):
        value = None
    elif isinstance(raw, int):
        value = raw
    elif isinstance(raw, str) and raw.strip().lstrip("-").isdigit() and len(raw) < 20:
        value = int(raw)
    if value is None or not low <= value <= high:
        raise invalid(f"{name} must be an integer from {low} to {high}")
    return value


def priority_param(raw: object) -> int:
    """A job priority (embedding_jobs.priority is a PostgreSQL integer)."""
    return int_param(raw, "priority", default=0, low=PRIORITY_MIN, high=PRIORITY_MAX)


def bool_param(raw: object, name: str) -> bool:
    if raw is None or isinstance(raw, bool):
        return bool(raw)
    if isinstance(raw, str) and raw.lower() in ("true", "1", "false", "0"):
        return raw.lower() in ("true", "1")
    raise invalid(f"{name} must be true or false")
