"""The web console under ``/console``: its static files and its sign-in.

The pages are static files shipped in the package (``console/``: one HTML page, its style
sheet, its script and an icon; no build step, nothing fetched from elsewhere). The script gets
every figure from the same HTTP API (``/v1/...``) with the session cookie
(:mod:`trioindex.http.session`); there is no other query path. Every file is answered with
``Content-Security-Policy: default-src 'self'`` (and no inline script or style), so the browser
itself refuses any asset or request off the service's origin.
"""

from __future__ import annotations

import functools
from importlib.resources import files
from typing import Final

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from trioindex.db.api_keys import ApiKey, KeyRefused, check_token
from trioindex.http.context import service
from trioindex.http.errors import ApiError, invalid, unauthenticated
from trioindex.http.limits import check_text, read_json
from trioindex.http.session import COOKIE, MAX_AGE_SECONDS, SessionStore, session_token

#: The console's own files and their types; nothing else is served under /console.
ASSETS: Final = {
    "index.html": "text/html; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
    "console.js": "text/javascript; charset=utf-8",
    "icon.svg": "image/svg+xml",
}
CSP: Final = (
    "default-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
_HEADERS: Final = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",
}
_MAX_SIGN_IN_BYTES: Final = 4096


@functools.cache
def _asset(name: str) -> bytes:
    return files("trioindex.http").joinpath("console", name).read_bytes()


async def root(request: Request) -> Response:
    return RedirectResponse("/console/", status_code=308)


def _file(name: str) -> Response:
    media_type = ASSETS.get(name)
    if media_type is None:
        raise ApiError(404, "not_found", "no such console file")
    return Response(_asset(name), media_type=media_type, headers=_HEADERS)


async def index(request: Request) -> Response:
    return _file("index.html")


async def page(request: Request) -> Response:
    return _file(request.path_params["name"])


def _store(request: Request) -> SessionStore:
    return service(request).guard.sessions


def _same_origin(request: Request) -> None:
    origin = request.headers.get("origin")
    if origin is None:
        return
    own = f"{request.url.scheme}://{request.headers.get('host', '')}"
    if origin != own:
        raise ApiError(403, "forbidden", "a console sign-in must come from the console's origin")


def _who(key: ApiKey | None, csrf: str) -> Response:
    return JSONResponse(
        {
            "name": key.name if key else None,
            "role": str(key.role) if key else "admin",
            "auth": key is not None,
            "csrf": csrf,
        },
        headers={"Cache-Control": "no-store"},
    )


async def sign_in(request: Request) -> Response:
    _same_origin(request)
    body = await read_json(request, _MAX_SIGN_IN_BYTES)
    if not isinstance(body, dict) or set(body) != {"key"}:
        raise invalid('the body is {"key": "<API key>"}')
    token = check_text("key", body["key"], 200)
    svc = service(request)
    if not svc.guard.enabled:
        return _who(None, "")
    key = await svc.services.db.run(check_token, token)
    session_id, session = svc.guard.sessions.open(token)
    answer = _who(key, session.csrf)
    answer.set_cookie(
        COOKIE,
        session_id,
        max_age=int(MAX_AGE_SECONDS),
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return answer


async def whoami(request: Request) -> Response:
    svc = service(request)
    if not svc.guard.enabled:
        return _who(None, "")
    session_id = request.cookies.get(COOKIE)
    session = svc.guard.sessions.find(session_id)
    if session is None:
        raise unauthenticated("not signed in")
    try:
        key = await svc.services.db.run(check_token, session.token)
    except KeyRefused:  # revoked since the sign-in: the session goes with it
        svc.guard.sessions.close(session_id)
        raise
    return _who(key, session.csrf)


async def sign_out(request: Request) -> Response:
    store = _store(request)
    if service(request).guard.enabled:
        session_token(store, request)  # signing out needs the CSRF token too
        store.close(request.cookies.get(COOKIE))
    answer = JSONResponse({"signed_out": True})
    answer.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
    return answer
