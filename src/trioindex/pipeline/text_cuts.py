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


def glue_headings(text: str, max_chars: int) -> str:
    """``text`` with the whitespace after each heading block turned into spaces (same length,
    so offsets hold); ``text`` itself when it has none. See the module docstring."""
    if max_chars < 1 or "\n" not in text:
        return text
    lines: list[tuple[int, int]] = []  # (start, end) of each line, without its newline
    start = 0
    while True:
        newline = text.find("\n", start)
        lines.append((start, len(text) if newline < 0 else newline))
        if newline < 0:
            break
        start = newline + 1
    blank = [not text[a:b].strip() for a, b in lines]

    def heading(n: int) -> bool:
        line = text[lines[n][0] : lines[n][1]].strip()
        return 0 < len(line) <= max_chars and not _SENTENCE_END.search(line)

    spaces: list[tuple[int, int]] = []
    n = 0
    while n < len(lines):
        if not (heading(n) and (n == 0 or blank[n - 1])):
            n += 1
            continue
        last = n
        while last + 1 < len(lines) and last + 1 - n < HEADING_LINES and heading(last + 1):
            last += 1
        body = last + 1
        while body < len(lines) and blank[body]:
            body += 1
        if body < len(lines) and not heading(body):
            # from the end of the heading's first line to the start of the body
            spaces.append((lines[n][1], lines[body][0]))
        n = body
    if not spaces:
        return text
    parts: list[str] = []
    at = 0
    for lo, hi in spaces:
        parts.append(text[at:lo])
        gap = text[lo:hi]
        parts.append("".join(" " if ch.isspace() else ch for ch in gap))
        at = hi
    parts.append(text[at:])
    return "".join(parts)


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
