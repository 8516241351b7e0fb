"""API keys of the HTTP service: making, listing, revoking and checking them.

A token is ``ti_<key id, 32 hex digits>_<secret>``, the secret being 32 random bytes
(URL-safe base64). The row keeps only the SHA-256 of the whole token. Checking a token reads
its row by the id it names, then compares the hashes with :func:`hmac.compare_digest`, so the
time taken does not depend on how much of a guessed secret is right; the row is read on every
check, so a revocation takes effect with its commit. A revocation also sends ``NOTIFY``
:data:`REVOKED_CHANNEL` with the key's id (delivered at its commit), so a service that keeps
verified keys (``trioindex.http.key_cache``) drops that key the moment it hears it.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import re
import secrets
from datetime import datetime
from typing import Any, Final
from uuid import UUID, uuid4

import attrs
import psycopg

from trioindex.db.pool import Connection
from trioindex.errors import NotFound, TrioindexError

#: The longest key name (the CHECK on api_keys.name).
MAX_NAME_CHARS: Final = 100
_TOKEN = re.compile(r"ti_([0-9a-f]{32})_([A-Za-z0-9_-]{43})")
#: The channel a revocation is announced on; the payload is the revoked key's id.
REVOKED_CHANNEL: Final = "trioindex_api_key_revoked"
# compared against when a token names no key, so an unknown id costs the same comparison
_NO_HASH: Final = "0" * 64


class Role(enum.StrEnum):
    """What a key may do; each role may do everything the roles before it may."""

    READ = "read"
    WRITE = "write"
    ADMIN = "admin"

    def allows(self, needed: Role) -> bool:
        order = list(Role)
        return order.index(self) >= order.index(needed)


@attrs.frozen
class ApiKey:
    """A key as ``keys list`` shows it: never its token or hash."""

    id: UUID
    name: str
    role: Role
    created_at: datetime
    revoked_at: datetime | None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> ApiKey:
        return cls(row["id"], row["name"], Role(row["role"]), row["created_at"], row["revoked_at"])


class KeyRefused(TrioindexError):
    """A token that names no usable key; ``reason`` says why, without the token."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode("ascii")).hexdigest()


def create_key(conn: Connection, name: str, role: Role) -> tuple[ApiKey, str]:
    """A new key named ``name`` with ``role``, and its token (shown once: only its hash is
    stored). Refused when a key of that name exists, revoked or not."""
    if not 1 <= len(name) <= MAX_NAME_CHARS:
        raise TrioindexError(f"a key name is 1 to {MAX_NAME_CHARS} characters")
    key_id = uuid4()
    token = f"ti_{key_id.hex}_{secrets.token_urlsafe(32)}"
    try:
        with conn.transaction():
            row = conn.execute(
                """INSERT INTO api_keys (id, name, role, key_hash) VALUES (%s, %s, %s, %s)
                   RETURNING *""",
                (key_id, name, role.value, _hash(token)),
            ).fetchone()
    except psycopg.errors.UniqueViolation:
        raise TrioindexError(
            f"a key named {name!r} exists (a revoked key keeps its name); choose another name"
        ) from None
    assert row is not None
    return ApiKey.from_row(row), token


def list_keys(conn: Connection) -> list[ApiKey]:
    """Every key, revoked ones too, oldest first."""
    rows = conn.execute("SELECT * FROM api_keys ORDER BY created_at, name").fetchall()
    return [ApiKey.from_row(row) for row in rows]


def revoke_key(conn: Connection, name: str) -> ApiKey:
    """Revoke the key named ``name`` (it stops working with this commit, which also announces
    it on :data:`REVOKED_CHANNEL`); a key revoked already keeps its first revocation time.
    :class:`NotFound` when there is no such key."""
    with conn.transaction():
        row = conn.execute(
            """UPDATE api_keys SET revoked_at = coalesce(revoked_at, now())
               WHERE name = %s RETURNING *""",
            (name,),
        ).fetchone()
        if row is not None:
            conn.execute("SELECT pg_notify(%s, %s)", (REVOKED_CHANNEL, str(row["id"])))
    if row is None:
        raise NotFound(f"no API key named {name!r}")
    return ApiKey.from_row(row)


def check_token(conn: Connection, token: str) -> ApiKey:
    """The key ``token`` belongs to; :class:`KeyRefused` when it is malformed, names no key,
    does not match, or its key is revoked."""
    match = _TOKEN.fullmatch(token)
    if match is None:
        raise KeyRefused("not an API key")
    row = conn.execute("SELECT * FROM api_keys WHERE id = %s", (UUID(match[1]),)).fetchone()
    stored = row["key_hash"] if row is not None else _NO_HASH
    if not hmac.compare_digest(stored, _hash(token)) or row is None:
        raise KeyRefused("unknown API key")
    key = ApiKey.from_row(row)
    if key.revoked_at is not None:
        raise KeyRefused("this API key was revoked")
    return key
