"""Snippets at the match: the window of a chunk's sentences where the query's terms match best,
on one line, with the matched words' offsets.

:func:`passage` takes a chunk's text and the ``(start, end)`` offsets of the words the query
matched in it (:func:`match_offsets` reads them from the text PostgreSQL marked: the same
stems and Korean prefixes the text ranking matches, ``ts_headline``) and picks the run of
consecutive sentences, at most ``width`` characters once whitespace is collapsed, that holds the
most distinct matched words (then the most matches, then the earliest). A sentence longer than
the width is cut around its first match. An ellipsis marks each cut. Without a match the
passage is the chunk's start, as before matches were known.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import attrs

SNIPPET_WIDTH = 160
#: The characters PostgreSQL is asked to put around each matched word (private use: never in
#: stored text, which is what ``ts_headline`` returns around them).
MARK_START, MARK_STOP = "\ue000", "\ue001"

Span = tuple[int, int]

# a sentence ends after . ! ? (or their full-width forms) and spaces, or at a line break
_SENTENCE_END = re.compile(r"(?<=[.!?。！？])\s+|\n\s*")
_MARKED = re.compile(f"{MARK_START}(.*?){MARK_STOP}", re.S)


@attrs.frozen
class Passage:
    """A snippet and the ``[start, end)`` offsets (characters) of the matched words in it."""

    text: str
    highlights: tuple[Span, ...] = ()

    def styled(self, style: str = "\x1b[1m", reset: str = "\x1b[0m") -> str:
        """The snippet with each highlight between ``style`` and ``reset`` (bold by default)."""
        out, at = [], 0
        for start, end in self.highlights:
            out += [self.text[at:start], style, self.text[start:end], reset]
            at = end
        return "".join([*out, self.text[at:]])


def match_offsets(marked: str) -> tuple[str, tuple[Span, ...]]:
    """A text marked by ``ts_headline`` (:data:`MARK_START` / :data:`MARK_STOP`) without its
    marks, and the offsets of the marked words in it."""
    text, spans, at = [], [], 0
    for found in _MARKED.finditer(marked):
        text.append(marked[at : found.start()])
        start = sum(map(len, text))
        text.append(found.group(1))
        spans.append((start, start + len(found.group(1))))
        at = found.end()
    text.append(marked[at:])
    return "".join(text), tuple(spans)


def passage(text: str, matches: Sequence[Span] = (), width: int = SNIPPET_WIDTH) -> Passage:
    """The best window of ``text``'s sentences for ``matches`` (module docstring)."""
    sentences = _sentences(text)
    if not sentences:
        return Passage("")
    best: tuple[tuple[int, int, int], int, int] | None = None
    for i, (start, _) in enumerate(sentences):
        end = start
        for _, sentence_end in sentences[i:]:
            if end > start and _flat_length(text, start, sentence_end) > width:
                break
            end = sentence_end
        inside = [m for m in matches if start <= m[0] and m[1] <= end]
        score = (len({text[a:b].lower() for a, b in inside}), len(inside), -start)
        if best is None or score > best[0]:
            best = (score, start, end)
    assert best is not None
    _, start, end = best
    if not any(start <= m[0] and m[1] <= end for m in matches):
        start, end = sentences[0][0], sentences[-1][1]
    return _window(text, matches, start, end, width)


def _sentences(text: str) -> list[Span]:
    spans, at = [], 0
    for found in _SENTENCE_END.finditer(text):
        if text[at : found.start()].strip():
            spans.append((at, found.start()))
        at = found.end()
    if text[at:].strip():
        spans.append((at, len(text.rstrip())))
    return spans


def _flat_length(text: str, start: int, end: int) -> int:
    return len(" ".join(text[start:end].split()))


def _window(text: str, matches: Sequence[Span], start: int, end: int, width: int) -> Passage:
    """``text[start:end]`` on one line, cut to ``width`` around its first match, with the
    matches inside as offsets into it."""
    inside = sorted(m for m in matches if start <= m[0] and m[1] <= end)
    if _flat_length(text, start, end) > width and inside:
        # start a little before the first match, at a word
        lead = max(start, inside[0][0] - width // 4)
        while lead > start and not text[lead - 1].isspace():
            lead -= 1
        start = lead
    flat, position = _flatten(text, start, end)
    prefix = "…" if text[:start].strip() else ""
    cut_after = bool(text[end:].strip())
    room = width - len(prefix) - cut_after
    if len(flat) > room:
        flat, cut_after = flat[: width - len(prefix) - 1].rstrip(), True
    suffix = "…" if cut_after else ""
    highlights = tuple(
        (len(prefix) + position[a], len(prefix) + position[a] + (b - a))
        for a, b in inside
        if a in position and position[a] + (b - a) <= len(flat)
    )
    return Passage(prefix + flat + suffix, highlights)


def _flatten(text: str, start: int, end: int) -> tuple[str, dict[int, int]]:
    """``text[start:end]`` with runs of whitespace as one space, trimmed, and where each
    character that starts a word landed."""
    out: list[str] = []
    position: dict[int, int] = {}
    pending_space = False
    for i in range(start, end):
        ch = text[i]
        if ch.isspace():
            pending_space = bool(out)
            continue
        if pending_space:
            out.append(" ")
            pending_space = False
        position[i] = len(out)
        out.append(ch)
    return "".join(out), position
