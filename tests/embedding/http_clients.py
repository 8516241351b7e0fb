"""HTTP embedding clients for the tests of this folder: opened on the fake server (or on a
stand-in transport), and the vectors they should read."""

from __future__ import annotations

import httpx
import numpy as np

from testkit.embed_server import FakeEmbedServer, fake_vector
from trioindex.embedding import Embedder, open_embedder

DIM = 16
# The ways an HTTP client asks for vectors: "tei" (TEI's OpenAI-compatible route, base64),
# "tei /embed" (TEI's own route: the fake reports ``auto_truncate: true``), "openai".
HTTP_APIS = ["tei", "tei /embed", "openai"]


async def open_http(
    server: FakeEmbedServer,
    api: str,
    *,
    batch_size: int = 4,
    max_in_flight: int = 2,
    request_timeout: float = 5.0,
    api_key: str | None = None,
    model: str = "BAAI/bge-m3",
    url: str | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> Embedder:
    """An ``api`` client (one of :data:`HTTP_APIS`) on ``server``."""
    if api == "tei /embed":
        server.configure(auto_truncate=True)
        api = "tei"
    return await open_embedder(
        api=api,
        url=url or server.url,
        model=model,
        dimension=DIM,
        batch_size=batch_size,
        max_in_flight=max_in_flight,
        request_timeout=request_timeout,
        api_key=api_key,
        transport=transport,
    )


async def openai_through(transport: httpx.AsyncBaseTransport) -> Embedder:
    """An OpenAI-compatible embedder whose server is ``transport``."""
    return await open_embedder(
        api="openai",
        url="http://embedder.invalid",
        model="m",
        dimension=DIM,
        batch_size=8,
        max_in_flight=1,
        request_timeout=5.0,
        transport=transport,
    )


def served(text: str, api: str) -> list[float]:
    """The vector a client reads for ``text``: the server's, rounded to float32 (every
    embedder answers float32, whether it travelled as OpenAI's base64 or as JSON numbers)."""
    del api  # the same for every API
    rounded: list[float] = np.float32(fake_vector(text, DIM)).tolist()
    return rounded
