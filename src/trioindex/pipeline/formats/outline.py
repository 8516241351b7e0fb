"""The text a structured document's reader writes: headings, paragraphs and lines, counted.

Every reader of a structured format (DOCX, PPTX, XLSX, OpenDocument, EPUB, HWP, RTF, e-mail)
writes through :class:`Outline`, so they share one layout and one bound:

* a paragraph is a block of its own, blocks are separated by a blank line (the chunker's best
  boundary);
* a heading (a slide title, a sheet name, a subject) is a Markdown heading line, ``# Title``,
  a block of its own: the chunker keeps a short block without a sentence end with the text
  after it (:func:`trioindex.pipeline.text_cuts.glue_headings`);
* lines (a table's rows, a sheet's rows) are one block, one line each;
* the text may not pass ``max_chars`` (the extracted-text limit in :mod:`.limits`).
"""

from __future__ import annotations

import re

from trioindex.errors import ContentInvalid

__all__ = ["Outline"]

_LINE_BREAKS = re.compile(r"[ \t]*[\r\n\v\f\u2028\u2029]+[ \t]*")
_SPACES = re.compile(r"[^\S\n]+")


class Outline:
    """Text being written block by block; :meth:`text` joins it."""

    def __init__(self, kind: str, max_chars: int) -> None:
        self._kind = kind
        self._max_chars = max_chars
        self._blocks: list[str] = []
        self._lines: list[str] = []
        self._chars = 0

    def _count(self, n: int) -> None:
        self._chars += n
        if self._chars > self._max_chars:
            raise ContentInvalid(f"{self._kind} text is implausibly large for the file size")

    def heading(self, text: str, level: int = 1) -> None:
        """A heading line (one line: its line breaks become spaces); blank ones are left out."""
        title = _SPACES.sub(" ", _LINE_BREAKS.sub(" ", text)).strip()
        if title:
            self.paragraph(f"{'#' * max(1, min(level, 6))} {title}")

    def paragraph(self, text: str) -> None:
        """A block of its own, without blank lines around it (blank ones are left out)."""
        text = text.strip("\r\n")
        if text.strip():
            self.end_lines()
            self._count(len(text) + 2)
            self._blocks.append(text)

    def line(self, text: str) -> None:
        """One line of the current block of lines (a table row, say); blank ones are left
        out, and line breaks inside become spaces, so each line stays one."""
        line = _LINE_BREAKS.sub(" ", text).rstrip()
        if line.strip():
            self._count(len(line) + 1)
            self._lines.append(line)

    def end_lines(self) -> None:
        """End the current block of lines: what comes next starts a new block."""
        if self._lines:
            self._blocks.append("\n".join(self._lines))
            self._lines = []

    def text(self) -> str:
        self.end_lines()
        return "\n\n".join(self._blocks)
