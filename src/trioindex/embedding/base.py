"""The embedder contract: what every provider exposes, and the one place that picks a provider.

Model selection (``api`` + ``model``) is decided here from configuration; how the texts travel (HTTP
to TEI or an OpenAI-compatible server, or a thread running a local model) is each provider's own
module. The worker's embed step and the query side (search) both go through :func:`open_embedder`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

import attrs
import httpx
import trio

from trioindex.errors import ConfigError

logger = logging.getLogger(__name__)

APIS = ("tei", "openai", "local")


@attrs.frozen
class EmbedderInfo:
    """What an embedder is and the limits it batches by.

    ``dimension`` is the dimension every returned vector is checked against. ``max_batch_size`` is
    the configured batch size, clamped to the server's own limit when the server reports one.
    ``max_batch_tokens`` / ``max_input_tokens`` are ``None`` when unknown.
    """

    model: str
    dimension: int | None
    max_batch_size: int
    max_batch_tokens: int | None
    max_input_tokens: int | None


class Embedder(Protocol):
    """An open embedding client, shared by every job of a worker (and by search)."""

    @property
    def info(self) -> EmbedderInfo:
        """The current limits (a TEI server that was down at start may tighten them later)."""
        ...

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One validated vector per text, in the order of ``texts``.

        Splits the texts into batches (by count, and by estimated tokens when the server has a
        token limit) and runs them with at most ``max_in_flight`` requests in flight across every
        caller of this embedder. Any failed batch fails the whole call with a
        :class:`~trioindex.errors.StepFailure` (``ProviderUnavailable``, ``ResultInvalid`` or
        ``ProviderRejectedInput``) and returns nothing.

        Cancellation handling: HTTP requests are cancelled at once; a local model finishes the
        batch it is encoding (a thread cannot be interrupted), then the call is cancelled.
        """
        ...

    async def aclose(self) -> None: ...


async def open_embedder(
    *,
    api: str,
    url: str | None,
    model: str,
    dimension: int,
    batch_size: int,
    max_in_flight: int,
    request_timeout: float,
    api_key: str | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> Embedder:
    """Open the embedder configured by ``embedding.*``.

    ``api`` is ``tei``, ``openai`` or ``local``. A TEI server is asked for ``GET /info`` to learn
    its limits; a server that is down at start only costs a warning (the limits are asked again on
    the next call). The local model is loaded here, in a thread. ``transport`` replaces the HTTP
    transport (tests). Invalid values raise :class:`~trioindex.errors.ConfigError` naming the key.
    """
    _check_config(
        api=api,
        url=url,
        model=model,
        dimension=dimension,
        batch_size=batch_size,
        max_in_flight=max_in_flight,
        request_timeout=request_timeout,
    )
    # One limiter per embedder: the embedder is shared by every job of the worker, so this is the
    # worker-wide cap on requests in flight.
    limiter = trio.CapacityLimiter(max_in_flight)
    if api == "local":
        from trioindex.embedding.local import LocalEmbedder

        return await LocalEmbedder.open(
            model=model, dimension=dimension, batch_size=batch_size, limiter=limiter
        )
    assert url is not None  # checked by _check_config
    from trioindex.embedding.transport import HttpTransport

    http = HttpTransport.open(
        url=url,
        request_timeout=request_timeout,
        max_connections=max_in_flight,
        api_key=api_key,
        transport=transport,
    )
    if api == "tei":
        from trioindex.embedding.tei import TeiEmbedder

        try:
            return await TeiEmbedder.open(
                http, model=model, dimension=dimension, batch_size=batch_size, limiter=limiter
            )
        except BaseException:
            # Cancelled (or failed) while asking /info: the client is not handed out, close it.
            with trio.move_on_after(1, shield=True):
                await http.aclose()
            raise
    from trioindex.embedding.openai import OpenAIEmbedder

    return OpenAIEmbedder.open(
        http, model=model, dimension=dimension, batch_size=batch_size, limiter=limiter
    )


def _check_config(
    *,
    api: str,
    url: str | None,
    model: str,
    dimension: int,
    batch_size: int,
    max_in_flight: int,
    request_timeout: float,
) -> None:
    if api not in APIS:
        raise ConfigError(f"embedding.api: unknown value {api!r} (expected tei, openai or local)")
    if not model.strip():
        raise ConfigError("embedding.model: must not be empty")
    if dimension < 1:
        raise ConfigError(f"embedding.dimension: {dimension} (expected >= 1)")
    if batch_size < 1:
        raise ConfigError(f"embedding.batch-size: {batch_size} (expected >= 1)")
    if max_in_flight < 1:
        raise ConfigError(f"embedding.max-in-flight: {max_in_flight} (expected >= 1)")
    if not request_timeout > 0:
        raise ConfigError(f"embedding.request-timeout: {request_timeout} (expected > 0)")
    if api == "local":
        return
    if not url:
        raise ConfigError(f"embedding.url: required when embedding.api is {api!r}")
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:
        raise ConfigError("embedding.url: not a valid URL") from None
    # The URL may carry credentials, so only its scheme is ever echoed back.
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ConfigError(
            f"embedding.url: expected an http:// or https:// URL (scheme {parsed.scheme!r})"
        )
