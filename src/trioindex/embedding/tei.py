"""The Hugging Face text-embeddings-inference (TEI) provider.

``GET {url}/info`` tells the server's limits (``max_client_batch_size``, ``max_batch_tokens``,
``max_input_length``), ``model_id``, ``auto_truncate`` and ``version``. Vectors are asked one of
two ways:

- ``POST {url}/v1/embeddings`` ``{"input": [...], "encoding_format": "base64"}``, TEI's
  OpenAI-compatible route, when ``/info`` says ``auto_truncate: false`` and a version of 1.3 or
  later (the first with the base64 format). Each vector comes as base64 of little-endian float32:
  5,464 bytes for 1,024 dimensions against about 12,700 as JSON numbers, decoded in one numpy
  pass instead of parsed number by number. That route takes no ``truncate`` flag and uses the
  server's ``auto_truncate``, hence the condition; it always normalises.
- otherwise ``POST {url}/embed`` ``{"inputs": [...], "truncate": false, "normalize": true}`` (both
  flags sent explicitly: a silently truncated chunk would get a vector that does not describe its
  text), answer ``[[float, ...], ...]`` in input order. A server whose ``/v1/embeddings`` answers
  404 or 405 (a proxy that passes ``/embed`` only) is asked this way from then on.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

import attrs
import trio

from trioindex.embedding.base import EmbedderInfo
from trioindex.embedding.batching import embed_in_batches
from trioindex.embedding.openai import read_answer
from trioindex.embedding.transport import HttpTransport, parse_json, release_body
from trioindex.embedding.vectors import Vectors, json_without_booleans, validate_vectors
from trioindex.errors import StepFailure

logger = logging.getLogger(__name__)

# The first TEI release whose OpenAI-compatible route answers ``encoding_format: "base64"``.
_BASE64_SINCE = (1, 3)
_VERSION = re.compile(r"(\d{1,4})\.(\d{1,4})(?![\d])")
_OPENAI_ROUTE = "/v1/embeddings"


@attrs.define(eq=False)
class TeiEmbedder:
    """An :class:`~trioindex.embedding.base.Embedder` talking to a TEI server."""

    _http: HttpTransport
    _model: str
    _dimension: int
    _batch_size: int
    _limiter: trio.CapacityLimiter
    _info: EmbedderInfo
    # False while the server's limits are unknown because it could not be reached: they are
    # asked again before the next call, since a batch above its limit would be rejected (413).
    _limits_known: bool = False
    _probe_lock: trio.Lock = attrs.field(factory=trio.Lock)
    # Whether vectors are asked as base64 on the OpenAI-compatible route (module docstring).
    _base64_route: bool = False

    @classmethod
    async def open(
        cls,
        http: HttpTransport,
        *,
        model: str,
        dimension: int,
        batch_size: int,
        limiter: trio.CapacityLimiter,
    ) -> TeiEmbedder:
        """Read the server's ``/info`` (a warning, not an error, if it cannot be read)."""
        info = EmbedderInfo.configured(model, dimension, batch_size)
        self = cls(http, model, dimension, batch_size, limiter, info)
        await self._probe_info()
        logger.info(
            "embedder ready: api=tei url=%s model=%s dimension=%d batch=%d "
            "max_batch_tokens=%s max_input_tokens=%s max_in_flight=%s vectors=%s",
            http.display_url,
            model,
            dimension,
            self._info.max_batch_size,
            self._info.max_batch_tokens,
            self._info.max_input_tokens,
            limiter.total_tokens,
            "base64" if self._base64_route else "json",
        )
        return self

    @property
    def info(self) -> EmbedderInfo:
        return self._info

    async def embed(self, texts: Sequence[str]) -> Vectors:
        if not texts:
            return Vectors.empty(self._dimension)
        # Only one caller re-asks; the others go on with the configured limits meanwhile.
        if not self._limits_known and not self._probe_lock.locked():
            await self._probe_info()
        return await embed_in_batches(texts, self._info, self._embed_batch, self._limiter)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _embed_batch(self, batch: Sequence[str]) -> Vectors:
        if self._base64_route:
            vectors = await self._embed_base64(batch)
            if vectors is not None:
                return vectors
        body, text = await self._http.post_json_with_text(
            "/embed", {"inputs": list(batch), "truncate": False, "normalize": True}
        )
        # an answer of numbers has no "t" or "f" byte, so no JSON boolean: the check can let
        # numpy type its values without scanning each one's type first
        return validate_vectors(
            body,
            expected_count=len(batch),
            dimension=self._dimension,
            may_hold_booleans=not json_without_booleans(text),
        )

    async def _embed_base64(self, batch: Sequence[str]) -> Vectors | None:
        """The batch's vectors from the OpenAI-compatible route; None when the server has no
        such route, which turns the route off for good."""
        response = await self._http.send(
            "POST", _OPENAI_ROUTE, {"input": list(batch), "encoding_format": "base64"}
        )
        try:
            if response.status_code in (404, 405):
                if self._base64_route:
                    self._base64_route = False
                    logger.warning(
                        "embedding server answers HTTP %d to %s; asking /embed from now on",
                        response.status_code,
                        _OPENAI_ROUTE,
                    )
                return None
            body = parse_json(response)
        finally:
            release_body(response)
        return read_answer(body, len(batch), self._dimension)

    async def _probe_info(self) -> None:
        async with self._probe_lock:
            try:
                response = await self._http.send("GET", "/info")
                if response.status_code == 404:
                    logger.warning(
                        "embedding server has no /info; using the configured batch size %d",
                        self._batch_size,
                    )
                    self._limits_known = True
                    return
                body = parse_json(response)
            except StepFailure as exc:
                # Unreachable or 5xx: ask again later. Anything else will not change by asking.
                self._limits_known = not exc.retryable
                logger.warning(
                    "cannot read the embedding server's /info (%s); using the configured "
                    "batch size %d%s",
                    exc.message,
                    self._batch_size,
                    "" if self._limits_known else " and asking again on the next call",
                )
                return
            self._limits_known = True
            if not isinstance(body, dict):
                logger.warning("embedding server's /info is not an object; using configured limits")
                return
            self._apply_info(body)

    def _apply_info(self, body: dict[str, object]) -> None:
        max_client_batch = _positive_int(body.get("max_client_batch_size"))
        batch_size = self._batch_size
        if max_client_batch is not None and max_client_batch < batch_size:
            logger.info(
                "embedding batch size %d clamped to the server's max_client_batch_size %d",
                batch_size,
                max_client_batch,
            )
            batch_size = max_client_batch
        self._info = attrs.evolve(
            self._info,
            max_batch_size=batch_size,
            max_batch_tokens=_positive_int(body.get("max_batch_tokens")),
            max_input_tokens=_positive_int(body.get("max_input_length")),
        )
        # Only a server that refuses over-long inputs itself may be asked on the route that
        # takes no truncate flag.
        self._base64_route = body.get("auto_truncate") is False and _version_at_least(
            body.get("version"), _BASE64_SINCE
        )
        reported = body.get("model_id")
        if isinstance(reported, str) and not same_model(self._model, reported):
            logger.warning(
                "embedding server serves model %r but embedding.model is %r; vectors are "
                "stored under the configured model",
                reported[:200],
                self._model,
            )


def same_model(configured: str, reported: str) -> bool:
    """Whether two model ids plainly name the same model.

    TEI reports the id or the local path it was started with ("BAAI/bge-m3", "/data/bge-m3"), so
    the last path segment is compared too, case-insensitively.
    """

    def norm(name: str) -> str:
        return name.strip().rstrip("/").lower()

    a, b = norm(configured), norm(reported)
    return a == b or a.rsplit("/", 1)[-1] == b.rsplit("/", 1)[-1]


def _version_at_least(version: object, least: tuple[int, int]) -> bool:
    """Whether ``version`` ("1.8.2", "1.9.0-dev") starts with a major.minor of ``least`` or more."""
    found = _VERSION.match(version) if isinstance(version, str) else None
    return found is not None and (int(found.group(1)), int(found.group(2))) >= least


def _positive_int(value: object) -> int | None:
    if type(value) is int and value > 0:
        return value
    return None
