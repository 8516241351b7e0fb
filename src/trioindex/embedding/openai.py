"""The OpenAI-compatible provider: ``POST {url}/v1/embeddings`` (vLLM, Ollama, infinity, LiteLLM,
OpenAI).

Request ``{"model", "input": [...], "encoding_format": "base64"}``; answer ``data[i].embedding``,
put in input order by ``data[i].index``: servers may answer out of order. Each embedding is a
base64 string of little-endian float32 values, as the official ``openai`` client asks for by
default (a quarter of the bytes of JSON numbers, and decoded in one numpy pass); a server that
ignores the format and answers lists of numbers is read as well. A URL that already ends in
``/v1`` is not given a second one.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import attrs
import trio

from trioindex.embedding.base import EmbedderInfo
from trioindex.embedding.batching import embed_in_batches
from trioindex.embedding.transport import HttpTransport
from trioindex.embedding.vectors import Vectors, validate_vectors
from trioindex.errors import ResultInvalid

logger = logging.getLogger(__name__)


@attrs.define(eq=False)
class OpenAIEmbedder:
    """An :class:`~trioindex.embedding.base.Embedder` talking to an OpenAI-compatible server."""

    _http: HttpTransport
    _path: str
    _model: str
    _dimension: int
    _limiter: trio.CapacityLimiter
    _info: EmbedderInfo

    @classmethod
    def open(
        cls,
        http: HttpTransport,
        *,
        model: str,
        dimension: int,
        batch_size: int,
        limiter: trio.CapacityLimiter,
    ) -> OpenAIEmbedder:
        # No limits endpoint in this API: the configured batch size is the limit.
        info = EmbedderInfo.configured(model, dimension, batch_size)
        path = "/embeddings" if http.base_path.rstrip("/").endswith("/v1") else "/v1/embeddings"
        logger.info(
            "embedder ready: api=openai url=%s model=%s dimension=%d batch=%d max_in_flight=%s",
            http.display_url,
            model,
            dimension,
            batch_size,
            limiter.total_tokens,
        )
        return cls(http, path, model, dimension, limiter, info)

    @property
    def info(self) -> EmbedderInfo:
        return self._info

    async def embed(self, texts: Sequence[str]) -> Vectors:
        return await embed_in_batches(texts, self._info, self._embed_batch, self._limiter)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _embed_batch(self, batch: Sequence[str]) -> Vectors:
        body = await self._http.post_json(
            self._path, {"model": self._model, "input": list(batch), "encoding_format": "base64"}
        )
        return read_answer(body, len(batch), self._dimension)


def read_answer(body: object, expected_count: int, dimension: int) -> Vectors:
    """The checked vectors of an OpenAI-shaped answer to ``expected_count`` inputs (base64 or
    lists of numbers), in input order."""
    return validate_vectors(
        vectors_by_index(body, expected_count),
        expected_count=expected_count,
        dimension=dimension,
        base64_allowed=True,
    )


def vectors_by_index(body: object, expected_count: int) -> list[object]:
    """The ``embedding`` of each ``data`` item, placed at its ``index``.

    Every index must be an int in ``0..expected_count-1`` and appear once; a server that sends no
    index at all is taken in list order.
    """
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        raise ResultInvalid("embedding response has no data list")
    if len(data) != expected_count:
        raise ResultInvalid(
            f"embedding response has {len(data)} vectors for {expected_count} inputs"
        )
    items: list[dict[str, object]] = []
    for position, item in enumerate(data):
        if not isinstance(item, dict):
            raise ResultInvalid(f"embedding response item {position} is not an object")
        items.append(item)
    if all("index" not in item for item in items):
        return [item.get("embedding") for item in items]
    placed: list[object] = [None] * expected_count
    seen = [False] * expected_count
    for position, item in enumerate(items):
        index = item.get("index")
        if type(index) is not int or not 0 <= index < expected_count or seen[index]:
            raise ResultInvalid(
                f"embedding response item {position} has a missing, repeated or out-of-range index"
            )
        seen[index] = True
        placed[index] = item.get("embedding")
    return placed
