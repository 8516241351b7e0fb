"""The HTTP server class the test servers share: the fake embedder and reranker, and the
tests' own."""

from __future__ import annotations

import sys
from http.server import ThreadingHTTPServer
from typing import Any


class LoopbackHTTPServer(ThreadingHTTPServer):
    """A threaded server whose handler threads never keep a test process alive, and which
    stays quiet when a client goes away mid-request."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients that go away mid-request (killed workers, timeouts, closed pools) are what
        # the tests do on purpose; anything else still prints socketserver's traceback.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)
