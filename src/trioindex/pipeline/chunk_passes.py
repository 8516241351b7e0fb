"""The chunker's last two passes over its cut chunks (:mod:`trioindex.pipeline.chunking` says
why): **no fragments** — a chunk under :data:`FRAGMENT_FRACTION` of the size limit is merged
with its smaller neighbour when the two fit in one chunk, else the two are cut again where they
balance best — and **overlap at word boundaries** — each chunk after the first is extended
backwards into its predecessor, from a sentence start in reach, else a word start.

Both take chunks as ``(start, piece, size)`` with ``text[start:start + len(piece)] == piece``,
and size every new piece with a :class:`ChunkMeasure`, the chunker's own way of counting.
"""

from __future__ import annotations

import attrs
from tokenizers import Tokenizer

from trioindex.pipeline.text_cuts import SENTENCE_CUT, WORD_CUT, overlap_start, trimmed
from trioindex.pipeline.token_counts import (
    character_size,
    count_tokens,
    in_batches,
    overlap_reach,
)

# A chunk under this fraction of the size limit is a fragment (merged or rebalanced).
FRAGMENT_FRACTION = 0.25
# Rebalancing measures at most this many candidate cuts (the nearest to the middle).
_MAX_CUT_CANDIDATES = 48

#: Chunks as ``(start, piece, size)``, in text order.
Counted = list[tuple[int, str, int]]


@attrs.frozen
class ChunkMeasure:
    """How a chunker sizes a piece: ``limit`` is the size no chunk may exceed (model tokens,
    special ones included, with a ``tokenizer``; else characters, each piece weighing its
    token bound at ``chars_per_token`` when that is set), and ``max_chars`` the character cap
    every chunk also keeps."""

    limit: int
    max_chars: int
    tokenizer: Tokenizer | None = attrs.field(eq=False, repr=False)
    chars_per_token: float | None

    def sizes(self, pieces: list[str]) -> list[int]:
        """Sizes as :attr:`limit` counts them."""
        if self.tokenizer is None:
            return [character_size(p, self.chars_per_token) for p in pieces]
        return count_tokens(self.tokenizer, pieces)

    def fits(self, piece: str, size: int) -> bool:
        """Within the size limit and the character cap."""
        return size <= self.limit and len(piece) <= self.max_chars


def merge_fragments(text: str, counted: Counted, measure: ChunkMeasure) -> Counted:
    """Merge each fragment into its smaller neighbour when both fit in one chunk, else
    rebalance it with a neighbour. ``counted`` holds disjoint spans."""
    fragment = max(1, int(measure.limit * FRAGMENT_FRACTION))
    out = list(counted)
    i = 0
    while len(out) > 1 and i < len(out):
        if out[i][2] >= fragment:
            i += 1
            continue
        neighbours = sorted(
            (j for j in (i - 1, i + 1) if 0 <= j < len(out)), key=lambda j: out[j][2]
        )
        for j in neighbours:
            a, b = min(i, j), max(i, j)
            start, piece = trimmed(text, out[a][0], out[b][0] + len(out[b][1]))
            [size] = measure.sizes([piece])
            if measure.fits(piece, size):
                out[a : b + 1] = [(start, piece, size)]
                i = a
                break
        else:
            j = i - 1 if i > 0 else i + 1
            a, b = min(i, j), max(i, j)
            halves = _rebalance(text, out[a][0], out[b][0] + len(out[b][1]), measure)
            if halves is not None and min(h[2] for h in halves) > out[i][2]:
                out[a : b + 1] = halves
            i = b + 1
    return out


def _rebalance(text: str, lo: int, hi: int, measure: ChunkMeasure) -> Counted | None:
    """``text[lo:hi]`` cut in two that fit, at the sentence end or line break (else the
    whitespace) that makes the larger half smallest; None if there is no such cut."""
    for boundary in (SENTENCE_CUT, WORD_CUT):
        cuts = [m.end() for m in boundary.finditer(text, lo, hi) if lo < m.start() and m.end() < hi]
        if cuts:
            break
    else:
        return None
    middle = (lo + hi) / 2
    cuts = sorted(sorted(cuts, key=lambda c: abs(c - middle))[:_MAX_CUT_CANDIDATES])
    halves = [(trimmed(text, lo, c), trimmed(text, c, hi)) for c in cuts]
    sizes = measure.sizes([piece for pair in halves for _, piece in pair])
    best: Counted | None = None
    for n, (left, right) in enumerate(halves):
        pair = [(*left, sizes[2 * n]), (*right, sizes[2 * n + 1])]
        if not (left[1] and right[1] and all(measure.fits(half, size) for _, half, size in pair)):
            continue
        if best is None or max(p[2] for p in pair) < max(p[2] for p in best):
            best = pair
    return best


def with_overlap(text: str, counted: Counted, measure: ChunkMeasure, overlap: int) -> Counted:
    """Extend each chunk after the first backwards into its predecessor by at most
    ``overlap`` units, from a sentence start in reach, else a word start. ``counted`` is
    changed in place and returned."""
    if overlap == 0 or len(counted) < 2:
        return counted
    reach = _overlap_reach(text, counted[:-1], measure, overlap)
    starts: list[int | None] = [None]
    for (prev_start, prev, _), earliest, (start, _piece, _size) in zip(
        counted, reach, counted[1:], strict=False
    ):
        within = max(earliest, prev_start + 1)  # never the whole predecessor
        starts.append(overlap_start(text, within, min(start, prev_start + len(prev))))
    # A batch at a time, each chunk replaced in place: the extended copies of a whole
    # document never sit beside all of the pieces they replace.
    todo = [(n, s) for n, s in enumerate(starts) if s is not None]
    for batch in in_batches(todo):
        extended = [text[s : counted[n][0] + len(counted[n][1])] for n, s in batch]
        sizes = measure.sizes(extended)
        for (n, s), piece, size in zip(batch, extended, sizes, strict=True):
            if measure.fits(piece, size):
                counted[n] = (s, piece, size)
    return counted


def _overlap_reach(text: str, counted: Counted, measure: ChunkMeasure, overlap: int) -> list[int]:
    """For each chunk, the earliest offset an overlap taken from its end may start at."""
    if measure.tokenizer is None:
        return [
            overlap_reach(text, start, start + len(piece), overlap, measure.chars_per_token)
            for start, piece, _ in counted
        ]
    reach: list[int] = []
    for batch in in_batches(counted):
        encodings = measure.tokenizer.encode_batch(
            [piece for _, piece, _ in batch], add_special_tokens=False
        )
        for (start, _piece, _), encoding in zip(batch, encodings, strict=True):
            offsets = encoding.offsets
            first = len(offsets) - overlap
            reach.append(start + (offsets[first][0] if first > 0 else 0))
    return reach
