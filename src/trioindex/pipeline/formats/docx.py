"""DOCX to text with python-docx, its ZIP package checked for inflation first.

A DOCX is a ZIP of XML, and a small one can inflate to gigabytes: the package is refused by
the sizes it declares, then by counting while inflating every part (:mod:`.package`), before
python-docx parses anything (the caps are in :mod:`.limits`; python-docx parses every XML part
into a tree, so the XML of the whole package is capped, and the main part's nesting is checked
first). The text is every paragraph in
document order — body, tables, text boxes, content controls — one paragraph each.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from typing import Any

import docx
from docx.text.paragraph import Paragraph

from trioindex.pipeline.formats.messages import refused_as_corrupt
from trioindex.pipeline.formats.outline import Outline
from trioindex.pipeline.formats.package import ZipPackage

__all__ = ["docx_text"]

# The package's logger: the parser modules log under one name, as when they were one module.
logger = logging.getLogger(__package__)

_W_NS = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
_MC_NS = "http://schemas.openxmlformats.org/markup-compatibility/2006"


def _docx_paragraphs(document: Any) -> Iterator[str]:
    body = document.element.body
    fallback = f"{{{_MC_NS}}}Fallback"
    # Every w:p in document order: body text, table cells, text boxes, content controls.
    # Text boxes appear twice (modern mc:Choice and legacy mc:Fallback); keep the first.
    for p in body.iter(f"{{{_W_NS}}}p"):
        if any(ancestor.tag == fallback for ancestor in p.iterancestors()):
            continue
        yield Paragraph(p, document).text


def docx_text(data: bytes, max_bytes: int, max_chars: int) -> str:
    """The non-blank paragraphs of a Word document, separated by blank lines."""
    with refused_as_corrupt("DOCX"):
        package = ZipPackage.open(data, "DOCX", max_bytes, cap_all_xml=True)
        package.verify()
        package.check_depth("word/document.xml")
        # python-docx: KeyError, ValueError, BadZipFile, lxml errors, ...
        document = docx.Document(io.BytesIO(data))
        out = Outline("DOCX", max_chars)
        for text in _docx_paragraphs(document):
            out.paragraph(text)
    return out.text()
