"""The chaos run's faults: an embedding server that remembers which texts got an invalid
vector, a TCP proxy that cuts storage off, and :class:`Outages`, which starts and ends the
storage and PostgreSQL outages when they can meet a backlog of jobs."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import attrs

from testkit.chaos.plan import OUTAGES, OutagePlan
from testkit.embed_server import VECTOR_FAULTS, FakeEmbedServer
from testkit.postgres import EmbeddedServer
from testkit.processes import try_query


@attrs.frozen
class VectorFault:
    """One embedding request answered with an invalid vector."""

    at: float  # wall clock
    kind: str
    texts: tuple[str, ...] = attrs.field(repr=False)


class RecordingEmbedServer(FakeEmbedServer):
    """The fake TEI server, also remembering which texts were answered with an invalid vector.

    It hooks the two steps every embedding request takes in its handler thread, in this order:
    the request is recorded (with its texts), then its fault is drawn.
    """

    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        self._request = threading.local()
        self._fault_lock = threading.Lock()
        self._vector_faults: list[VectorFault] = []

    def _record_embedding(self, texts: list[str], payload: dict[str, Any]) -> None:
        super()._record_embedding(texts, payload)
        self._request.texts = tuple(texts)

    def _pick_fault(self, *, embedding: bool) -> tuple[str, float, float, threading.Event]:
        picked = super()._pick_fault(embedding=embedding)
        if embedding and picked[0] in VECTOR_FAULTS:
            texts = getattr(self._request, "texts", None)
            if texts is None:  # the hooks no longer fit the server: attribution would be wrong
                raise RuntimeError("RecordingEmbedServer: a fault was drawn for unknown texts")
            with self._fault_lock:
                self._vector_faults.append(VectorFault(time.time(), picked[0], texts))
        return picked

    def vector_faults(self) -> list[VectorFault]:
        with self._fault_lock:
            return list(self._vector_faults)


# ---------------------------------------------------------------------------------------------
# the storage outage: a TCP proxy that can reset everything


def _reset(sock: socket.socket) -> None:
    """Close with an RST instead of a FIN: the peer sees "connection reset"."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


class _Pipe:
    """One proxied connection: two pump threads; closed once, by whichever side ends first."""

    def __init__(
        self, client: socket.socket, upstream: socket.socket, on_close: Callable[[_Pipe], None]
    ) -> None:
        self._client = client
        self._upstream = upstream
        self._on_close = on_close
        self._lock = threading.Lock()
        self._closed = False

    def start(self) -> None:
        for src, dst in ((self._client, self._upstream), (self._upstream, self._client)):
            threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            self.close(reset=False)

    def close(self, *, reset: bool) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        # shutdown wakes the other pump thread blocked in recv(); SHUT_RD sends nothing, so the
        # close that follows is the client's only news: an RST when resetting.
        with contextlib.suppress(OSError):
            self._client.shutdown(socket.SHUT_RD if reset else socket.SHUT_RDWR)
        if reset:
            _reset(self._client)
        else:
            with contextlib.suppress(OSError):
                self._client.close()
        with contextlib.suppress(OSError):
            self._upstream.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._upstream.close()
        self._on_close(self)


class ToggleProxy:
    """A TCP proxy on 127.0.0.1 in front of ``upstream``; :meth:`set_down` cuts it off.

    While down, every open connection is reset and every new one is accepted and reset at once,
    so clients see connection resets while the upstream keeps its state.
    """

    def __init__(self, upstream: tuple[str, int]) -> None:
        self._upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self._lock = threading.Lock()
        self._down = False
        self._stopping = threading.Event()
        self._pipes: set[_Pipe] = set()
        self._thread = threading.Thread(target=self._accept_loop, name="s3-proxy", daemon=True)
        self.connections = 0
        self.reset_new = 0  # connections refused (accepted and reset) while down
        self.reset_open = 0  # open connections cut when the outage began

    @property
    def port(self) -> int:
        return int(self._listener.getsockname()[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join()
        self._listener.close()
        with self._lock:
            pipes = list(self._pipes)
        for pipe in pipes:
            pipe.close(reset=False)

    def set_down(self, down: bool) -> None:
        with self._lock:
            self._down = down
            pipes = list(self._pipes) if down else []
            self.reset_open += len(pipes)
        for pipe in pipes:
            pipe.close(reset=True)

    def _forget(self, pipe: _Pipe) -> None:
        with self._lock:
            self._pipes.discard(pipe)

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stopping.is_set():
                    return
                continue
            client.settimeout(None)
            with self._lock:
                self.connections += 1
                down = self._down
            if down:
                self._refuse(client)
                continue
            try:
                upstream = socket.create_connection(self._upstream, timeout=3)
            except OSError:
                _reset(client)
                continue
            upstream.settimeout(None)
            pipe = _Pipe(client, upstream, self._forget)
            with self._lock:
                down = self._down  # the outage may have begun while we connected
                if not down:
                    self._pipes.add(pipe)
            if down:
                upstream.close()
                self._refuse(client)
                continue
            pipe.start()

    def _refuse(self, client: socket.socket) -> None:
        with self._lock:
            self.reset_new += 1
        _reset(client)


@attrs.define(eq=False)
class Outages:
    """Begins each planned outage once it can meet a backlog (see :class:`OutagePlan`) and ends
    it after its length; ``happened`` lists ``(what, began, ended)`` in fault-phase seconds."""

    duration: float  # of the fault phase
    proxy: ToggleProxy
    pg: EmbeddedServer
    url: str  # the run's database, for the backlog counts
    clock: Callable[[], float]
    note: Callable[..., None]
    pending: list[OutagePlan] = attrs.Factory(lambda: list(OUTAGES))
    down: dict[OutagePlan, float] = attrs.Factory(dict)  # outage -> when it began
    happened: list[tuple[str, float, float]] = attrs.Factory(list)
    _backlog_checked: float = 0.0

    def _set_down(self, plan: OutagePlan, is_down: bool) -> None:
        if plan.what == "storage":
            self.proxy.set_down(is_down)
        elif is_down:
            self.pg.stop_now()
        else:
            self.pg.restart()

    def _backlog(self, plan: OutagePlan, now: float) -> int | None:
        if now < self._backlog_checked + 0.2:
            return None
        self._backlog_checked = now
        rows = try_query(self.url, plan.backlog_sql)
        return None if rows is None else int(rows[0]["n"])

    def tick(self, now: float, *, final: bool = False) -> None:
        """Begin and end outages as due; ``final`` begins what is left and waits out each."""
        for plan in list(self.pending):
            if now < plan.earliest * self.duration and not final:
                continue
            waiting = self._backlog(plan, now)
            if final or now >= plan.latest * self.duration or (waiting or 0) >= plan.backlog:
                self.pending.remove(plan)
                self._set_down(plan, True)
                self.down[plan] = self.clock()
                self.note(f"{plan.what} outage begins", backlog=waiting, means=plan.backlog_means)
        for plan, since in list(self.down.items()):
            if final or now >= since + plan.length(self.duration):
                if final:  # a phase too short for the plan still gets the whole outage
                    time.sleep(max(0.0, since + plan.length(self.duration) - self.clock()))
                del self.down[plan]
                self._set_down(plan, False)
                self.happened.append((plan.what, since, self.clock()))
                self.note(f"{plan.what} outage ends")
