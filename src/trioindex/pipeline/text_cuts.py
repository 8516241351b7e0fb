"""Where text may be cut, for the chunker (:mod:`trioindex.pipeline.chunking`): segments cut at
the best boundary in reach, heading blocks glued to the text that follows them, trimmed pieces,
and where an overlap may start. Pure functions over ``str`` offsets; the chunker's module
docstring says why each exists.

Segments: the splitter's cost grows with the square of a stretch that has no boundary above the
word (a 2 MB word took 23 s, 8 MB 490 s; unpunctuated CJK is worse), so :func:`segments` cuts
the text at the best boundary in each segment's second half — a blank line, a line break, a
sentence end, whitespace, or (only if there is none) a hard cut that keeps grapheme clusters
whole. Only the chunker's later passes (a fragment merged with its neighbour, an overlap) reach
across a cut.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator

# Boundaries to cut a segment at, best first: blank line, line break, sentence end, space.
_SEGMENT_BOUNDARIES = (
    re.compile(r"\n[^\S\n]*\n\s*"),
    re.compile(r"\n\s*"),
    re.compile(r"[.!?。！？…][\"')\]」』”’]*\s+|[。！？]"),
    re.compile(r"\s+"),
)
# How far a hard cut may step back to avoid splitting a grapheme cluster.
_MAX_CLUSTER = 32
# A heading block has at most this many lines.
HEADING_LINES = 3
_SENTENCE_END = re.compile(r"[.!?。！？…][\"')\]」』”’]*$")
# Where a sentence ends (its end) or a line breaks, for overlaps and rebalancing.
SENTENCE_CUT = re.compile(r"[.!?。！？…][\"')\]」』”’]*\s+|[。！？]|\n\s*")
WORD_CUT = re.compile(r"\s+")


def trimmed(text: str, lo: int, hi: int) -> tuple[int, str]:
    """``text[lo:hi]`` without surrounding whitespace, and where it starts."""
    piece = text[lo:hi]
    stripped = piece.lstrip()
    start = lo + len(piece) - len(stripped)
    return start, stripped.rstrip()


def overlap_start(text: str, earliest: int, end: int) -> int | None:
    """Where an overlap ending at ``end`` starts: the first sentence start in
    ``[earliest, end)``, else the first word start; None when there is neither."""
    if earliest >= end:
        return None
    for boundary in (SENTENCE_CUT, WORD_CUT):
        # a start is the end of a boundary match: step back one so a cut right at `earliest` counts
        for match in boundary.finditer(text, max(0, earliest - 1), end):
            if earliest <= match.end() < end and not text[match.end()].isspace():
                return match.end()
    return None


# -- headings -----------------------------------------------------------------------------------


def _lines(text: str) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of each line of ``text``, without its newline, one at a time."""
    start = 0
    while (newline := text.find("\n", start)) >= 0:
        yield start, newline
        start = newline + 1
    yield start, len(text)


class _Joined:
    """Text written piece by piece, joined in blocks as it goes: no list of every piece."""

    _BLOCK = 1024

    def __init__(self) -> None:
        self._blocks: list[str] = []
        self._pieces: list[str] = []

    def write(self, piece: str) -> None:
        self._pieces.append(piece)
        if len(self._pieces) >= self._BLOCK:
            self._blocks.append("".join(self._pieces))
            self._pieces.clear()

    def value(self) -> str:
        return "".join([*self._blocks, *self._pieces])


def glue_headings(text: str, max_chars: int) -> str:
    """``text`` with the whitespace after each heading block turned into spaces (same length,
    so offsets hold); ``text`` itself when it has none. See the module docstring.

    One pass over the lines, a few at a time: a table of every line (or of every gap) costs
    ~130 bytes per line, 0.1-1.3 GiB for a 20 MB log or CSV file of short lines. The result is
    written as the pass goes.
    """
    if max_chars < 1 or "\n" not in text:
        return text

    def blank(line: tuple[int, int]) -> bool:
        return not text[line[0] : line[1]].strip()

    def heading(line: tuple[int, int]) -> bool:
        stripped = text[line[0] : line[1]].strip()
        return 0 < len(stripped) <= max_chars and not _SENTENCE_END.search(stripped)

    lines = _lines(text)
    glued: _Joined | None = None
    copied = 0  # text[:copied] is in `glued`
    line = next(lines, None)
    after_blank = True  # the first line starts a block as if a blank line came before it
    while line is not None:
        if not (after_blank and heading(line)):
            after_blank = blank(line)
            line = next(lines, None)
            continue
        first = line
        line = next(lines, None)
        block = 1
        while line is not None and block < HEADING_LINES and heading(line):
            block += 1
            line = next(lines, None)
        after_blank = False
        while line is not None and blank(line):
            after_blank = True
            line = next(lines, None)
        if line is not None and not heading(line):
            # from the end of the heading's first line to the start of the body
            glued = glued or _Joined()
            glued.write(text[copied : first[1]])
            gap = text[first[1] : line[0]]
            glued.write("".join(" " if ch.isspace() else ch for ch in gap))
            copied = line[0]
    if glued is None:
        return text
    glued.write(text[copied:])
    return glued.value()


# -- segments -----------------------------------------------------------------------------------

# Each boundary as "the last one before endpos": a greedy prefix backtracks from the end in C.
_LAST_BOUNDARY = tuple(re.compile(r"(?s:.*)(?:" + b.pattern + ")") for b in _SEGMENT_BOUNDARIES)


def segments(text: str, limit: int) -> Iterator[tuple[int, int]]:
    """``(lo, hi)`` spans covering ``text`` in order, each at most ``limit`` characters.

    A cut falls in the second half of the allowed span, at the last of the best boundary kind
    found there (module docstring); costs one pass over the text.
    """
    if limit < 2:
        raise ValueError("segment limit must be >= 2")
    lo, end = 0, len(text)
    while end - lo > limit:
        cut = _best_cut(text, lo + limit // 2, lo + limit)
        yield lo, cut
        lo = cut
    yield lo, end


def _best_cut(text: str, lo: int, hi: int) -> int:
    """A cut position in ``(lo, hi]``: after the last best boundary, else a hard cut."""
    for boundary in _LAST_BOUNDARY:
        found = boundary.match(text, lo, hi)
        if found is not None and found.end() > lo:
            return found.end()
    cut = hi
    while cut > lo + 1 and hi - cut < _MAX_CLUSTER and _inside_cluster(text, cut):
        cut -= 1
    return cut if not _inside_cluster(text, cut) else hi


def _inside_cluster(text: str, at: int) -> bool:
    """Whether a cut before ``text[at]`` would split a grapheme cluster (close enough)."""
    char, before = ord(text[at]), text[at - 1]
    return (
        before == "\u200d"  # zero-width joiner: the emoji sequence goes on
        or unicodedata.category(text[at]) in ("Mn", "Mc", "Me")  # combining marks
        or 0x1160 <= char <= 0x11FF  # Hangul jamo vowels and finals of a decomposed syllable
        or 0xD7B0 <= char <= 0xD7FF
        or char == 0x200D
        or 0xFE00 <= char <= 0xFE0F  # variation selectors
        or 0x1F3FB <= char <= 0x1F3FF  # skin-tone modifiers
        or 0xE0020 <= char <= 0xE007F  # tag characters (subdivision flags)
        or 0xE0100 <= char <= 0xE01EF
    )
