"""Errors over HTTP: one JSON body, ``{"error": {"code": "...", "message": "..."}}``, with a
stable ``code`` per cause and a message for people; never a stack trace or a secret.

:class:`ApiError` is raised by handlers for what they refuse themselves; :func:`classify`
maps trioindex's own errors (already safe to show, see :mod:`trioindex.errors`) and database
failures (named by class and SQLSTATE only: a server message may quote data) to the same
shape. :class:`ErrorMiddleware` answers every error raised below it with that body; anything
unforeseen is ``internal`` (500) and logged with its traceback for the operator.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg_pool import PoolTimeout
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trioindex.db.api_keys import KeyRefused
from trioindex.db.models import ModelNotServing
from trioindex.errors import (
    ContentInvalid,
    DatabaseUnavailable,
    NotFound,
    ProviderUnavailable,
    ResultInvalid,
    StorageUnavailable,
    TrioindexError,
    bounded,
)
from trioindex.search.query import QueryRefused

logger = logging.getLogger(__name__)


class ApiError(Exception):
    """An answer other than success: HTTP ``status``, a stable ``code``, a safe ``message``."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = bounded(message)
        self.headers = dict(headers or {})

    def response(self, *, close: bool = False) -> Response:
        """The JSON answer; ``close`` ends the connection after it (a request body was left
        unread, so the connection cannot carry another request)."""
        body = {"error": {"code": self.code, "message": self.message}}
        headers = {**self.headers, "Connection": "close"} if close else self.headers
        return JSONResponse(body, status_code=self.status, headers=headers)


def invalid(message: str) -> ApiError:
    """A request that breaks a rule of its parameters or body (400 ``invalid_request``)."""
    return ApiError(400, "invalid_request", message)


_STATUS_CODES: Mapping[int, str] = {404: "not_found", 405: "method_not_allowed"}


def _sole(exc: BaseException) -> BaseException:
    """The one error inside (nested) single-member exception groups, else ``exc``."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def classify(raised: BaseException) -> ApiError | None:
    """The answer for an error; None for one nobody foresaw (a bug: 500 ``internal``)."""
    exc = _sole(raised)
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, HTTPException):
        code = _STATUS_CODES.get(exc.status_code, "invalid_request")
        return ApiError(exc.status_code, code, exc.detail, exc.headers)
    if isinstance(exc, KeyRefused):
        return unauthenticated(exc.reason)
    if isinstance(exc, ClientDisconnect):
        return ApiError(400, "client_disconnected", "the client went away before the body ended")
    if isinstance(exc, NotFound):
        return ApiError(404, "not_found", str(exc))
    if isinstance(exc, QueryRefused):
        return ApiError(400, "query_refused", exc.message)
    if isinstance(exc, ModelNotServing):
        return ApiError(409, "model_not_serving", str(exc))
    if isinstance(exc, StorageUnavailable):
        return ApiError(503, "storage_unavailable", str(exc))
    if isinstance(exc, ProviderUnavailable):
        return ApiError(503, "embedding_unavailable", str(exc))
    if isinstance(exc, ResultInvalid):
        return ApiError(502, "embedding_invalid", str(exc))
    if isinstance(exc, ContentInvalid):
        return ApiError(413, "document_too_large", str(exc))
    if isinstance(exc, psycopg.errors.ProgramLimitExceeded):
        # a value the request brought (a key of many 4-byte characters) is over what an index
        # row can hold: the request's fault, refused alone (tested before OperationalError,
        # its base class)
        return invalid("a value of this request is too large for the database to index")
    if isinstance(exc, DatabaseUnavailable | psycopg.OperationalError | PoolTimeout):
        return ApiError(503, "database_unavailable", "the database cannot be reached; retry")
    if isinstance(exc, psycopg.Error):
        return ApiError(
            500, "database_error", f"database error {type(exc).__name__} ({exc.sqlstate or '?'})"
        )
    if isinstance(exc, TrioindexError):
        return ApiError(409, "conflict", str(exc))
    return None


def unauthenticated(message: str) -> ApiError:
    return ApiError(401, "unauthenticated", message, {"WWW-Authenticate": "Bearer"})


INTERNAL = ApiError(500, "internal", "internal error (the service log has the details)")


class ErrorMiddleware:
    """Answers any error raised below it with its JSON body (:func:`classify`), if no response
    has started; an error after the response started ends the connection (re-raised). An error
    answered before the request's body was read to its end (a refused upload, an overloaded
    service) closes the connection after the answer: the rest of the body is never read."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False
        body_read = not _has_body(scope)

        async def tracking(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        async def reading() -> Message:
            nonlocal body_read
            message = await receive()
            ended = message["type"] == "http.disconnect" or not message.get("more_body", False)
            body_read = body_read or ended
            return message

        try:
            await self.app(scope, reading, tracking)
        except Exception as exc:
            error = classify(exc)
            if error is None:
                logger.exception("internal error in %s %s", scope["method"], _route(scope))
                error = INTERNAL
            if started:
                raise
            await error.response(close=not body_read)(scope, receive, send)


def _has_body(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() != b"0"):
            return True
    return False


def _route(scope: Mapping[str, Any]) -> str:
    """The matched route's template (``/v1/documents/{key:path}``): never a document key."""
    route = scope.get("route")
    return str(getattr(route, "path", "(no route)"))
