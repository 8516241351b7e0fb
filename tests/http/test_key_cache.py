"""The service's cache of verified API keys (http/key_cache.py), with a fake clock: a key is kept
only while revocations are heard, a revocation drops it, a read that a revocation overtook is
not kept, and nothing is kept for long."""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import uuid4

from trioindex.db.api_keys import ApiKey, Role
from trioindex.http.key_cache import KEEP_SECONDS, MAX_KEYS, KeyCache, token_digest


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def a_key(name: str = "page") -> ApiKey:
    return ApiKey(uuid4(), name, Role.READ, datetime.now(UTC), None)


def listening_cache() -> tuple[KeyCache, Clock]:
    clock = Clock()
    cache = KeyCache(clock=clock)
    cache.set_listening(True)
    return cache, clock


def test_a_key_is_kept_under_its_token_digest_never_its_token() -> None:
    cache, _ = listening_cache()
    key, token = a_key(), "ti_" + "1" * 32 + "_" + "s" * 43
    cache.keep(token_digest(token), key, cache.epoch)
    assert cache.find(token_digest(token)) == key
    assert cache.find(token_digest(token + "x")) is None
    assert cache.find(token) is None and token not in repr(cache)


def test_nothing_is_kept_unless_revocations_are_heard() -> None:
    cache = KeyCache(clock=Clock())
    cache.keep("d", a_key(), cache.epoch)
    assert cache.find("d") is None  # never listening: every request reads its key
    cache.set_listening(True)
    cache.keep("d", a_key(), cache.epoch)
    assert cache.find("d") is not None
    cache.set_listening(False)  # the LISTEN is lost: a revocation could be missed
    assert cache.find("d") is None
    cache.keep("d", a_key(), cache.epoch)
    assert cache.find("d") is None
    cache.set_listening(True)  # back: what was kept before is forgotten
    assert cache.find("d") is None


def test_a_revocation_drops_its_key_and_only_it() -> None:
    cache, _ = listening_cache()
    revoked, other = a_key("revoked"), a_key("other")
    cache.keep("r", revoked, cache.epoch)
    cache.keep("r2", revoked, cache.epoch)  # the same key under a second token digest
    cache.keep("o", other, cache.epoch)
    cache.revoked(str(revoked.id))
    assert cache.find("r") is None and cache.find("r2") is None
    assert cache.find("o") == other


def test_a_read_overtaken_by_a_revocation_is_not_kept() -> None:
    cache, _ = listening_cache()
    key = a_key()
    epoch = cache.epoch  # a request starts reading the key's row
    cache.revoked(str(key.id))  # the revocation is heard while the read is in its thread
    cache.keep("d", key, epoch)  # the read's (now stale) answer
    assert cache.find("d") is None
    unrelated = cache.epoch
    cache.revoked(str(uuid4()))  # any revocation: a read started before it is not kept
    cache.keep("d", key, unrelated)
    assert cache.find("d") is None


def test_a_key_is_kept_for_a_bounded_time_and_count() -> None:
    cache, clock = listening_cache()
    cache.keep("d", a_key(), cache.epoch)
    clock.now += KEEP_SECONDS - 1
    assert cache.find("d") is not None
    clock.now += 2
    assert cache.find("d") is None
    for i in range(MAX_KEYS + 1):
        cache.keep(f"k{i}", a_key(), cache.epoch)
    assert cache.find(f"k{MAX_KEYS}") is not None
    assert sum(cache.find(f"k{i}") is not None for i in range(MAX_KEYS + 1)) <= MAX_KEYS
