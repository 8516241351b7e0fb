"""A fake TEI re-ranker on 127.0.0.1 (``POST /rerank``), for tests and the eval.

It answers TEI's shape, ``[{"index": i, "score": s}, ...]`` best first, with a deterministic
lexical score: the share of the query's distinct words (lower-cased, 2+ letters) that the text
holds, plus a small bonus for a text that holds them in the query's order — so a test can
predict the order it gives. Modes, set with :meth:`FakeRerankServer.set_mode` (thread-safe):
``normal``, ``hang`` (no answer until the mode changes or the server stops), ``status_N``
(HTTP N), ``malformed`` (200, not JSON), ``short`` (one result too few). Every request is
counted with the number of texts it held (:attr:`FakeRerankServer.requests`).

Standalone: ``python -m testkit.rerank_server --port 8090`` serves until interrupted.
"""

from __future__ import annotations

import argparse
import json
import re
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any

from testkit.loopback_http import LoopbackHTTPServer

_WORD = re.compile(r"\w{2,}")


def fake_score(query: str, text: str) -> float:
    """The share of ``query``'s words in ``text``, +0.01 when they appear in the query's order."""
    words = list(dict.fromkeys(w.lower() for w in _WORD.findall(query)))
    held = [w.lower() for w in _WORD.findall(text)]
    if not words:
        return 0.0
    found = [w for w in words if w in held]
    ordered = found == sorted(found, key=held.index)
    return len(found) / len(words) + (0.01 if found and ordered else 0.0)


class FakeRerankServer:
    """Start with ``with FakeRerankServer() as server: ... server.url``."""

    def __init__(self, port: int = 0) -> None:
        self._server = LoopbackHTTPServer(("127.0.0.1", port), _Handler)
        self._server.fake = self  # type: ignore[attr-defined]
        self._lock = threading.Lock()
        self._mode = "normal"
        self._released = threading.Event()
        self.requests: list[int] = []
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeRerankServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._released.set()
        self._server.shutdown()
        self._server.server_close()

    def set_mode(self, mode: str) -> None:
        with self._lock:
            self._mode = mode
            if mode == "hang":
                self._released.clear()
            else:
                self._released.set()

    def _answer(self, payload: dict[str, Any]) -> tuple[int, bytes]:
        with self._lock:
            mode = self._mode
            self.requests.append(len(payload.get("texts", [])))
        if mode == "hang":
            self._released.wait()
            return 503, b"{}"
        if mode.startswith("status_"):
            return int(mode[len("status_") :]), b'{"error": "fake", "error_type": "fake"}'
        if mode == "malformed":
            return 200, b"not json"
        texts: list[str] = payload["texts"]
        scored = [
            {"index": i, "score": fake_score(payload["query"], t)} for i, t in enumerate(texts)
        ]
        scored.sort(key=lambda r: -r["score"])
        if mode == "short":
            scored = scored[:-1]
        return 200, json.dumps(scored).encode()


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        fake: FakeRerankServer = self.server.fake  # type: ignore[attr-defined]
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path != "/rerank":
            status, body = 404, b"{}"
        else:
            status, body = fake._answer(json.loads(raw))
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass  # the client gave up (a timeout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8090)
    args = parser.parse_args()
    with FakeRerankServer(args.port) as server:
        print(f"rerank_server listening on {server.url}", flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main()
