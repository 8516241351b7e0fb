"""The upload body's spooling: a small body stays in memory, a large one goes to a private
temporary file, and either way the bytes, their hash and their size are what was sent."""

from __future__ import annotations

import hashlib
import tempfile
from typing import Any

import pytest
from starlette.requests import Request

from trioindex.http import upload
from trioindex.http.errors import ApiError
from trioindex.http.upload import WRITE_PIECE, spooled_body


def _request(body: bytes, piece: int = 64 * 1024) -> Request:
    parts = [body[i : i + piece] for i in range(0, len(body), piece)] or [b""]
    messages = [
        {"type": "http.request", "body": p, "more_body": i < len(parts) - 1}
        for i, p in enumerate(parts)
    ]

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    scope = {"type": "http", "method": "POST", "path": "/", "headers": [], "query_string": b""}
    return Request(scope, receive)


@pytest.fixture
def files_made(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    made: list[object] = []
    real = tempfile.TemporaryFile

    def counting(*args: Any, **kwargs: Any) -> Any:
        file = real(*args, **kwargs)
        made.append(file)
        return file

    monkeypatch.setattr(upload.tempfile, "TemporaryFile", counting)
    return made


@pytest.mark.parametrize("size", [0, 300, WRITE_PIECE - 1])
async def test_a_body_smaller_than_one_piece_is_spooled_without_a_file(
    size: int, files_made: list[object]
) -> None:
    data = bytes(i % 251 for i in range(size))
    async with spooled_body(_request(data), limit=10 * WRITE_PIECE) as body:
        assert (body.file.read(), body.sha256, body.size) == (
            data,
            hashlib.sha256(data).hexdigest(),
            size,
        )
    assert files_made == []


@pytest.mark.parametrize("size", [WRITE_PIECE, 3 * WRITE_PIECE + 17])
async def test_a_body_of_a_piece_or_more_goes_to_a_temporary_file_closed_after(
    size: int, files_made: list[Any]
) -> None:
    data = bytes(i % 253 for i in range(size))
    async with spooled_body(_request(data), limit=10 * WRITE_PIECE) as body:
        assert (body.file.read(), body.sha256, body.size) == (
            data,
            hashlib.sha256(data).hexdigest(),
            size,
        )
    assert len(files_made) == 1 and files_made[0].closed


async def test_a_small_body_over_the_limit_is_refused(files_made: list[object]) -> None:
    with pytest.raises(ApiError) as refused:
        async with spooled_body(_request(b"x" * 101, piece=10), limit=100):
            pass
    assert refused.value.status == 413 and files_made == []
