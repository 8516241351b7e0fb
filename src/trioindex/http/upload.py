"""A request body spooled and hashed as it arrives: kept in memory when it is smaller than
one piece, else streamed to a private temporary file.

Objects are stored under the hash of their bytes (``sha256/ab/<hash>``), so the hash must be
known before the object is named. The body is gathered in pieces of :data:`WRITE_PIECE`
bytes; a body that ends before its first piece is full stays that piece (no file, no worker
thread: most uploads are small). From the first full piece on, the body goes to an anonymous
temporary file (deleted when closed, never named on disk), each piece hashed and written in a
worker thread, and the store then reads the file. Memory holds one piece, however large the
document; a body over ``limit`` is refused as soon as it passes it (413
``document_too_large``), or before a byte is read when its ``Content-Length`` says so.
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
    """The body on disk (``file``, at its start), its SHA-256 and its size."""

    file: BinaryIO
    sha256: str
    size: int


def _write(file: BinaryIO, sha: hashlib._Hash, piece: bytearray) -> None:
    sha.update(piece)
    file.write(piece)


@asynccontextmanager
async def spooled_body(request: Request, *, limit: int) -> AsyncIterator[Spooled]:
    """The body of ``request`` in memory or a temporary file for the block; gone after."""
    declared_length(request, limit, TOO_LARGE)
    file: BinaryIO | None = None
    try:
        sha = hashlib.sha256()
        size = 0
        piece = bytearray()
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_large(TOO_LARGE, limit)
            piece += chunk
            if len(piece) >= WRITE_PIECE:
                if file is None:
                    file = await trio.to_thread.run_sync(tempfile.TemporaryFile)
                await trio.to_thread.run_sync(_write, file, sha, piece)
                piece.clear()
        if file is None:
            sha.update(piece)
            yield Spooled(io.BytesIO(piece), sha.hexdigest(), size)
            return
        await trio.to_thread.run_sync(_write, file, sha, piece)
        await trio.to_thread.run_sync(file.flush)
        file.seek(0)
        yield Spooled(file, sha.hexdigest(), size)
    finally:
        if file is not None:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(file.close)
