"""A model lent over a unix socket in the home (trioindex.embedding.warm): a lender answers
borrowers with its vectors; a borrower refuses a socket that is not private to its user, and
falls back to its own model within the timeout when a lender is gone, stale, late or wrong.

Every server here is a Trio task of the test itself, on a real unix socket; the slow cases run
on the virtual clock (autojump_clock).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import struct
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import trio
import trio.testing

from testkit.embed_server import fake_vector
from tests.helpers import FakeEmbedder
from trioindex.embedding import Embedder, EmbedderInfo
from trioindex.embedding.vectors import Vectors
from trioindex.embedding.warm import (
    ANSWER_TIMEOUT,
    HOW_TO_WARM,
    SOCKET_FOLDER,
    BorrowingEmbedder,
    WarmUnavailable,
    borrow_vectors,
    lend_if_local,
    lend_model,
    lenders,
    open_query_embedder,
)

MODEL, DIM = "test-model", 4
INFO = EmbedderInfo.configured(MODEL, DIM, 32)


@pytest.fixture
def home() -> Iterator[Path]:
    """A home with a short path (a unix socket's path has at most 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="tw-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


class OwnModel:
    """``open_own`` for a borrower: counts how often the process loaded its own model."""

    def __init__(self) -> None:
        self.opened = 0
        self.embedder = FakeEmbedder(dimension=DIM, model=MODEL)

    async def __call__(self) -> Embedder:
        self.opened += 1
        return self.embedder


def close_to(vectors: Vectors, texts: list[str]) -> bool:
    return all(
        v == pytest.approx(fake_vector(t, DIM), abs=1e-6)
        for v, t in zip(vectors.tolist(), texts, strict=True)
    )


async def test_a_lent_model_embeds_a_borrowers_queries(home: Path) -> None:
    lender = FakeEmbedder(dimension=DIM, model=MODEL)
    async with trio.open_nursery() as nursery:
        path = await nursery.start(lend_model, home, lender)
        assert path == home / SOCKET_FOLDER / f"{os.getpid()}.sock"
        assert oct(path.stat().st_mode & 0o777) == oct(0o600)
        assert oct(path.parent.stat().st_mode & 0o777) == oct(0o700)
        assert lenders(home) == [path]
        own = OwnModel()
        borrowing = await open_query_embedder(home, INFO, own)
        assert isinstance(borrowing, BorrowingEmbedder)
        texts = ["how do workers share a queue", "임대는 갱신됩니다", ""]
        assert close_to(await borrowing.embed(texts), texts)
        assert (own.opened, lender.texts) == (0, 3)
        nursery.cancel_scope.cancel()
    assert not path.exists()  # removed when the lender stops


async def test_concurrent_borrowers_each_get_their_own_vectors(home: Path) -> None:
    lender = FakeEmbedder(dimension=DIM, model=MODEL)
    answers: dict[int, Vectors] = {}

    async def borrow(path: Path, i: int) -> None:
        answers[i] = await borrow_vectors(path, MODEL, DIM, [f"query {i}", f"other {i}"])

    async with trio.open_nursery() as nursery:
        path = await nursery.start(lend_model, home, lender)
        async with trio.open_nursery() as clients:
            for i in range(40):
                clients.start_soon(borrow, path, i)
        nursery.cancel_scope.cancel()
    assert sorted(answers) == list(range(40))
    assert all(close_to(answers[i], [f"query {i}", f"other {i}"]) for i in answers)


async def test_without_a_lender_the_model_is_loaded_and_how_to_be_fast_is_said(
    home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    own = OwnModel()
    with caplog.at_level(logging.WARNING):
        embedder = await open_query_embedder(home, INFO, own)
    assert embedder is own.embedder and own.opened == 1
    assert [r.getMessage() for r in caplog.records] == [
        f"search: loading the model in this process; {HOW_TO_WARM}"
    ]


def bound_socket(path: Path, mode: int = 0o600) -> socket.socket:
    path.parent.mkdir(mode=0o700, exist_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    os.chmod(path, mode)
    return sock


async def fallback_reason(home: Path, caplog: pytest.LogCaptureFixture) -> str:
    """Embed through a borrower; assert it fell back to its own model once, saying so once
    (twice asked); the reason it gave."""
    own = OwnModel()
    embedder = await open_query_embedder(home, INFO, own)
    with caplog.at_level(logging.WARNING):
        assert close_to(await embedder.embed(["a query"]), ["a query"])
        assert close_to(await embedder.embed(["again"]), ["again"])
    assert own.opened == 1
    (record,) = caplog.records
    message = record.getMessage()
    assert message.startswith("search: loading the model in this process (")
    assert message.endswith(HOW_TO_WARM)
    assert "a query" not in message
    return message


async def test_a_stale_socket_falls_back_and_is_removed_by_the_next_lender(
    home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stale = home / SOCKET_FOLDER / "999999.sock"
    bound_socket(stale).close()  # a lender killed without cleaning up
    assert "is stale (nothing listens on it)" in await fallback_reason(home, caplog)
    async with trio.open_nursery() as nursery:
        await nursery.start(lend_model, home, FakeEmbedder(dimension=DIM, model=MODEL))
        assert not stale.exists()
        nursery.cancel_scope.cancel()


async def test_a_socket_open_to_other_users_is_refused(
    home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with trio.open_nursery() as nursery:
        path = await nursery.start(lend_model, home, FakeEmbedder(dimension=DIM, model=MODEL))
        os.chmod(path, 0o666)
        assert "is open to other users (mode 666)" in await fallback_reason(home, caplog)
        nursery.cancel_scope.cancel()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
async def test_a_socket_of_another_user_is_refused(
    home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with trio.open_nursery() as nursery:
        path = await nursery.start(lend_model, home, FakeEmbedder(dimension=DIM, model=MODEL))
        os.chown(path, 65534, 65534)
        assert "belongs to another user" in await fallback_reason(home, caplog)
        nursery.cancel_scope.cancel()


async def test_a_warm_folder_open_to_others_lends_nothing_and_is_not_read(
    home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = home / SOCKET_FOLDER
    folder.mkdir(mode=0o700)
    os.chmod(folder, 0o777)
    async with trio.open_nursery() as nursery:
        with caplog.at_level(logging.WARNING):
            lent = await nursery.start(lend_model, home, FakeEmbedder(dimension=DIM, model=MODEL))
    assert lent is None
    assert "is open to other users (mode 777)" in caplog.records[-1].getMessage()
    assert lenders(home) == []


async def test_a_socket_path_too_long_lends_nothing(caplog: pytest.LogCaptureFixture) -> None:
    deep = Path(tempfile.mkdtemp(prefix="tw-", dir="/tmp"))
    try:
        home = deep / ("h" * 100)
        home.mkdir()
        async with trio.open_nursery() as nursery:
            with caplog.at_level(logging.WARNING):
                lent = await nursery.start(lend_model, home, FakeEmbedder())
        assert lent is None
        assert "too long for a unix socket" in caplog.records[-1].getMessage()
    finally:
        shutil.rmtree(deep)


Reply = Callable[[trio.SocketStream], Awaitable[None]]


async def serve_raw(
    path: Path, reply: Reply, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """A hostile lender at ``path``: reads whatever comes and runs ``reply``."""
    sock = bound_socket(path)
    sock.listen(8)
    listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))

    async def handle(stream: trio.SocketStream) -> None:
        async with stream:
            await stream.receive_some(65536)
            await reply(stream)

    async with trio.open_nursery() as nursery:
        task_status.started()
        await trio.serve_listeners(handle, [listener], handler_nursery=nursery)


def framed(message: object) -> bytes:
    body = json.dumps(message).encode()
    return struct.pack(">I", len(body)) + body


async def send(data: bytes) -> Reply:
    async def reply(stream: trio.SocketStream) -> None:
        await stream.send_all(data)

    return reply


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        # the first 4 bytes, b"garb", are read as a length far over the limit
        (b"garbage, not a frame at all", "the limit is"),
        (struct.pack(">I", 10) + b"not json!!", "a message that is not JSON"),
        (struct.pack(">I", 100) + b"cut", "closed mid-message"),
        (framed([1, 2]), "not a JSON object"),
        (framed({"error": "busy"}), "refused: busy"),
        (framed({"model": "other", "dimension": DIM, "vectors": [[1, 0, 0, 0]]}), "another model"),
        (
            framed({"model": MODEL, "dimension": DIM, "vectors": [[1.0, 0.0]]}),
            "has dimension 2, expected 4",
        ),
        (framed({"model": MODEL, "dimension": DIM, "vectors": []}), "0 vectors for 1 inputs"),
        (framed({"model": MODEL, "dimension": DIM, "vectors": [[1, 2, "x", 4]]}), "wrong vectors"),
    ],
    ids=["garbage", "not-json", "cut", "list", "error", "model", "length", "count", "type"],
)
async def test_a_lender_answering_wrong_is_left_for_the_own_model(
    home: Path, caplog: pytest.LogCaptureFixture, answer: bytes, reason: str
) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_raw, home / SOCKET_FOLDER / "1.sock", await send(answer))
        message = await fallback_reason(home, caplog)
        assert reason in message
        nursery.cancel_scope.cancel()


async def test_a_lender_that_never_answers_is_given_up_after_the_timeout(
    home: Path, caplog: pytest.LogCaptureFixture, autojump_clock: trio.testing.MockClock
) -> None:
    async def never(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        await nursery.start(serve_raw, home / SOCKET_FOLDER / "1.sock", never)
        started = trio.current_time()
        with pytest.raises(WarmUnavailable, match=f"did not answer within {ANSWER_TIMEOUT:g} s"):
            await borrow_vectors(home / SOCKET_FOLDER / "1.sock", MODEL, DIM, ["q"])
        assert trio.current_time() - started == pytest.approx(ANSWER_TIMEOUT)
        assert "did not answer" in await fallback_reason(home, caplog)
        nursery.cancel_scope.cancel()


async def test_a_lender_of_another_model_refuses(home: Path) -> None:
    other = FakeEmbedder(dimension=8, model="another-model")
    async with trio.open_nursery() as nursery:
        path = await nursery.start(lend_model, home, other)
        with pytest.raises(WarmUnavailable, match=r"refused: this process serves another-model"):
            await borrow_vectors(path, MODEL, DIM, ["q"])
        assert other.calls == 0
        nursery.cancel_scope.cancel()


async def test_a_stale_socket_beside_a_live_lender_costs_nothing(home: Path) -> None:
    lender = FakeEmbedder(dimension=DIM, model=MODEL)
    async with trio.open_nursery() as nursery:
        path = await nursery.start(lend_model, home, lender)
        stale = home / SOCKET_FOLDER / "999999.sock"
        bound_socket(stale).close()
        os.utime(path, (1, 1))  # the stale one is the newest: tried first
        assert lenders(home) == [stale, path]
        own = OwnModel()
        embedder = await open_query_embedder(home, INFO, own)
        assert close_to(await embedder.embed(["q"]), ["q"])
        assert (own.opened, lender.calls) == (0, 1)
        nursery.cancel_scope.cancel()


async def test_a_server_model_is_not_lent_and_the_local_one_is(home: Path) -> None:
    lender = FakeEmbedder(dimension=DIM, model=MODEL)
    async with trio.open_nursery() as nursery:
        assert await nursery.start(lend_if_local, "tei", home, lender) is None
        assert lenders(home) == []  # every process reaches a server model itself
        path = await nursery.start(lend_if_local, "local", home, lender)
        assert lenders(home) == [path]
        nursery.cancel_scope.cancel()
