"""The optional re-ranker: a TEI ``/rerank`` endpoint (a cross-encoder such as
BAAI/bge-reranker-v2-m3 served beside the embedding model) re-orders the top of a hybrid
ranking.

:meth:`Reranker.rerank` sends the query and the texts of the first ``top_n`` fused chunks in one
request (``{"query", "texts", "truncate": true}``) and orders those chunks by the scores TEI
returns (``[{"index", "score"}, ...]``); the chunks past ``top_n`` follow in their fused order,
each scored at most the lowest re-ranked score, so a higher score still ranks first. When the
answer does not come within ``timeout`` seconds, or the server fails or answers something that
is not one score per text, the fused order is returned unchanged and one warning line is
logged naming the failure (status or exception type, never the query or a chunk's text).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import attrs
import httpx
import trio

from trioindex.search.results import RankedChunk

logger = logging.getLogger(__name__)

DEFAULT_TOP_N = 20
DEFAULT_TIMEOUT = 2.0


class Reranker:
    """A TEI ``/rerank`` client (module docstring). ``fallbacks`` counts the rankings it left
    in their fused order."""

    def __init__(
        self, url: str, *, top_n: int = DEFAULT_TOP_N, timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        if top_n < 1 or not timeout > 0:
            raise ValueError("a re-ranker needs top_n >= 1 and a positive timeout")
        self.url = url.rstrip("/") + "/rerank"
        self.top_n = top_n
        self.timeout = timeout
        self.fallbacks = 0
        self._client = httpx.AsyncClient(timeout=None)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def rerank(self, query: str, ranked: Sequence[RankedChunk]) -> list[RankedChunk]:
        """``ranked``'s first ``top_n`` ordered by the re-ranker, then the rest (module
        docstring); ``ranked`` unchanged when the re-ranker does not answer in time."""
        head, tail = list(ranked[: self.top_n]), list(ranked[self.top_n :])
        if len(head) < 2:
            return list(ranked)
        outcome: list[float] | str = f"no answer in {self.timeout:g}s"
        with trio.move_on_after(self.timeout):
            outcome = await self._scores(query, [chunk.text for chunk in head])
        if isinstance(outcome, str):
            logger.warning("re-ranker failed (%s); fused order kept", outcome)
            self.fallbacks += 1
            return list(ranked)
        scores = outcome
        order = sorted(range(len(head)), key=lambda i: (-scores[i], i))
        top = [attrs.evolve(head[i], score=scores[i]) for i in order]
        floor = top[-1].score
        return top + [attrs.evolve(c, score=min(c.score, floor)) for c in tail]

    async def _scores(self, query: str, texts: list[str]) -> list[float] | str:
        """One score per text, in order, or why not."""
        payload = {"query": query, "texts": texts, "truncate": True}
        try:
            response = await self._client.post(self.url, json=payload)
        except httpx.HTTPError as exc:
            return type(exc).__name__
        if response.status_code != 200:
            return f"HTTP {response.status_code}"
        try:
            return _scores_of(response.json(), len(texts))
        except (ValueError, TypeError, KeyError):
            return "an answer that is not one score per text"


def _scores_of(body: Any, count: int) -> list[float]:
    if not isinstance(body, list) or len(body) != count:
        raise ValueError("not one result per text")
    scores: list[float | None] = [None] * count
    for item in body:
        index, score = item["index"], float(item["score"])
        if not isinstance(index, int) or not 0 <= index < count or scores[index] is not None:
            raise ValueError("an index out of range or repeated")
        if not math.isfinite(score):
            raise ValueError("a score that is not a number")
        scores[index] = score
    return [s for s in scores if s is not None]
