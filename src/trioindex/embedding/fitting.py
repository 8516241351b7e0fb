"""Requests an embedding server refuses as too long: smaller requests, then pieces of the input.

A request refused with :class:`~trioindex.embedding.transport.InputTooLong` (HTTP 413, or a
message that states a token limit) does not fail the document:

* a request of several texts is halved and each half sent again, so the refused text is found
  in about log2(batch) requests and the others get their vectors as usual;
* a text refused alone is cut into pieces at the best boundaries in reach (a blank line, a line
  break, a sentence end, whitespace, else between grapheme clusters:
  :func:`~trioindex.pipeline.text_cuts.segments`), as many as the server's stated count calls
  for (``given / limit``, a quarter more), else two. The pieces are embedded like any texts,
  and the text's vector is their mean weighted by characters, scaled to their mean norm (unit
  vectors give a unit vector). A piece refused again cuts the text into twice as many pieces;
* a text that cannot be cut finer (one character), or would need more than :data:`MAX_PIECES`
  pieces, fails the call with a one-line :class:`~trioindex.errors.ProviderRejectedInput`
  naming the server's limit (stated in a refusal, else from its ``/info``) when it is known.

The smaller requests run one after another in the request slot of the refused one.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence

import attrs
import numpy as np

from trioindex.embedding.transport import InputTooLong
from trioindex.embedding.vectors import Vectors
from trioindex.errors import ProviderRejectedInput, ResultInvalid
from trioindex.pipeline.text_cuts import segments

#: Embeds one request's texts: one vector per text, in order.
EmbedBatch = Callable[[Sequence[str]], Awaitable[Vectors]]
Plan = Callable[[Sequence[str]], list[range]]

#: The most pieces a text is asked to be cut into (a cut may make up to twice as many) before
#: the server's refusal is final.
MAX_PIECES = 64
# Pieces beyond the server's stated count: a piece's share of the tokens is not exact.
_MARGIN = 1.25


@attrs.define(eq=False)
class LimitFitter:
    """Sends batches through ``embed_batch``, answering a refusal as too long by smaller
    requests and pieces (module docstring). ``plan`` batches the pieces of a text; ``limit``
    is the server's input limit in tokens, from its ``/info`` or the last refusal that stated
    one."""

    embed_batch: EmbedBatch
    plan: Plan
    limit: int | None = None
    cut: int = 0  # texts embedded in pieces

    async def embed(self, batch: Sequence[str]) -> Vectors:
        """One vector per text of ``batch``, in order."""
        return await self._send(batch, cut_refused=True)

    async def _send(self, batch: Sequence[str], *, cut_refused: bool) -> Vectors:
        try:
            return await self.embed_batch(batch)
        except InputTooLong as exc:
            self.limit = exc.limit or self.limit
            if len(batch) == 1 and not cut_refused:
                raise
            refused = exc
        if len(batch) == 1:
            return await self._in_pieces(batch[0], refused)
        half = len(batch) // 2
        first = await self._send(batch[:half], cut_refused=cut_refused)
        second = await self._send(batch[half:], cut_refused=cut_refused)
        return Vectors.joined([first, second])

    async def _in_pieces(self, text: str, refused: InputTooLong) -> Vectors:
        """``text``'s one vector, from the vectors of its pieces."""
        parts = 2
        if refused.limit and refused.given:
            parts = max(parts, math.ceil(_MARGIN * refused.given / refused.limit))
        cut = 1
        while True:
            pieces = cut_in_pieces(text, parts) if parts <= MAX_PIECES else []
            if len(pieces) <= cut:  # no finer cut than the last one
                raise _final(text, refused, self.limit, cut)
            cut = len(pieces)
            answers: list[Vectors] = []
            try:
                for span in self.plan(pieces):
                    batch = pieces[span.start : span.stop]
                    answers.append(await self._send(batch, cut_refused=False))
            except InputTooLong as again:
                refused = again
                parts = 2 * cut
                continue
            self.cut += 1
            vectors = Vectors.joined(answers)
            return mean_vector(vectors, [len(piece) for piece in pieces])


def _final(
    text: str, refused: InputTooLong, limit: int | None, pieces: int
) -> ProviderRejectedInput:
    how = f"even cut into {pieces} pieces" if pieces > 1 else "and it cannot be cut"
    stated = f"; input limit {limit} tokens" if limit else ""
    return ProviderRejectedInput(
        f"embedding server refuses an input of {len(text)} characters as too long, {how} "
        f"(HTTP {refused.status}{stated})"
    )


def cut_in_pieces(text: str, parts: int) -> list[str]:
    """``text`` in ``parts`` to ``2 * parts`` consecutive pieces cut at the best boundaries,
    blank pieces left out (a text of under 4 characters: its characters)."""
    if len(text) < 4:
        return [char for char in text if not char.isspace()]
    size = max(2, math.ceil(len(text) / parts))
    return [text[lo:hi] for lo, hi in segments(text, size) if text[lo:hi].strip()]


def mean_vector(vectors: Vectors, weights: Sequence[int]) -> Vectors:
    """The ``weights``-weighted mean of ``vectors``, scaled to their weighted mean norm: one
    vector."""
    matrix = vectors.matrix().astype(np.float64)
    w = np.asarray(weights, dtype=np.float64)
    mean = w @ matrix / w.sum()
    norm = float(np.linalg.norm(mean))
    if not norm > 0.0:
        raise ResultInvalid("the vectors of an input's pieces cancel out")
    target = float(w @ np.linalg.norm(matrix, axis=1) / w.sum())
    scaled = (mean * (target / norm)).reshape(1, vectors.dimension)
    return Vectors.checked(scaled, expected_count=1, dimension=vectors.dimension)
