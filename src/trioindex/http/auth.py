"""Who may call what: an API key per request, its role, and the webhook's own token.

Every route names the least role it needs (``read``: search, status, documents and jobs;
``write``: also upload and delete; ``admin``: also retry jobs) and :meth:`Guard.check` runs
before its handler: no ``Authorization: Bearer <token>`` is 401, a token that names no live
key is 401, a role too low is 403. A key verified once is kept while the service hears
revocations (:mod:`trioindex.http.key_cache`): a revocation drops it as soon as it is
announced, and without the LISTEN every request reads its key's row. ``serve --no-auth``
(loopback only) skips the check. ``/healthz`` needs no key; the bucket-notification webhook
authenticates with ``http.webhook-token`` instead (MinIO sends ``Bearer <auth_token>``),
compared in constant time. A console session (:mod:`trioindex.http.session`) stands for
its key when no ``Authorization`` header is sent.
"""

from __future__ import annotations

import hmac

import attrs
from starlette.requests import Request

from trioindex.db.api_keys import ApiKey, Role, check_token
from trioindex.db.pool import Database
from trioindex.http.errors import ApiError, unauthenticated
from trioindex.http.key_cache import KeyCache, token_digest
from trioindex.http.metrics import KEY_CHECKS
from trioindex.http.session import SessionStore, session_token

_SCHEME = "bearer"


def bearer_token(request: Request) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, None without one."""
    header = request.headers.get("authorization")
    if header is None:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != _SCHEME or not token.strip():
        raise unauthenticated("the Authorization header must be `Bearer <API key>`")
    return token.strip()


@attrs.frozen
class Guard:
    """The per-request checks; ``enabled`` False is ``serve --no-auth``."""

    db: Database
    enabled: bool = True
    webhook_token: str | None = attrs.field(default=None, repr=False)
    sessions: SessionStore = attrs.field(factory=SessionStore, repr=False)
    keys: KeyCache = attrs.field(factory=KeyCache, repr=False)

    async def check(self, request: Request, needed: Role) -> ApiKey | None:
        """The caller's key if its role allows ``needed``; 401/403 otherwise."""
        if not self.enabled:
            return None
        token = bearer_token(request) or session_token(self.sessions, request)
        if token is None:
            raise unauthenticated("an API key is required: Authorization: Bearer <API key>")
        key = await self.verified(token)
        if not key.role.allows(needed):
            raise ApiError(
                403, "forbidden", f"this needs a {needed} key; key {key.name!r} is {key.role}"
            )
        return key

    async def verified(self, token: str) -> ApiKey:
        """The live key of ``token``: kept from an earlier request, else read (and kept)."""
        digest = token_digest(token)
        key = self.keys.find(digest)
        if key is not None:
            KEY_CHECKS.labels("cache").inc()
            return key
        epoch = self.keys.epoch
        key = await self.db.run(check_token, token)
        KEY_CHECKS.labels("database").inc()
        self.keys.keep(digest, key, epoch)
        return key

    def check_webhook(self, request: Request) -> None:
        """The webhook's token, or 401/403; with no token configured only ``--no-auth``
        accepts notifications."""
        if self.webhook_token is None:
            if self.enabled:
                raise ApiError(
                    403,
                    "webhook_disabled",
                    "bucket notifications are off: set http.webhook-token",
                )
            return
        token = bearer_token(request)
        if token is None or not hmac.compare_digest(
            token.encode("utf-8", "surrogateescape"), self.webhook_token.encode()
        ):
            raise unauthenticated("the webhook token does not match http.webhook-token")
