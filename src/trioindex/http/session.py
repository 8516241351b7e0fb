"""Console sessions: an API key given once at sign-in, then an ``HttpOnly`` cookie (the
sign-in, who-am-I and sign-out handlers are in :mod:`trioindex.http.console`).

``POST /console/session`` with ``{"key": "<API key>"}`` checks the key as every request does
(:func:`trioindex.db.api_keys.check_token`) and answers with the key's name, its role and a
CSRF token, setting the cookie ``trioindex_session`` (``HttpOnly; SameSite=Strict; Path=/``,
``Secure`` over HTTPS) to a random session id. The key stays in this process's memory, in the
:class:`SessionStore`, and nowhere else: not in the cookie, a page or a URL.

A request with the cookie and no ``Authorization`` header is checked with the session's key as
any request's key is (:meth:`trioindex.http.auth.Guard.check`: a revoked key stops its sessions
at once). Any method other
than GET and HEAD must also send the session's CSRF token as ``X-CSRF-Token``; a sign-in must
come from the service's own origin when the browser says where it comes from (``Origin``).
``GET /console/session`` answers who is signed in (401 without a session), ``DELETE`` signs
out. Sessions end after :data:`IDLE_SECONDS` without a request or :data:`MAX_AGE_SECONDS`
in all; at most :data:`MAX_SESSIONS` are kept (the least recently used goes first). Sessions
live in one process: a restart signs everyone out.
"""

from __future__ import annotations

import hmac
import secrets
import time  # sync-ok: monotonic only, nothing sleeps
from collections import OrderedDict
from collections.abc import Callable
from typing import Final

import attrs
from starlette.requests import Request

from trioindex.http.errors import ApiError, unauthenticated

COOKIE: Final = "trioindex_session"
CSRF_HEADER: Final = "x-csrf-token"
IDLE_SECONDS: Final = 8 * 3600.0
MAX_AGE_SECONDS: Final = 24 * 3600.0
MAX_SESSIONS: Final = 1000
SAFE_METHODS: Final = frozenset({"GET", "HEAD"})


@attrs.define
class Session:
    """One signed-in browser: the key's token (never shown), its CSRF token and times."""

    token: str = attrs.field(repr=False)
    csrf: str = attrs.field(repr=False)
    created: float
    used: float


@attrs.define
class SessionStore:
    """The sessions of this process, least recently used first; ``clock`` is monotonic."""

    clock: Callable[[], float] = time.monotonic
    sessions: OrderedDict[str, Session] = attrs.field(factory=OrderedDict, repr=False)

    def open(self, token: str) -> tuple[str, Session]:
        """A new session for ``token``: its id (the cookie's value) and the session."""
        now = self.clock()
        session_id = secrets.token_urlsafe(32)
        session = Session(token, secrets.token_urlsafe(32), now, now)
        self.sessions[session_id] = session
        while len(self.sessions) > MAX_SESSIONS:
            self.sessions.popitem(last=False)
        return session_id, session

    def find(self, session_id: str | None) -> Session | None:
        """The live session of ``session_id`` (its use recorded), None if none or expired."""
        session = self.sessions.get(session_id) if session_id else None
        if session is None or session_id is None:
            return None
        now = self.clock()
        if now - session.used > IDLE_SECONDS or now - session.created > MAX_AGE_SECONDS:
            del self.sessions[session_id]
            return None
        session.used = now
        self.sessions.move_to_end(session_id)
        return session

    def close(self, session_id: str | None) -> None:
        if session_id:
            self.sessions.pop(session_id, None)


def session_token(store: SessionStore, request: Request) -> str | None:
    """The API key of the request's session, None without a session cookie; 401 for an
    unknown or expired session, 403 ``csrf_failed`` for an action without its CSRF token."""
    session_id = request.cookies.get(COOKIE)
    if session_id is None:
        return None
    session = store.find(session_id)
    if session is None:
        raise unauthenticated("the console session has ended; sign in again")
    if request.method not in SAFE_METHODS:
        sent = request.headers.get(CSRF_HEADER, "")
        if not hmac.compare_digest(sent.encode(), session.csrf.encode()):
            raise ApiError(403, "csrf_failed", "this action needs the session's X-CSRF-Token")
    return session.token
