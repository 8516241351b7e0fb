"""A body spooled and hashed as it arrives: kept in memory when it is smaller than one piece,
else streamed to a private temporary file.

Objects are stored under the hash of their bytes (``sha256/ab/<hash>``), so the hash must be
known before the object is named. The body is gathered in pieces of :data:`WRITE_PIECE`
bytes; a body that ends before its first piece is full stays that piece (no file, no worker
thread: most uploads are small). From the first full piece on, the body goes to an anonymous
temporary file (deleted when closed, never named on disk), each piece hashed and written in a
worker thread, and the store then reads the file. Memory holds one piece, however large the
document; a body over ``limit`` is refused as soon as it passes it (413
``document_too_large``), or before a byte is read when its ``Content-Length`` says so.

:class:`Spool` is one body fed piece by piece (a part of a batch upload);
:func:`spooled_body` spools a whole request body with it.
"""

from __future__ import annotations

import hashlib
import io
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import BinaryIO, Final

import attrs
import trio
from starlette.requests import Request

from trioindex.http.limits import declared_length, too_large

WRITE_PIECE: Final = 1 << 20
TOO_LARGE: Final = "document_too_large"


@attrs.frozen
class Spooled:
    """The body in memory or on disk (``file``, at its start), its SHA-256 and its size;
    ``in_memory``: ``file`` is a :class:`io.BytesIO` (no file to close)."""

    file: BinaryIO
    sha256: str
    size: int
    in_memory: bool = True


def _write(file: BinaryIO, sha: hashlib._Hash, piece: bytearray) -> None:
    sha.update(piece)
    file.write(piece)


class Spool:
    """One body fed with :meth:`add`, ended with :meth:`finish`; :meth:`aclose` removes its
    temporary file, if it made one (call it however the body ended)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.size = 0
        self._sha = hashlib.sha256()
        self._piece = bytearray()
        self._file: BinaryIO | None = None

    async def add(self, chunk: bytes) -> None:
        """Take the next bytes; 413 ``document_too_large`` once the body passes the limit."""
        self.size += len(chunk)
        if self.size > self.limit:
            raise too_large(TOO_LARGE, self.limit)
        self._piece += chunk
        if len(self._piece) >= WRITE_PIECE:
            if self._file is None:
                self._file = await trio.to_thread.run_sync(tempfile.TemporaryFile)
            await trio.to_thread.run_sync(_write, self._file, self._sha, self._piece)
            self._piece.clear()

    async def finish(self) -> Spooled:
        """The whole body, at its start."""
        if self._file is None:
            self._sha.update(self._piece)
            return Spooled(io.BytesIO(self._piece), self._sha.hexdigest(), self.size)
        await trio.to_thread.run_sync(_write, self._file, self._sha, self._piece)
        await trio.to_thread.run_sync(self._file.flush)
        self._piece.clear()
        self._file.seek(0)
        return Spooled(self._file, self._sha.hexdigest(), self.size, in_memory=False)

    async def aclose(self) -> None:
        if self._file is not None:
            file, self._file = self._file, None
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(file.close)


@asynccontextmanager
async def spooled_body(request: Request, *, limit: int) -> AsyncIterator[Spooled]:
    """The body of ``request`` in memory or a temporary file for the block; gone after."""
    declared_length(request, limit, TOO_LARGE)
    spool = Spool(limit)
    try:
        async for chunk in request.stream():
            await spool.add(chunk)
        yield await spool.finish()
    finally:
        await spool.aclose()
