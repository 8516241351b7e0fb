"""HTML to its visible text, streamed through libxml2 (lxml) without building a tree.

Block elements become paragraph or line breaks (the chunker splits at them), table cells are
separated by a space, whitespace collapses as a browser shows it except inside ``<pre>``, and
scripts, styles and ``hidden`` elements are left out.
"""

from __future__ import annotations

import logging
import re
from typing import Any

# lxml (a dependency of python-docx) ships no type hints.
from lxml import etree  # type: ignore[import-untyped]

from trioindex.pipeline.formats.messages import failure_name

__all__ = ["html_text"]

# The package's logger: the parser modules log under one name, as when they were one module.
logger = logging.getLogger(__package__)

# Elements whose content is not visible text.
_HTML_SKIP = frozenset({"script", "style", "noscript", "template", "iframe", "object", "svg"})
# Elements that start a new paragraph (blank line) or a new line.
_HTML_PARAGRAPH = frozenset(
    {
        "p", "h1", "h2", "h3", "h4", "h5", "h6", "blockquote", "pre", "table", "ul", "ol",
        "dl", "figure", "hr", "title", "article", "section", "header", "footer", "aside",
        "nav", "main", "address", "details", "fieldset", "form",
    }
)  # fmt: skip
_HTML_LINE = frozenset(
    {
        "div", "li", "tr", "dt", "dd", "caption", "figcaption", "summary", "legend", "option",
        "body", "center", "thead", "tbody", "tfoot",
    }
)  # fmt: skip
_HTML_CELL = frozenset({"td", "th"})
_HTML_PREFORMATTED = frozenset({"pre", "textarea", "listing", "plaintext", "xmp"})
_ASCII_WHITESPACE = re.compile(r"[ \t\n\r\f]+")


class _VisibleText:
    """lxml parser target that streams the visible text of an HTML document.

    A streaming target (no tree) keeps memory near the size of the output: BeautifulSoup
    builds Python objects per node and needs ~60x the input size, and Python's html.parser
    is quadratic on some malformed input in 3.11. libxml2 (via lxml) is robust and pairs
    every start with an end event, closing unclosed elements itself.
    """

    def __init__(self, skip: frozenset[str] = _HTML_SKIP) -> None:
        self._skip = skip
        self._out: list[str] = []
        self._stack: list[tuple[bool, bool]] = []  # (skipped, preformatted) per open element
        self._skip_depth = 0
        self._pre_depth = 0
        self._pending_breaks = 0
        self._pending_space = False

    @staticmethod
    def _local(tag: Any) -> str:
        return tag.rsplit("}", 1)[-1].lower() if isinstance(tag, str) else ""

    def _request_break(self, count: int) -> None:
        if self._out:
            self._pending_breaks = max(self._pending_breaks, count)
        self._pending_space = False

    def _emit(self, text: str) -> None:
        if self._pending_breaks:
            self._out.append("\n" * self._pending_breaks)
        elif self._pending_space and self._out:
            self._out.append(" ")
        self._pending_breaks = 0
        self._pending_space = False
        self._out.append(text)

    def start(self, tag: Any, attrib: Any) -> None:
        name = self._local(tag)
        skipped = name in self._skip or (attrib is not None and "hidden" in attrib)
        pre = name in _HTML_PREFORMATTED
        self._stack.append((skipped, pre))
        self._skip_depth += skipped
        self._pre_depth += pre
        self._block(name)
        if name == "br" and not self._skip_depth:
            if self._out:
                self._pending_breaks = min(self._pending_breaks + 1, 2)
            self._pending_space = False

    def end(self, tag: Any) -> None:
        name = self._local(tag)
        if self._stack:
            skipped, pre = self._stack.pop()
            self._skip_depth -= skipped
            self._pre_depth -= pre
        self._block(name)

    def _block(self, name: str) -> None:
        if self._skip_depth:
            return
        if name in _HTML_PARAGRAPH:
            self._request_break(2)
        elif name in _HTML_LINE:
            self._request_break(1)
        elif name in _HTML_CELL:
            self._pending_space = True

    def data(self, data: str) -> None:
        if self._skip_depth or not data:
            return
        if self._pre_depth:
            self._emit(data)
            return
        collapsed = _ASCII_WHITESPACE.sub(" ", data)
        if collapsed.startswith(" "):
            self._pending_space = True
        words = collapsed.strip(" ")
        if words:
            self._emit(words)
            self._pending_space = collapsed.endswith(" ")

    def comment(self, text: str) -> None:
        pass

    def close(self) -> str:
        return "".join(self._out)


def html_text(markup: str, *, title: bool = True) -> str:
    """The visible text of ``markup`` (decoded and normalised already: libxml2 takes no NULs);
    ``title=False`` leaves the ``<title>`` out (an e-book's chapters repeat the book's)."""
    target = _VisibleText(_HTML_SKIP if title else _HTML_SKIP | {"title"})
    parser = etree.HTMLParser(
        target=target, recover=True, no_network=True, huge_tree=True, remove_comments=True
    )
    try:
        parser.feed(markup)
        result = parser.close()
    except MemoryError:
        raise
    except Exception as exc:
        # libxml2 recovers from almost anything; it gives up on input such as an empty
        # document. Whatever the target collected until then is still the visible text.
        logger.debug("lxml stopped parsing HTML: %s", failure_name(exc))
        result = target.close()
    return str(result)
