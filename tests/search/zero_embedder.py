"""A TEI-speaking embedding server on 127.0.0.1 that answers an all-zero vector for every text
containing :data:`ZERO_MARK` and :func:`testkit.embed_server.fake_vector` for the others: a
model that cannot give some inputs a direction, for the search and storage tests.

It counts the texts of every ``/embed`` request (``batches``), so a test can see a refused batch
embedded again one text at a time.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler
from types import TracebackType
from typing import Any

from testkit.embed_server import fake_vector
from testkit.loopback_http import LoopbackHTTPServer

ZERO_MARK = "ZERO-VECTOR"


class ZeroEmbedServer:
    """``with ZeroEmbedServer(dimension=4, model="m") as server: server.url``."""

    def __init__(self, *, dimension: int, model: str) -> None:
        self.dimension = dimension
        self.model = model
        self.batches: list[int] = []
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.owner = self
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def vector(self, text: str) -> list[float]:
        return [0.0] * self.dimension if ZERO_MARK in text else fake_vector(text, self.dimension)

    def __enter__(self) -> ZeroEmbedServer:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._httpd.shutdown()
        self._thread.join()
        self._httpd.server_close()


class _Server(LoopbackHTTPServer):
    owner: ZeroEmbedServer


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _answer(self, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        owner = self.server.owner
        self._answer({"model_id": owner.model, "max_client_batch_size": 64})

    def do_POST(self) -> None:
        owner = self.server.owner
        texts = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["inputs"]
        owner.batches.append(len(texts))
        self._answer([owner.vector(text) for text in texts])
