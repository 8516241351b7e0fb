"""A fault-injecting embedding server on 127.0.0.1, for tests, benchmarks and the chaos run.

(The pytest fixture ``embed_server`` that starts one per test is in tests/fixtures/embed.py.)

It speaks the three endpoints the clients use: ``GET /info`` and ``POST /embed`` (TEI) and
``POST /v1/embeddings`` (OpenAI-compatible, ``data`` shuffled by default so clients must order by
``index``; vectors as base64 of little-endian float32 when the request's ``encoding_format`` is
``"base64"``, as OpenAI's API does, else as JSON numbers). ``/info`` reports what TEI 1.8's does,
``auto_truncate: false`` and a ``version`` (``tei_version``) included, so the TEI client asks
the OpenAI-compatible route; ``auto_truncate``, ``tei_version`` and ``openai_route=False`` (that
route answers 404) make it a server the client must ask on ``/embed``. Vectors are deterministic unit
vectors of float32 values seeded by a hash of the text (:func:`fake_vector`), so a test can
check every vector and its order; as JSON numbers they are written as TEI writes them
(:func:`floats_json`).

Modes, set per test with :meth:`FakeEmbedServer.set_mode` (thread-safe; applies to the following
requests):

==================  =====================================================================
``normal``          correct answers
``slow``            answers after ``latency`` extra seconds
``hang``            never answers (until the mode changes or the server stops), then drops
``status_N``        HTTP N (500, 503, 429, 424, 413, 422, 400, ...) with a TEI-style error body
``malformed``       200 with a body that is not JSON
``null_vector``     one vector is ``null``
``wrong_count``     one vector too few
``wrong_dimension`` one vector one element short
``nan``             one element is ``NaN``
``infinity``        one element is ``Infinity``
``disconnect``      closes the connection without an answer
==================  =====================================================================

``status_N``, ``hang``, ``slow``, ``malformed`` and ``disconnect`` also apply to ``/info``. For the
chaos run, :meth:`FakeEmbedServer.set_fault_rates` injects these kinds at random into embedding
requests (``{"status_503": 0.05, "nan": 0.01, ...}``, seeded) while the mode is ``normal``.

Limits: ``max_batch_size`` is reported as ``max_client_batch_size`` and a larger request gets 413,
as TEI does. ``max_input_length`` is reported as is (8192 when not set); given a ``tokenizer``
too, it is enforced as TEI does with ``truncate: false``: a request holding an input of more
tokens (special tokens included) gets HTTP 413 with TEI's body, ``{"error": "Input validation
error: `inputs` must have less than 512 tokens. Given: 2358", "error_type": "Validation"}`` on
``/embed`` and ``{"message": ..., "code": 413, "type": "Validation"}`` on ``/v1/embeddings``
(TEI's OpenAI-compatible route), counted as ``too_long``. ``latency`` is a fixed per-request
delay (capacity = batch / latency per connection).
Normal bodies are built from cached per-text JSON, so the server stays far cheaper than the client.
Every request is counted (:meth:`FakeEmbedServer.stats`), so a test can assert that none was made.

Standalone::

    python -m testkit.embed_server --port 8089 --dimension 1024 --latency-ms 20 \\
        --fault-rate status_503=0.02 --fault-rate nan=0.005 --seed 7

(``--max-input-length 512 --tokenizer path/to/tokenizer.json`` enforces an input limit)
prints ``embed_server listening on http://127.0.0.1:PORT``, serves until SIGINT/SIGTERM, then
prints its stats as one JSON line. A running server is steered over HTTP: ``POST /_fake/mode``
``{"kind": "hang"}``, ``POST /_fake/fault-rates`` ``{"rates": {...}, "seed": 1}``,
``POST /_fake/reset-stats``, ``GET /_fake/stats`` (these requests are not counted). A random
``slow`` fault adds one second; a ``hang`` lasts ``--hang-seconds`` at most.
"""

from __future__ import annotations

import argparse
import base64
import functools
import hashlib
import json
import math
import random
import re
import signal
import sys
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler
from types import FrameType, TracebackType
from typing import Any

import attrs
import numpy as np
import orjson
from tokenizers import Tokenizer

from testkit.loopback_http import LoopbackHTTPServer

VECTOR_FAULTS = ("null_vector", "wrong_count", "wrong_dimension", "nan", "infinity")
TRANSPORT_FAULTS = ("slow", "hang", "malformed", "disconnect")
KINDS = ("normal", *TRANSPORT_FAULTS, *VECTOR_FAULTS)
_STATUS_KIND = re.compile(r"status_([1-5][0-9][0-9])")
#: Every error body carries this, so tests can check that no body reaches an error message.
BODY_MARKER = "FAKE-SERVER-ERROR-BODY"
# The TEI release whose ``/info`` the fake's imitates (its OpenAI-compatible route answers base64).
TEI_VERSION = "1.8.3"


def fake_vector(text: str, dimension: int) -> list[float]:
    """The deterministic unit vector the server answers for ``text``: float32 values (as a
    model served by TEI computes them), as Python floats."""
    seed = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")
    values = np.random.default_rng(seed).standard_normal(dimension)
    result: list[float] = (values / np.linalg.norm(values)).astype(np.float32).tolist()
    return result


def floats_json(vector: list[float]) -> str:
    """``vector`` as a JSON array the way TEI writes it: each value rounded to float32 and
    written in the shortest form that reads back as that float32 (serde_json's ``f32``,
    through ryu: ``0.012345679``, ``0.00001``, ``1.2345679e-7``; 9 significant digits at
    most), about half the bytes of Python's float64 ``repr``. A NaN or an infinity (the
    hostile answers below; TEI never sends one) is written as Python's bare token."""
    if not all(map(math.isfinite, vector)):
        return json.dumps(vector)
    # orjson writes a float32 array in ryu's shortest form (its only difference from
    # serde_json, "e+" before exponents of 16 and more, is out of a unit vector's range)
    return orjson.dumps(
        np.asarray(vector, dtype=np.float32), option=orjson.OPT_SERIALIZE_NUMPY
    ).decode()


# Enough for the largest benchmark's texts (bench.peer at 20,000), each format cached apart: a
# smaller cache re-encodes every text of such a run, and the float format costs the mock ~4x
# the base64 one, which charged a float-asking client for the mock's CPU on the shared cores.
VECTOR_CACHE_TEXTS = 32_768


@functools.lru_cache(maxsize=VECTOR_CACHE_TEXTS)
def _vector_json(text: str, dimension: int) -> str:
    return floats_json(fake_vector(text, dimension))


def base64_json(vector: list[float]) -> str:
    """A vector as the OpenAI API's ``encoding_format: "base64"`` sends it: a JSON string of
    base64 over little-endian float32."""
    return json.dumps(base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode())


@functools.lru_cache(maxsize=VECTOR_CACHE_TEXTS)
def _vector_base64_json(text: str, dimension: int) -> str:
    return base64_json(fake_vector(text, dimension))


def check_kind(kind: str) -> str:
    """``kind`` if it is a known mode / fault kind, else ValueError."""
    if kind in KINDS or _STATUS_KIND.fullmatch(kind):
        return kind
    raise ValueError(f"unknown fake embedding server mode {kind!r}")


@attrs.frozen
class ServerStats:
    """Counters since start (or the last :meth:`FakeEmbedServer.reset_stats`)."""

    requests: int  # every request but /_fake/*
    info_requests: int
    embed_requests: int  # /embed + /v1/embeddings
    inputs: int  # texts received in embedding requests
    batch_sizes: tuple[int, ...]  # texts per embedding request, in arrival order
    max_concurrent: int  # most requests being handled at the same time
    faults: Mapping[str, int]  # injected faults by kind
    too_long: int  # requests refused for an input over max_input_length
    last_authorization: str | None
    last_payload: Mapping[str, Any] | None  # the last embedding request body


@attrs.define(eq=False)
class _State:
    dimension: int
    latency: float
    max_batch_size: int | None
    max_batch_tokens: int | None
    max_input_length: int | None
    tokenizer: Tokenizer | None
    model_id: str
    info_enabled: bool
    shuffle: bool
    hang_seconds: float
    tei_version: str
    auto_truncate: bool
    openai_route: bool
    mode: str = "normal"
    mode_latency: float = 0.0
    fault_rates: dict[str, float] = attrs.Factory(dict)
    fault_rng: random.Random = attrs.Factory(lambda: random.Random(0))
    shuffle_rng: random.Random = attrs.Factory(lambda: random.Random(0))
    # Counters.
    requests: int = 0
    info_requests: int = 0
    embed_requests: int = 0
    inputs: int = 0
    batch_sizes: list[int] = attrs.Factory(list)
    active: int = 0
    max_concurrent: int = 0
    faults: dict[str, int] = attrs.Factory(dict)
    too_long: int = 0
    last_authorization: str | None = None
    last_payload: dict[str, Any] | None = None


class FakeEmbedServer:
    """A real HTTP server on 127.0.0.1 in a background thread (``with`` starts and stops it)."""

    def __init__(
        self,
        *,
        dimension: int = 1024,
        latency: float = 0.0,
        max_batch_size: int | None = None,
        max_batch_tokens: int | None = None,
        max_input_length: int | None = None,
        tokenizer: Tokenizer | None = None,
        model_id: str = "BAAI/bge-m3",
        info_enabled: bool = True,
        shuffle: bool = True,
        hang_seconds: float = 3600.0,
        tei_version: str = TEI_VERSION,
        auto_truncate: bool = False,
        openai_route: bool = True,
        fault_rates: Mapping[str, float] | None = None,
        seed: int = 0,
        port: int = 0,
    ) -> None:
        self._lock = threading.Lock()
        # Set on stop and on every mode change: wakes hanging and sleeping handlers.
        self._wake = threading.Event()
        self._state = _State(
            dimension=dimension,
            latency=latency,
            max_batch_size=max_batch_size,
            max_batch_tokens=max_batch_tokens,
            max_input_length=max_input_length,
            tokenizer=_counting(tokenizer),
            model_id=model_id,
            info_enabled=info_enabled,
            shuffle=shuffle,
            hang_seconds=hang_seconds,
            tei_version=tei_version,
            auto_truncate=auto_truncate,
            openai_route=openai_route,
            shuffle_rng=random.Random(seed),
        )
        if fault_rates:
            self.set_fault_rates(fault_rates, seed=seed)
        self._httpd = _HTTPServer(("127.0.0.1", port), _Handler)
        self._httpd.fake = self
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def dimension(self) -> int:
        with self._lock:
            return self._state.dimension

    def start(self) -> FakeEmbedServer:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.01},  # stop() waits up to this long
            name=f"fake-embed-server-{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> FakeEmbedServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- steering --------------------------------------------------------------------------

    def set_mode(self, kind: str, *, status: int | None = None, latency: float = 0.0) -> None:
        """Switch every following request to ``kind`` (``set_mode("status", status=503)`` is
        ``set_mode("status_503")``); wakes requests hanging in the previous mode."""
        if kind == "status":
            if status is None:
                raise ValueError("mode 'status' needs a status code")
            kind = f"status_{status}"
        check_kind(kind)
        with self._lock:
            self._state.mode = kind
            self._state.mode_latency = latency if kind == "slow" else 0.0
            old_wake, self._wake = self._wake, threading.Event()
        old_wake.set()

    def set_fault_rates(self, rates: Mapping[str, float], *, seed: int = 0) -> None:
        """Inject each fault kind into that fraction of embedding requests (mode ``normal``)."""
        for kind, rate in rates.items():
            if check_kind(kind) == "normal" or not 0.0 <= rate <= 1.0:
                raise ValueError(f"bad fault rate {kind}={rate}")
        if sum(rates.values()) > 1.0:
            raise ValueError("fault rates add up to more than 1")
        with self._lock:
            self._state.fault_rates = dict(rates)
            self._state.fault_rng = random.Random(seed)

    def configure(self, **settings: Any) -> None:
        """Change ``dimension``, ``latency``, ``max_batch_size``, ``max_batch_tokens``,
        ``max_input_length``, ``tokenizer``, ``model_id``, ``info_enabled``, ``shuffle``,
        ``hang_seconds``, ``tei_version``, ``auto_truncate`` or ``openai_route``."""
        allowed = {
            "dimension",
            "latency",
            "max_batch_size",
            "max_batch_tokens",
            "max_input_length",
            "tokenizer",
            "model_id",
            "info_enabled",
            "shuffle",
            "hang_seconds",
            "tei_version",
            "auto_truncate",
            "openai_route",
        }
        unknown = set(settings) - allowed
        if unknown:
            raise TypeError(f"unknown settings {sorted(unknown)}")
        if "tokenizer" in settings:
            settings["tokenizer"] = _counting(settings["tokenizer"])
        with self._lock:
            for name, value in settings.items():
                setattr(self._state, name, value)

    def stats(self) -> ServerStats:
        with self._lock:
            s = self._state
            return ServerStats(
                requests=s.requests,
                info_requests=s.info_requests,
                embed_requests=s.embed_requests,
                inputs=s.inputs,
                batch_sizes=tuple(s.batch_sizes),
                max_concurrent=s.max_concurrent,
                faults=dict(s.faults),
                too_long=s.too_long,
                last_authorization=s.last_authorization,
                last_payload=s.last_payload,
            )

    def reset_stats(self) -> None:
        with self._lock:
            s = self._state
            s.requests = s.info_requests = s.embed_requests = s.inputs = 0
            s.max_concurrent = s.active
            s.batch_sizes = []
            s.faults = {}
            s.too_long = 0
            s.last_authorization = None
            s.last_payload = None

    # -- request handling (handler threads) ------------------------------------------------

    def _enter(self, authorization: str | None) -> None:
        with self._lock:
            s = self._state
            s.requests += 1
            s.active += 1
            s.max_concurrent = max(s.max_concurrent, s.active)
            s.last_authorization = authorization

    def _leave(self) -> None:
        with self._lock:
            self._state.active -= 1

    def _pick_fault(self, *, embedding: bool) -> tuple[str, float, float, threading.Event]:
        """(kind, latency to wait, hang limit, wake event) for one request."""
        with self._lock:
            s = self._state
            kind = s.mode
            latency = s.latency + s.mode_latency
            if kind == "normal" and embedding and s.fault_rates:
                draw = s.fault_rng.random()
                for candidate, rate in s.fault_rates.items():
                    if draw < rate:
                        kind = candidate
                        break
                    draw -= rate
            if kind == "slow" and s.mode_latency == 0.0:
                latency += 1.0  # a random "slow" fault: one second more
            if not embedding and kind in VECTOR_FAULTS:
                kind = "normal"
            if kind != "normal":
                s.faults[kind] = s.faults.get(kind, 0) + 1
            return kind, latency, s.hang_seconds, self._wake

    def _record_embedding(self, texts: list[str], payload: dict[str, Any]) -> None:
        """Count an embedding request of ``texts`` (whichever route's key held them)."""
        with self._lock:
            s = self._state
            s.embed_requests += 1
            s.inputs += len(texts)
            s.batch_sizes.append(len(texts))
            s.last_payload = payload

    def _too_long(self, texts: list[str], state: _State) -> int | None:
        """The token count of the first input over ``max_input_length`` (when enforced)."""
        if state.tokenizer is None or state.max_input_length is None:
            return None
        for encoding in state.tokenizer.encode_batch(texts, add_special_tokens=True):
            if len(encoding.ids) > state.max_input_length:
                with self._lock:
                    self._state.too_long += 1
                return len(encoding.ids)
        return None

    def _snapshot(self) -> _State:
        with self._lock:
            return attrs.evolve(self._state)

    def _shuffle(self, items: list[Any]) -> None:
        with self._lock:
            if self._state.shuffle:
                self._state.shuffle_rng.shuffle(items)


class _HTTPServer(LoopbackHTTPServer):
    # socketserver's default listen backlog is 5: dozens of workers opening their pooled
    # connections at once would overflow it and see resets no real embedding server gives
    # (TEI's listener takes 1,024).
    request_queue_size = 1024
    fake: FakeEmbedServer


class _Drop(Exception):
    """Close the connection without an answer."""


class _Answered(Exception):
    """A fault answer has been written; nothing more to send."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, like a real server behind a pooled client
    timeout = 30  # idle keep-alive connections end on their own
    # Headers and body go out in two writes: with Nagle on, the client's delayed ACK would add
    # ~40 ms to every answer.
    disable_nagle_algorithm = True
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def _handle(self) -> None:
        fake = self.server.fake
        path = self.path.split("?", 1)[0]
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if path.startswith("/_fake/"):
            self._control(fake, path, raw)
            return
        fake._enter(self.headers.get("Authorization"))
        try:
            self._serve(fake, path, raw)
        except _Answered:
            pass
        except _Drop:
            self.close_connection = True
        except (BrokenPipeError, ConnectionResetError):
            # The client gave up (a timeout or a cancelled request): nothing left to answer.
            self.close_connection = True
        finally:
            fake._leave()

    def _serve(self, fake: FakeEmbedServer, path: str, raw: bytes) -> None:
        method = self.command
        if method == "GET" and path == "/info":
            with fake._lock:
                fake._state.info_requests += 1
            self._before_answer(fake, None)
            state = fake._snapshot()
            if not state.info_enabled:
                self._error(404, "no such route", "NotFound")
                return
            self._json(
                200,
                {
                    "model_id": state.model_id,
                    "model_dtype": "float32",
                    "model_type": {"embedding": {"pooling": "cls"}},
                    "max_concurrent_requests": 512,
                    "max_input_length": state.max_input_length or 8192,
                    "max_batch_tokens": state.max_batch_tokens or 16384,
                    "max_client_batch_size": state.max_batch_size or 1024,
                    "auto_truncate": state.auto_truncate,
                    "version": state.tei_version,
                },
            )
            return
        if method == "POST" and (
            path == "/embed" or (path == "/v1/embeddings" and fake._snapshot().openai_route)
        ):
            self._embed(fake, path, raw)
            return
        self._error(404, "no such route", "NotFound")

    def _embed(self, fake: FakeEmbedServer, path: str, raw: bytes) -> None:
        openai = path == "/v1/embeddings"
        try:
            payload = json.loads(raw)
        except ValueError:
            self._error(400, "request body is not JSON", "Validation")
            return
        texts = payload.get("input" if openai else "inputs") if isinstance(payload, dict) else None
        if isinstance(texts, str):
            texts = [texts]
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts) or not texts:
            self._error(422, "inputs must be a non-empty list of strings", "Validation")
            return
        fake._record_embedding(texts, payload)
        kind = self._before_answer(fake, texts)
        state = fake._snapshot()
        if state.max_batch_size is not None and len(texts) > state.max_batch_size:
            self._error(
                413,
                f"batch size {len(texts)} > maximum allowed batch size {state.max_batch_size}",
                "Validation",
            )
            return
        given = fake._too_long(texts, state)
        if given is not None:
            message = (
                f"{BODY_MARKER}: Input validation error: `inputs` must have less than "
                f"{state.max_input_length} tokens. Given: {given}"
            )
            refusal: dict[str, object] = (
                {"message": message, "code": 413, "type": "Validation"}
                if openai
                else {"error": message, "error_type": "Validation"}
            )
            self._json(413, refusal)
            return
        # Bodies are assembled from cached JSON per text: encoding 32 x 1024 floats per request
        # would otherwise make this server, not the client under test, the bottleneck.
        # OpenAI's base64 format when asked for it (the official client asks by default)
        encoded = openai and payload.get("encoding_format") == "base64"
        cached = _vector_base64_json if encoded else _vector_json
        written = base64_json if encoded else floats_json
        fragments = [cached(text, state.dimension) for text in texts]
        if kind in VECTOR_FAULTS:
            middle = len(fragments) // 2
            vector = fake_vector(texts[middle], state.dimension)
            if kind == "null_vector":
                fragments[middle] = "null"
            elif kind == "wrong_count":
                fragments.pop()
            elif kind == "wrong_dimension":
                fragments[middle] = written(vector[:-1])
            elif kind == "nan":
                vector[0] = math.nan
                fragments[middle] = written(vector)  # the bare NaN token, or its float32 bits
            elif kind == "infinity":
                vector[-1] = math.inf
                fragments[middle] = written(vector)  # the bare Infinity token, or its bits
        if not openai:
            self._raw(200, f"[{','.join(fragments)}]".encode(), "application/json")
            return
        items = [
            f'{{"object":"embedding","index":{index},"embedding":{fragment}}}'
            for index, fragment in enumerate(fragments)
        ]
        fake._shuffle(items)
        model = payload.get("model") if isinstance(payload.get("model"), str) else state.model_id
        body = (
            f'{{"object":"list","data":[{",".join(items)}],"model":{json.dumps(model)},'
            '"usage":{"prompt_tokens":0,"total_tokens":0}}'
        )
        self._raw(200, body.encode(), "application/json")

    def _before_answer(self, fake: FakeEmbedServer, texts: list[str] | None) -> str:
        """Apply latency and the transport-level faults; the kind left for the body.

        ``texts`` is None for /info, which gets no vector faults and no random faults.
        """
        kind, latency, hang_seconds, wake = fake._pick_fault(embedding=texts is not None)
        if latency > 0:
            wake.wait(latency)
        if kind == "hang":
            wake.wait(hang_seconds)
            raise _Drop
        if kind == "disconnect":
            raise _Drop
        status = _STATUS_KIND.fullmatch(kind)
        if status:
            self._fault_status(int(status.group(1)), texts[0] if texts else "")
            raise _Answered
        if kind == "malformed":
            self._raw(200, b'{"data": [[0.1, 0.2', "application/json")
            raise _Answered
        return kind

    def _fault_status(self, status: int, first_input: str) -> None:
        # Like TEI's error bodies, and like servers that echo the input back: a client that puts
        # bodies into messages would leak it.
        error_type = {413: "Validation", 422: "Tokenizer", 424: "Backend", 429: "Overloaded"}
        self._error(
            status,
            f"injected failure; input was: {first_input}",
            error_type.get(status, "Unhealthy"),
        )

    def _control(self, fake: FakeEmbedServer, path: str, raw: bytes) -> None:
        try:
            body = json.loads(raw) if raw else {}
            if path == "/_fake/mode" and self.command == "POST":
                fake.set_mode(
                    str(body["kind"]),
                    status=body.get("status"),
                    latency=float(body.get("latency", 0.0)),
                )
            elif path == "/_fake/fault-rates" and self.command == "POST":
                fake.set_fault_rates(body.get("rates", {}), seed=int(body.get("seed", 0)))
            elif path == "/_fake/reset-stats" and self.command == "POST":
                fake.reset_stats()
            elif path != "/_fake/stats":
                self._json(404, {"error": "unknown control route"})
                return
        except (ValueError, KeyError, TypeError) as exc:
            self._json(400, {"error": str(exc)})
            return
        self._json(200, _stats_json(fake.stats()))

    def _error(self, status: int, message: str, error_type: str) -> None:
        self._json(status, {"error": f"{BODY_MARKER}: {message}", "error_type": error_type})

    def _json(self, status: int, body: object) -> None:
        # allow_nan: NaN / Infinity are sent as the bare tokens some servers really emit.
        self._raw(status, json.dumps(body, allow_nan=True).encode(), "application/json")

    def _raw(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _counting(tokenizer: Tokenizer | None) -> Tokenizer | None:
    """A copy of ``tokenizer`` that counts every token, as TEI does with ``truncate: false``."""
    if tokenizer is None:
        return None
    counting = Tokenizer.from_str(tokenizer.to_str())
    counting.no_truncation()
    counting.no_padding()
    return counting


def _stats_json(stats: ServerStats) -> dict[str, Any]:
    result = attrs.asdict(stats)
    result["batch_sizes"] = list(stats.batch_sizes)
    result.pop("last_payload")
    result.pop("last_authorization")
    return result


def _parse_rates(values: list[str]) -> dict[str, float]:
    rates: dict[str, float] = {}
    for value in values:
        for item in value.split(","):
            kind, sep, rate = item.partition("=")
            if not sep:
                raise argparse.ArgumentTypeError(f"expected KIND=RATE, got {item!r}")
            rates[check_kind(kind.strip())] = float(rate)
    return rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m testkit.embed_server", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--dimension", type=int, default=1024)
    parser.add_argument("--latency-ms", type=float, default=0.0, help="fixed per request")
    parser.add_argument("--max-batch-size", type=int, default=None)
    parser.add_argument("--max-batch-tokens", type=int, default=None)
    parser.add_argument("--max-input-length", type=int, default=None)
    parser.add_argument(
        "--tokenizer", default=None, help="a tokenizer.json: enforce --max-input-length with it"
    )
    parser.add_argument("--model-id", default="BAAI/bge-m3")
    parser.add_argument("--no-info", action="store_true", help="answer 404 to GET /info")
    parser.add_argument("--no-shuffle", action="store_true", help="keep OpenAI data in order")
    parser.add_argument(
        "--fault-rate",
        action="append",
        default=[],
        metavar="KIND=RATE",
        help=f"repeatable or comma-separated; kinds: status_NNN, {', '.join(KINDS[1:])}",
    )
    parser.add_argument("--hang-seconds", type=float, default=3600.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        rates = _parse_rates(args.fault_rate)
    except (ValueError, argparse.ArgumentTypeError) as exc:
        parser.error(str(exc))
    server = FakeEmbedServer(
        dimension=args.dimension,
        latency=args.latency_ms / 1000.0,
        max_batch_size=args.max_batch_size,
        max_batch_tokens=args.max_batch_tokens,
        max_input_length=args.max_input_length,
        tokenizer=Tokenizer.from_file(args.tokenizer) if args.tokenizer else None,
        model_id=args.model_id,
        info_enabled=not args.no_info,
        shuffle=not args.no_shuffle,
        hang_seconds=args.hang_seconds,
        fault_rates=rates,
        seed=args.seed,
        port=args.port,
    )
    done = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        done.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    with server:
        print(f"embed_server listening on {server.url}", flush=True)
        while not done.wait(0.5):
            pass
        stats = _stats_json(server.stats())
    print(json.dumps(stats), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
