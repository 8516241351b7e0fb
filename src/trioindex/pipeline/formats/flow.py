"""Streamed XML of paragraphs, tables and notes into an :class:`~.outline.Outline`.

PPTX slides, OpenDocument and HWPX keep their text the same way: paragraph elements holding
runs of text, tables of rows of cells whose cells hold paragraphs again, and notes, text boxes
and tables anchored *inside* a paragraph. :func:`write_flow` reads one part's events
(:meth:`.package.ZipPackage.events`) and writes:

* each top-level paragraph as a paragraph (or a heading, when the format says so);
* each table row as one line, its non-empty cells joined by ``" | "``;
* what was nested in a paragraph (a footnote's paragraphs, a table anchored in it) right after
  that paragraph, in document order.

Every paragraph, cell and row is dropped from the tree once written (:func:`.package.release`),
so a part of any size is read in memory near one paragraph's worth.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs

from trioindex.pipeline.formats.outline import Outline
from trioindex.pipeline.formats.package import local_name, release

__all__ = ["FlowTags", "write_flow"]

CELL_SEPARATOR = " | "


@attrs.frozen
class FlowTags:
    """How one format marks its flow of text (local names, namespaces ignored)."""

    paragraph: frozenset[str]
    row: frozenset[str]
    cell: frozenset[str]
    # elements whose own text is text (None: every text node inside a paragraph is)
    text: frozenset[str] | None = None
    # elements left out with everything inside (comments, fields' instructions, ...)
    skip: frozenset[str] = frozenset()
    # empty elements that stand for text: a tab, a line break, n spaces
    marks: Mapping[str, Callable[[Any], str]] = attrs.field(factory=dict)
    # the heading level of a paragraph element, None for a plain one
    heading: Callable[[Any], int | None] = lambda element: None
    # elements that start a section headed by what the callable returns (a sheet's name)
    start_heading: Mapping[str, Callable[[Any], str | None]] = attrs.field(factory=dict)
    # whether a paragraph is kept, decided at its end, when its ancestors' earlier children
    # are known (a slide-number placeholder's paragraphs are not)
    keep: Callable[[Any], bool] = lambda element: True


class _Flow:
    def __init__(self, tags: FlowTags, out: Outline) -> None:
        self.tags = tags
        self.out = out
        self.stack: list[str] = []  # "p", "cell", "row" for each open container
        self.cells: list[list[str]] = []  # the texts of each open cell
        self.rows: list[list[str]] = []  # the cell texts of each open row
        self.pending: list[tuple[str, str]] = []  # nested in the open top paragraph
        self.skipping = 0

    def start(self, element: Any) -> None:
        name = local_name(element.tag)
        tags = self.tags
        if self.skipping or name in tags.skip:
            self.skipping += 1
        elif name in tags.paragraph:
            self.stack.append("p")
        elif name in tags.cell:
            self.stack.append("cell")
            self.cells.append([])
        elif name in tags.row:
            self.stack.append("row")
            self.rows.append([])
        elif name in tags.start_heading and not self.stack:
            heading = tags.start_heading[name](element)
            if heading is not None:
                self.out.heading(heading)

    def end(self, element: Any) -> None:
        name = local_name(element.tag)
        tags = self.tags
        if self.skipping:
            self.skipping -= 1
            if not self.skipping:
                release(element)
            return
        if name in tags.paragraph:
            self.stack.pop()
            self._paragraph(element)
        elif name in tags.cell:
            self.stack.pop()
            text = " ".join(t for t in self.cells.pop() if t)
            self._into_parent(text, "cell")
        elif name in tags.row:
            self.stack.pop()
            line = CELL_SEPARATOR.join(t for t in self.rows.pop() if t.strip())
            self._into_parent(line, "line")
        else:
            return
        release(element)

    def _paragraph(self, element: Any) -> None:
        text = "".join(_own_text(element, self.tags)) if self.tags.keep(element) else ""
        if self.stack:
            self._into_parent(text, "p")
            return
        level = self.tags.heading(element)
        if level is None:
            self.out.paragraph(text)
        else:
            self.out.heading(text, level)
        for kind, nested in self.pending:
            if kind == "line":
                self.out.line(nested)
            else:
                self.out.paragraph(nested)
        self.pending.clear()

    def _into_parent(self, text: str, kind: str) -> None:
        """Hand a finished paragraph, cell or row line to the container it is in."""
        parent = self.stack[-1] if self.stack else None
        if parent == "cell":
            self.cells[-1].append(text)
        elif parent == "row":
            self.rows[-1].append(text)
        elif parent == "p":
            self.pending.append((kind, text))
        elif kind == "line":
            self.out.line(text)
        else:
            self.out.paragraph(text)


def _own_text(paragraph: Any, tags: FlowTags) -> Iterable[str]:
    """The text of ``paragraph`` itself: what nested paragraphs, cells and rows held is
    written already (and dropped from the tree), skipped elements are left out."""
    nested = tags.paragraph | tags.cell | tags.row

    def walk(element: Any, counted: bool) -> Iterable[str]:
        for child in element:
            name = local_name(child.tag)
            if name in tags.marks:
                yield tags.marks[name](child)
            elif name not in nested and name not in tags.skip:
                inside = counted if tags.text is None else (counted or name in tags.text)
                if inside and child.text:
                    yield child.text
                yield from walk(child, inside)
            if counted and child.tail:
                yield child.tail

    if tags.text is None and paragraph.text:
        yield paragraph.text
    yield from walk(paragraph, tags.text is None)


def write_flow(events: Iterable[tuple[str, Any]], tags: FlowTags, out: Outline) -> None:
    """Write the paragraphs and tables of one XML part's ``events`` to ``out``."""
    flow = _Flow(tags, out)
    for event, element in events:
        if event == "start":
            flow.start(element)
        else:
            flow.end(element)
    out.end_lines()
