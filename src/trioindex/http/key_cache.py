"""Verified API keys, kept while the service hears revocations.

Reading a key's row costs a worker-thread call and a query per request. The service keeps
each key it has verified (under the SHA-256 of its token, so no token is held here) and
listens on :data:`~trioindex.db.api_keys.REVOKED_CHANNEL`, where every revocation is
announced at its commit (:func:`trioindex.db.api_keys.revoke_key`). A revocation drops its
key from the cache as soon as the service hears it, so the next request with that key reads
its row and is refused.

Keys are kept only while the LISTEN is in place: before it is, after its connection is lost
(a revocation could be missed) and behind a transaction pooler without
``database.direct-url`` (no session to listen on), every request reads its key's row. When the
LISTEN comes back, everything kept before is forgotten. A key is kept at most
:data:`KEEP_SECONDS`, so a key changed without the announcement (an ``UPDATE`` by hand) is
read again within that time; at most :data:`MAX_KEYS` are kept.

A key read from the database while a revocation arrives is not kept (:attr:`KeyCache.epoch`
changes with every revocation and every loss of the LISTEN), so a read that started before a
revocation's announcement can never put the revoked key back.
"""

from __future__ import annotations

import hashlib
import logging
import time  # sync-ok: monotonic only, nothing sleeps
from collections.abc import Callable
from typing import Final

import attrs
import trio

from trioindex.db.api_keys import REVOKED_CHANNEL, ApiKey

logger = logging.getLogger(__name__)

KEEP_SECONDS: Final = 60.0
MAX_KEYS: Final = 1000


def token_digest(token: str) -> str:
    """What a token is kept under."""
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()


@attrs.define(eq=False)
class KeyCache:
    """The verified keys of one service, by the SHA-256 of their token."""

    clock: Callable[[], float] = time.monotonic
    listening: bool = False
    #: changes with every revocation heard and every change of :attr:`listening`
    epoch: int = 0
    _keys: dict[str, tuple[ApiKey, float]] = attrs.field(factory=dict, repr=False)

    def find(self, digest: str) -> ApiKey | None:
        """The key verified for this token digest, None if not kept (or kept too long)."""
        found = self._keys.get(digest) if self.listening else None
        if found is None:
            return None
        key, kept_at = found
        if self.clock() - kept_at > KEEP_SECONDS:
            del self._keys[digest]
            return None
        return key

    def keep(self, digest: str, key: ApiKey, epoch: int) -> None:
        """Keep ``key``, read from the database when :attr:`epoch` was ``epoch``; not kept
        if a revocation was heard (or the LISTEN lost) since."""
        if not self.listening or epoch != self.epoch:
            return
        if len(self._keys) >= MAX_KEYS:
            self._keys.clear()
        self._keys[digest] = (key, self.clock())

    def revoked(self, payload: str) -> None:
        """A revocation was announced: forget its key (every key, if the payload names
        none we keep)."""
        self.epoch += 1
        for digest, (key, _) in list(self._keys.items()):
            if str(key.id) == payload:
                del self._keys[digest]

    def set_listening(self, listening: bool) -> None:
        """The LISTEN is in place (keys may be kept from now on) or lost (none are)."""
        self.epoch += 1
        self.listening = listening
        self._keys.clear()


async def hear_revocations(
    conninfo: str | None,
    cache: KeyCache,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Keep ``cache`` told of revocations until cancelled; with no session to listen on
    (``conninfo`` None) the cache stays off."""
    if conninfo is None:
        logger.info("serve: no database session to LISTEN on: API keys are read per request")
        task_status.started()
        await trio.sleep_forever()
    from trioindex.worker.listen import listen

    await listen(
        conninfo,
        REVOKED_CHANNEL,
        cache.revoked,
        on_listening=cache.set_listening,
        meanwhile="API keys are read per request",
        task_status=task_status,
    )
