"""A loaded local model lent to the other processes of the same home over a unix socket, so
that ``search`` embeds its query in milliseconds instead of loading torch and the model.

A worker or a ``trioindex serve`` with the local model runs :func:`lend_model`
(:func:`lend_if_local`): it listens on ``HOME/warm/PID.sock``
(the folder mode 0700, the socket 0600, both owned by the worker's user) until it stops, and
removes the socket then. :func:`open_query_embedder` gives a searching process an
:class:`~trioindex.embedding.base.Embedder` that sends its query texts to the newest such
socket and, when there is none, or it is stale, not private to this user, or answers late or
wrong, loads the model itself (saying once, on stderr, how to make it fast). Only the
embedding crosses the socket; the search's SQL stays with the caller.

The protocol: one request and one answer per connection, each a 4-byte big-endian length and
a UTF-8 JSON object. The request is ``{"model", "dimension", "texts"}``; the answer is
``{"model", "dimension", "vectors"}`` (each vector base64 of little-endian binary32 values)
or ``{"error"}``. Each side checks the other's model name and dimension; the client also
checks the peer's user (``SO_PEERCRED``) and every vector (:func:`validate_vectors`). Nothing
of a text or a vector is ever logged.

This module imports no model code: a borrowing process never loads torch.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import socket
import stat
import struct
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Final

import attrs
import trio

from trioindex.embedding.base import Embedder, EmbedderInfo
from trioindex.embedding.vectors import Vectors, validate_vectors
from trioindex.errors import ResultInvalid

logger = logging.getLogger(__name__)

#: The folder of the home where lending processes put their sockets.
SOCKET_FOLDER: Final = "warm"
#: The most a borrower waits for one lender's answer (connecting included) before loading
#: the model itself; a worker busy encoding a batch of chunks answers after that batch.
ANSWER_TIMEOUT: Final = 3.0
#: The most a lender waits for a request once a client has connected.
REQUEST_TIMEOUT: Final = 10.0
#: The largest request or answer either side accepts, in bytes.
MAX_MESSAGE: Final = 16 * 2**20
#: Lenders a borrower tries, newest first, before it loads the model itself.
MAX_LENDERS: Final = 3
#: Connections a lender answers at once (the model itself encodes one batch at a time).
MAX_CONNECTIONS: Final = 16

_LENGTH = struct.Struct(">I")
#: How to make `search` fast, said once when a process loads the model for its searches.
HOW_TO_WARM: Final = (
    "a running `trioindex worker` of this home keeps the model loaded and answers searches"
    " in well under a second"
)


class WarmUnavailable(Exception):
    """No lender answered this request well; the message says why (never a text)."""


# --- the lender ----------------------------------------------------------------------------------


async def lend_model(
    home: Path,
    embedder: Embedder,
    *,
    task_status: trio.TaskStatus[Path | None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Answer other processes' embedding requests with ``embedder`` until cancelled, on a
    socket in ``home``'s warm folder (removed when this returns). A socket that cannot be made
    costs one warning and no lending; ``task_status`` is given its path, or None then."""
    try:
        listener, path = _listen(home / SOCKET_FOLDER)
    except (OSError, ValueError) as exc:
        logger.warning("warm model: not lent to search (%s)", exc)
        task_status.started(None)
        return
    identity = _identity(path)
    logger.info("warm model: lent to search on %s", path)
    limiter = trio.CapacityLimiter(MAX_CONNECTIONS)

    async def handle(stream: trio.SocketStream) -> None:
        async with limiter:
            await _answer(stream, embedder)

    try:
        async with trio.open_nursery() as nursery:
            task_status.started(path)
            await trio.serve_listeners(handle, [listener], handler_nursery=nursery)
    finally:
        _remove_if_ours(path, identity)


async def lend_if_local(
    api: str,
    home: Path,
    embedder: Embedder,
    *,
    task_status: trio.TaskStatus[Path | None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """:func:`lend_model` for a process that holds the local model (``api`` ``local``: the
    worker, ``trioindex serve``); with a server model (every process reaches the server
    itself) nothing is lent, ``task_status`` gets None and this returns at once."""
    if api != "local":
        task_status.started(None)
        return
    await lend_model(home, embedder, task_status=task_status)


def _listen(folder: Path) -> tuple[trio.SocketListener, Path]:
    """A listening socket ``folder/PID.sock`` (mode 0600) in a private ``folder``, after the
    sockets of lenders that are gone were removed."""
    folder.mkdir(mode=0o700, exist_ok=True)
    problem = _folder_problem(folder)
    if problem is not None:
        raise ValueError(problem)
    _remove_stale(folder)
    path = folder / f"{os.getpid()}.sock"
    if len(os.fsencode(path)) >= 108:  # sun_path's size on Linux, with its NUL
        raise ValueError(f"the socket path {path} is too long for a unix socket")
    path.unlink(missing_ok=True)  # a former process of this pid
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(os.fsdecode(path))  # in a folder only this user can enter
        os.chmod(path, 0o600)  # before listen: nobody has connected yet
        sock.listen(socket.SOMAXCONN)  # a full backlog would fail unix connects at once
    except BaseException:
        sock.close()
        path.unlink(missing_ok=True)
        raise
    return trio.SocketListener(trio.socket.from_stdlib_socket(sock)), path


def _remove_stale(folder: Path) -> None:
    """Remove this user's sockets in ``folder`` that nothing listens on any more."""
    for path in folder.glob("*.sock"):
        if _socket_problem(path) is not None:
            continue
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.settimeout(0.2)
            probe.connect(os.fsdecode(path))
        except (ConnectionRefusedError, FileNotFoundError):
            path.unlink(missing_ok=True)
        except OSError:
            pass
        finally:
            probe.close()


def _identity(path: Path) -> tuple[int, int]:
    st = path.lstat()
    return st.st_dev, st.st_ino


def _remove_if_ours(path: Path, identity: tuple[int, int]) -> None:
    try:
        if _identity(path) == identity:
            path.unlink()
    except FileNotFoundError:
        pass


async def _answer(stream: trio.SocketStream, embedder: Embedder) -> None:
    """Read one request, answer it, close: a request this lender cannot answer gets an
    ``{"error"}`` answer; a peer that goes away or sends garbage is dropped without a trace."""
    async with stream:
        try:
            if _peer_uid(stream.socket) not in (None, os.geteuid()):
                return
            with trio.fail_after(REQUEST_TIMEOUT):
                request = await _receive(stream)
            answer = await _embed_request(request, embedder)
            await stream.send_all(_frame(answer))
        except (trio.TooSlowError, trio.BrokenResourceError, OSError, WarmUnavailable):
            return


async def _embed_request(request: Any, embedder: Embedder) -> dict[str, Any]:
    info = embedder.info
    if not isinstance(request, dict):
        return {"error": "the request is not a JSON object"}
    texts = request.get("texts")
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        return {"error": "texts must be a list of strings"}
    if request.get("model") != info.model or request.get("dimension") != info.dimension:
        return {"error": f"this process serves {info.model} ({info.dimension} dimensions)"}
    try:
        vectors = await embedder.embed(texts)
    except Exception as exc:
        return {"error": f"embedding failed ({type(exc).__name__})"}
    packed = [base64.b64encode(vectors.little_endian(i)).decode() for i in range(len(vectors))]
    return {"model": info.model, "dimension": info.dimension, "vectors": packed}


# --- the borrower --------------------------------------------------------------------------------


async def borrow_vectors(path: Path, model: str, dimension: int, texts: Sequence[str]) -> Vectors:
    """``texts`` embedded by the lender at ``path``, checked; :class:`WarmUnavailable` when it
    is not private to this user, does not answer within :data:`ANSWER_TIMEOUT`, or answers
    anything but ``len(texts)`` valid vectors of ``model``."""
    problem = _socket_problem(path)
    if problem is not None:
        raise WarmUnavailable(problem)
    try:
        with trio.fail_after(ANSWER_TIMEOUT):
            stream = await trio.open_unix_socket(os.fsdecode(path))
            async with stream:
                if _peer_uid(stream.socket) not in (None, os.geteuid()):
                    raise WarmUnavailable(f"{path} is served by another user")
                request = {"model": model, "dimension": dimension, "texts": list(texts)}
                await stream.send_all(_frame(request))
                answer = await _receive(stream)
    except trio.TooSlowError:
        raise WarmUnavailable(f"{path} did not answer within {ANSWER_TIMEOUT:g} s") from None
    except (ConnectionRefusedError, FileNotFoundError):
        raise WarmUnavailable(f"{path} is stale (nothing listens on it)") from None
    except (OSError, trio.BrokenResourceError) as exc:
        raise WarmUnavailable(f"{path}: {type(exc).__name__}") from None
    return _checked_answer(path, answer, model, dimension, len(texts))


def _checked_answer(path: Path, answer: Any, model: str, dimension: int, count: int) -> Vectors:
    if not isinstance(answer, dict):
        raise WarmUnavailable(f"{path} answered something that is not a JSON object")
    if "error" in answer:
        error = answer["error"]
        raise WarmUnavailable(f"{path} refused: {error if isinstance(error, str) else '?'}"[:300])
    if answer.get("model") != model or answer.get("dimension") != dimension:
        raise WarmUnavailable(f"{path} serves another model than {model} ({dimension} dimensions)")
    try:
        return validate_vectors(
            answer.get("vectors"), expected_count=count, dimension=dimension, base64_allowed=True
        )
    except ResultInvalid as exc:
        raise WarmUnavailable(f"{path} answered wrong vectors: {exc}") from None


def lenders(home: Path) -> list[Path]:
    """The sockets of ``home``'s warm folder, newest first (at most :data:`MAX_LENDERS`); none
    when the folder is not private to this user."""
    folder = home / SOCKET_FOLDER
    try:
        if _folder_problem(folder) is not None:
            return []
        found = [(p.lstat().st_mtime, p) for p in folder.glob("*.sock")]
    except OSError:
        return []
    return [p for _, p in sorted(found, reverse=True)[:MAX_LENDERS]]


@attrs.define(eq=False)
class BorrowingEmbedder:
    """An :class:`~trioindex.embedding.base.Embedder` for queries that borrows a lender's
    model (:func:`borrow_vectors`, each of ``sockets`` in turn) and, the first time none
    answers well, opens its own (``open_own``) and keeps it for the rest of its life."""

    _sockets: list[Path]
    _info: EmbedderInfo
    _open_own: Callable[[], Awaitable[Embedder]]
    _own: Embedder | None = None
    _lock: trio.Lock = attrs.field(factory=trio.Lock)

    @property
    def info(self) -> EmbedderInfo:
        return self._info

    async def embed(self, texts: Sequence[str]) -> Vectors:
        if self._own is None and self._sockets:
            assert self._info.dimension is not None
            reasons = []
            for path in self._sockets:
                try:
                    return await borrow_vectors(path, self._info.model, self._info.dimension, texts)
                except WarmUnavailable as exc:
                    reasons.append(str(exc))
            self._sockets = []  # said once: from now on this process embeds with its own model
            logger.warning(
                "search: loading the model in this process (%s); %s",
                "; ".join(reasons),
                HOW_TO_WARM,
            )
        return await (await self._own_embedder()).embed(texts)

    async def _own_embedder(self) -> Embedder:
        async with self._lock:
            if self._own is None:
                self._own = await self._open_own()
            return self._own

    async def aclose(self) -> None:
        if self._own is not None:
            own, self._own = self._own, None
            await own.aclose()


async def open_query_embedder(
    home: Path, info: EmbedderInfo, open_own: Callable[[], Awaitable[Embedder]]
) -> Embedder:
    """The embedder a searching process uses: one that borrows the model of a lender in
    ``home`` when there is one (falling back to ``open_own``), else ``open_own()`` at once,
    said once on stderr with how to make it fast."""
    sockets = lenders(home)
    if sockets:
        return BorrowingEmbedder(sockets, info, open_own)
    logger.warning("search: loading the model in this process; %s", HOW_TO_WARM)
    return await open_own()


# --- shared --------------------------------------------------------------------------------------


def _frame(message: dict[str, Any]) -> bytes:
    body = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode(
        "utf-8", "surrogatepass"
    )
    return _LENGTH.pack(len(body)) + body


async def _receive(stream: trio.SocketStream) -> Any:
    """One framed JSON message; :class:`WarmUnavailable` for a frame that is too long, cut
    short, or not JSON."""
    (length,) = _LENGTH.unpack(await _receive_exactly(stream, _LENGTH.size))
    if length > MAX_MESSAGE:
        raise WarmUnavailable(f"a message of {length:,} bytes (the limit is {MAX_MESSAGE:,})")
    body = await _receive_exactly(stream, length)
    try:
        return json.loads(body.decode("utf-8", "surrogatepass"))
    except ValueError:
        raise WarmUnavailable("a message that is not JSON") from None


async def _receive_exactly(stream: trio.SocketStream, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = await stream.receive_some(min(size - len(data), 2**20))
        if not chunk:
            raise WarmUnavailable("the connection closed mid-message")
        data += chunk
    return bytes(data)


def _peer_uid(sock: trio.socket.SocketType) -> int | None:
    """The user of the process at the other end (None where the platform cannot say)."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, option, 12))
    return int(uid)


def _folder_problem(folder: Path) -> str | None:
    st = folder.lstat()
    if not stat.S_ISDIR(st.st_mode):
        return f"{folder} is not a folder"
    return _private_problem(folder, st)


def _socket_problem(path: Path) -> str | None:
    try:
        st = path.lstat()
    except FileNotFoundError:
        return f"{path} is gone"
    if not stat.S_ISSOCK(st.st_mode):
        return f"{path} is not a socket"
    return _private_problem(path, st)


def _private_problem(path: Path, st: os.stat_result) -> str | None:
    """Why ``path`` is not this user's alone (another owner, or open to group or others)."""
    if st.st_uid != os.geteuid():
        return f"{path} belongs to another user"
    if st.st_mode & 0o077:
        return f"{path} is open to other users (mode {stat.S_IMODE(st.st_mode):o})"
    return None
