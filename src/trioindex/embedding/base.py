"""The embedder contract: what every provider exposes, and the one place that picks a provider.

Model selection (``api`` + ``model``) is decided here from configuration; how the texts travel (HTTP
to TEI or an OpenAI-compatible server, or a thread running a local model) is each provider's own
module. The worker's embed step and the query side (search) both go through :func:`open_embedder`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import attrs
import trio

from trioindex.config import EMBEDDING_APIS, URL_APIS, redact_url, value_problem
from trioindex.errors import ConfigError

if TYPE_CHECKING:  # the HTTP client is imported with the provider that uses it
    import httpx

    from trioindex.embedding.vectors import Vectors

logger = logging.getLogger(__name__)

#: Every ``embedding.api`` value; the registry in :mod:`trioindex.config.keys` owns the list.
APIS = EMBEDDING_APIS


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

    @classmethod
    def configured(
        cls, model: str, dimension: int, batch_size: int, *, max_input_tokens: int | None = None
    ) -> EmbedderInfo:
        """What configuration alone says (a server's ``/info`` may tighten it later)."""
        return cls(model, dimension, batch_size, None, max_input_tokens)


class Embedder(Protocol):
    """An open embedding client, shared by every job of a worker (and by search)."""

    @property
    def info(self) -> EmbedderInfo:
        """The current limits (a TEI server that was down at start may tighten them later)."""
        ...

    async def embed(self, texts: Sequence[str]) -> Vectors:
        """One checked vector per text, in the order of ``texts``, as
        :class:`~trioindex.embedding.vectors.Vectors`: float32 rows in one buffer, which the
        worker takes as a matrix without a copy and a search as one list per query.

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
    """The ``embedding.*`` rules of the configuration registry, for values given directly.

    Loaded settings have passed these already; a direct caller (tests, bench) meets the same
    rules, phrased the same way. The local model takes no URL, so none is checked for it.
    """
    given: dict[str, object] = {
        "embedding.api": api,
        "embedding.model": model,
        "embedding.dimension": dimension,
        "embedding.batch-size": batch_size,
        "embedding.max-in-flight": max_in_flight,
        "embedding.request-timeout": request_timeout,
    }
    for key, value in given.items():
        problem = value_problem(key, value)
        if problem is not None:
            raise ConfigError(f"{key}: {problem}, got {value!r}")
    if api not in URL_APIS:
        return
    if not url:
        raise ConfigError(f"embedding.url: required when embedding.api is {api!r}")
    problem = value_problem("embedding.url", url)
    if problem is not None:
        # The URL may carry credentials: it is only ever shown redacted.
        raise ConfigError(f"embedding.url: {problem}, got {redact_url(url)!r}")
