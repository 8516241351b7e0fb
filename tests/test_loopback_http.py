"""The test servers' shared HTTP server: a client that goes away is not reported, anything else
is."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler

import pytest

from testkit.loopback_http import LoopbackHTTPServer


@pytest.mark.parametrize(
    ("error", "reported"),
    [
        (ConnectionResetError(104, "Connection reset by peer"), False),
        (BrokenPipeError(32, "Broken pipe"), False),
        (ValueError("a handler bug"), True),
    ],
)
def test_a_client_gone_mid_request_is_quiet_and_a_handler_error_is_reported(
    error: Exception, reported: bool, capfd: pytest.CaptureFixture[str]
) -> None:
    with LoopbackHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler) as server:
        try:
            raise error
        except Exception:
            server.handle_error(None, ("127.0.0.1", 1))
    printed = capfd.readouterr().err
    assert (type(error).__name__ in printed) is reported
