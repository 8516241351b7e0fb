"""The object-storage contract: what a store is, and the rules every store enforces alike.

Owns :class:`ObjectInfo`, the blocking :class:`ObjectStore` protocol, the object-key rule
(:func:`check_key`) and the argument and integrity checks both stores share, so a call that works
on the folder store works on S3 and fails the same way when it does not.

Errors leave a store already classified (``trioindex.errors``)::

    ObjectNotFound      the key is not in the store
    StorageUnavailable  the store cannot be reached or refused the call (retryable)
    ContentInvalid      the object is larger than the caller's ``max_bytes``
    ValueError          a caller bug: a key escaping the root, or data that does not match
                        the ``size`` / ``sha256`` it was put with

Keys are relative ``/``-separated paths whose segments are non-empty and do not start with
``.`` (so no ``.``/``..``, and no clash with the folder store's hidden temp and sidecar
files). A ``put`` without a content type stores ``application/octet-stream``, as S3 would.
"""

from __future__ import annotations

import hashlib
import io
import re
from collections.abc import Iterable
from contextlib import AbstractContextManager
from typing import IO, BinaryIO, Final, Protocol, TypedDict, Unpack

import attrs

from trioindex.errors import ContentInvalid

DEFAULT_CONTENT_TYPE: Final = "application/octet-stream"
#: Where trioindex stores the bytes it uploads itself: ``sha256/ab/<sha256>``. Any other key is
#: an object someone else put (registered in place), which trioindex never deletes.
OWN_BLOB_PREFIX: Final = "sha256/"
#: The piece :meth:`ObjectStore.digest` reads at a time.
READ_PIECE: Final = 1 << 20
SHA256_METADATA: Final = "sha256"  # travels as the x-amz-meta-sha256 header
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


@attrs.frozen
class ObjectInfo:
    """What a store knows about one object; ``sha256`` is lower-case hex, None if unknown."""

    key: str
    size: int
    sha256: str | None
    content_type: str | None


class PutOptions(TypedDict):
    """What :meth:`ObjectStore.put` needs besides the key and the bytes (keyword arguments)."""

    size: int
    sha256: str
    content_type: str | None


class ObjectStore(Protocol):
    """The synchronous storage contract; every method blocks (see :class:`AsyncObjectStore`)."""

    @property
    def description(self) -> str:
        """Safe for logs: where the objects live, never a credential."""
        ...

    def put(self, key: str, data: bytes | BinaryIO, **options: Unpack[PutOptions]) -> ObjectInfo:
        """Store exactly ``size`` bytes, atomically replacing any object under ``key``.

        A stream is read for exactly ``size`` bytes; a short stream or a SHA-256 that does
        not match raises ``ValueError`` and leaves any previous object in place.
        """
        ...

    def get(self, key: str, *, max_bytes: int) -> bytes:
        """The object's bytes; ``ContentInvalid`` if it is larger than ``max_bytes``.

        Never reads more than ``max_bytes + 1`` bytes, even if the object grows meanwhile.
        """
        ...

    def stat(self, key: str) -> ObjectInfo: ...

    def digest(self, key: str, *, max_bytes: int) -> ObjectInfo:
        """The object's size and the SHA-256 of its bytes, read once in pieces of
        :data:`READ_PIECE` bytes (never whole in memory); ``ContentInvalid`` if it is larger
        than ``max_bytes``, and no more than ``max_bytes + 1`` bytes are read."""
        ...

    def delete(self, key: str) -> None:
        """Remove the object; a key with no object is not an error (deleting is idempotent)."""
        ...

    def ensure_ready(self) -> None:
        """Create the bucket / folder if missing; ``StorageUnavailable`` if that fails."""
        ...

    def deferred_sync(self) -> AbstractContextManager[None]:
        """A block whose ``put`` calls (in this thread) of new keys may return before their
        bytes are durable; all of them are when the block exits without an error
        (``StorageUnavailable`` if that fails; a nested block leaves it to the outermost). A
        caller publishes none of those keys before the block ends; a put over an existing key
        is durable before it replaces the key, as outside a block. Ingest uses it for a slice
        of files: about one disk flush for many small files, not two for each."""
        ...


def check_key(key: str) -> str:
    """Return ``key`` if it is a valid relative object key, else raise ``ValueError``."""
    if not key or key.startswith("/") or "\\" in key or "\x00" in key:
        raise ValueError(f"invalid object key {key!r}: must be a relative '/'-separated path")
    for segment in key.split("/"):
        if not segment or segment.startswith("."):
            raise ValueError(f"invalid object key {key!r}: empty or '.'-prefixed path segment")
    return key


def check_put_args(size: int, sha256: str) -> None:
    """``ValueError`` unless ``size`` and ``sha256`` can describe an object."""
    if size < 0:
        raise ValueError(f"size must be >= 0, got {size}")
    if not _SHA256_HEX.fullmatch(sha256):
        raise ValueError("sha256 must be 64 lower-case hex digits")


def check_max_bytes(max_bytes: int) -> None:
    """``ValueError`` for a negative read limit."""
    if max_bytes < 0:
        raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")


def too_large(key: str, size: int, max_bytes: int) -> ContentInvalid:
    """The error for an object over the caller's ``max_bytes``."""
    return ContentInvalid(
        f"file over the maximum size: object {key!r} has {size} bytes, limit is {max_bytes}"
    )


def digest_pieces(key: str, pieces: Iterable[bytes], max_bytes: int) -> tuple[str, int]:
    """SHA-256 (hex) and size of the bytes ``pieces`` yield; ``ContentInvalid`` as soon as they
    pass ``max_bytes`` (the rest is not read)."""
    sha = hashlib.sha256()
    size = 0
    for piece in pieces:
        size += len(piece)
        if size > max_bytes:
            raise too_large(key, size, max_bytes)
        sha.update(piece)
    return sha.hexdigest(), size


class VerifyingReader:
    """Reads exactly ``size`` bytes from ``source`` and checks their SHA-256 at the end.

    The check fires on the read that delivers the last byte, i.e. before the store commits
    the object (the temp file is not renamed; minio has not sent the single part, or aborts
    the multipart upload), so a mismatching object never becomes visible.
    """

    def __init__(self, source: IO[bytes], size: int, sha256: str) -> None:
        self._source = source
        self._remaining = size
        self._size = size
        self._expected = sha256
        self._hash = hashlib.sha256()
        self._verified = False

    def read(self, n: int = -1) -> bytes:
        if self._remaining == 0:
            self._verify()
            return b""
        want = self._remaining if n is None or n < 0 else min(n, self._remaining)
        data = self._source.read(want)
        if not data:
            raise ValueError(
                f"stream ended after {self._size - self._remaining} of {self._size} bytes"
            )
        self._remaining -= len(data)
        self._hash.update(data)
        if self._remaining == 0:
            self._verify()
        return data

    def _verify(self) -> None:
        if not self._verified:
            if self._hash.hexdigest() != self._expected:
                raise ValueError("data does not match the sha256 it was put with")
            self._verified = True


def as_stream(data: bytes | BinaryIO) -> IO[bytes]:
    return io.BytesIO(data) if isinstance(data, bytes | bytearray | memoryview) else data
