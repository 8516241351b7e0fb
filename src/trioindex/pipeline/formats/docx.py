"""DOCX to text with python-docx, its ZIP package checked for inflation first.

A DOCX is a ZIP of XML, and a small one can inflate to gigabytes: :func:`_check_docx_package`
refuses it by the sizes it declares, then by counting while inflating, before python-docx
parses anything (the caps are in :mod:`.limits`). The text is every paragraph in document
order — body, tables, text boxes, content controls — one paragraph each.
"""

from __future__ import annotations

import io
import logging
import zipfile
from collections.abc import Iterator
from typing import Any

import attrs
import docx
from docx.text.paragraph import Paragraph

from trioindex.errors import ContentInvalid
from trioindex.pipeline.formats.limits import (
    DOCX_EXPANSION_LIMIT,
    DOCX_EXPANSION_RATIO,
    DOCX_MAX_ENTRIES,
    DOCX_MAX_XML_BYTES,
    DOCX_MIN_UNCOMPRESSED_CAP,
    DOCX_READ_BLOCK,
)
from trioindex.pipeline.formats.messages import failure_name, size_text

__all__ = ["docx_text"]

# The package's logger: the parser modules log under one name, as when they were one module.
logger = logging.getLogger(__package__)

_W_NS = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
_MC_NS = "http://schemas.openxmlformats.org/markup-compatibility/2006"


def _docx_caps(size: int, max_bytes: int) -> int:
    """Total uncompressed bytes a DOCX of ``size`` bytes may hold (see :mod:`.limits`)."""
    relative = max(DOCX_MIN_UNCOMPRESSED_CAP, DOCX_EXPANSION_RATIO * size)
    return min(relative, max(DOCX_EXPANSION_LIMIT * max_bytes, DOCX_MIN_UNCOMPRESSED_CAP))


def _is_xml_part(name: str) -> bool:
    return name.endswith((".xml", ".rels"))


def _check_docx_package(data: bytes, max_bytes: int) -> None:
    """Refuse a ZIP that would inflate past the caps: first by the sizes it declares, before
    inflating anything; then by inflating each part in blocks and counting. A forged size
    cannot get past: zipfile stops a part at its declared size and fails its CRC (corrupt).

    Nothing is kept: one streaming pass, one block of memory, every part's CRC verified.
    """
    cap = _docx_caps(len(data), max_bytes)
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            infos = archive.infolist()
            if len(infos) > DOCX_MAX_ENTRIES:
                raise ContentInvalid(f"corrupt DOCX: {len(infos)} package parts")
            declared = _DocxInflation(len(data), cap)
            for info in infos:
                declared.add(info.filename, info.file_size)
            counted = _DocxInflation(len(data), cap)
            for info in infos:
                with archive.open(info) as part:
                    while block := part.read(DOCX_READ_BLOCK):
                        counted.add(info.filename, len(block))
    except ContentInvalid:
        raise
    except MemoryError:
        raise
    except Exception as exc:  # BadZipFile (CRC, truncation), zlib.error, NotImplementedError, ...
        raise ContentInvalid(f"corrupt DOCX ({failure_name(exc)})") from exc


@attrs.define
class _DocxInflation:
    """Running totals of a DOCX package's uncompressed bytes, checked against the caps."""

    file_size: int
    cap: int
    total: int = 0
    xml: int = 0

    def add(self, name: str, n: int) -> None:
        self.total += n
        if _is_xml_part(name):
            self.xml += n
        if self.total > self.cap:
            raise ContentInvalid(
                f"DOCX expands to more than {size_text(self.cap)} (the limit for a "
                f"{size_text(self.file_size)} file); decompression bomb or oversized"
            )
        if self.xml > DOCX_MAX_XML_BYTES:
            raise ContentInvalid(
                f"DOCX holds more than {size_text(DOCX_MAX_XML_BYTES)} of XML (the limit); "
                "decompression bomb or oversized"
            )


def _docx_paragraphs(document: Any) -> Iterator[str]:
    body = document.element.body
    fallback = f"{{{_MC_NS}}}Fallback"
    # Every w:p in document order: body text, table cells, text boxes, content controls.
    # Text boxes appear twice (modern mc:Choice and legacy mc:Fallback); keep the first.
    for p in body.iter(f"{{{_W_NS}}}p"):
        if any(ancestor.tag == fallback for ancestor in p.iterancestors()):
            continue
        text = Paragraph(p, document).text
        if text.strip():
            yield text


def docx_text(data: bytes, max_bytes: int, max_chars: int) -> str:
    """The non-blank paragraphs of a Word document, separated by blank lines."""
    _check_docx_package(data, max_bytes)
    try:
        document = docx.Document(io.BytesIO(data))
        parts: list[str] = []
        total = 0
        for text in _docx_paragraphs(document):
            total += len(text) + 2
            if total > max_chars:
                raise ContentInvalid("DOCX text is implausibly large for the file size")
            parts.append(text)
    except ContentInvalid:
        raise
    except MemoryError:
        raise
    except Exception as exc:  # python-docx: KeyError, ValueError, BadZipFile, lxml errors, ...
        logger.debug("python-docx failed: %s", failure_name(exc))
        raise ContentInvalid(f"corrupt DOCX ({failure_name(exc)})") from exc
    return "\n\n".join(parts)
