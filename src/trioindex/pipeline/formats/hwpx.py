"""HWPX (Hangul's OWPML, a ZIP of XML) to text: every section's paragraphs in order, with
the tables, headers, footers, footnotes, endnotes and text boxes anchored in them.

Read with zipfile and lxml under the package bounds (:mod:`.package`): the sections
(``Contents/section0.xml``, ``section1.xml``, ...) are streamed through :mod:`.flow`, text
coming only from ``hp:t`` elements (a field's parameters, a shape's name are not text; ruby
text shows its main text), table
rows as lines. What is anchored in a paragraph follows it: a header defined in the first
paragraph comes right after that paragraph's text. Memos and the preview text are not read.
"""

from __future__ import annotations

import re

from trioindex.errors import ContentInvalid
from trioindex.pipeline.formats.flow import FlowTags, write_flow
from trioindex.pipeline.formats.messages import refused_as_corrupt
from trioindex.pipeline.formats.outline import Outline
from trioindex.pipeline.formats.package import ZipPackage

__all__ = ["hwpx_text"]

_SECTION = re.compile(r"Contents/section(\d+)\.xml")

_TAGS = FlowTags(
    paragraph=frozenset({"p"}),
    row=frozenset({"tr"}),
    cell=frozenset({"tc"}),
    text=frozenset({"t", "mainText"}),  # a run's text; ruby text (dutmal) shows its main text
    skip=frozenset({"hiddenComment", "parameters", "subText"}),
    marks={
        "tab": lambda element: "\t",
        "lineBreak": lambda element: "\n",
        "nbSpace": lambda element: "\u00a0",
        "fwSpace": lambda element: " ",
        "hyphen": lambda element: "-",
    },
)


def hwpx_text(data: bytes, max_bytes: int, max_chars: int) -> str:
    """The document's text, section by section (module docstring)."""
    out = Outline("HWPX", max_chars)
    with refused_as_corrupt("HWPX"):
        package = ZipPackage.open(data, "HWPX", max_bytes)
        numbered = [(m, name) for name in package.names if (m := _SECTION.fullmatch(name))]
        if not numbered:
            raise ContentInvalid("corrupt HWPX: no section")
        for _, section in sorted(numbered, key=lambda found: int(found[0].group(1))):
            write_flow(package.events(section), _TAGS, out)
    return out.text()
