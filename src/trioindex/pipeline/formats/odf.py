"""OpenDocument text, spreadsheets and presentations (ODT, ODS, ODP) to text.

Read with zipfile and lxml under the package bounds (:mod:`.package`): ``content.xml`` is
streamed through :mod:`.flow`. Headings (``text:h``) become heading lines at their outline
level, a spreadsheet's sheets are headed by their names with each row a line, a presentation's
title frames are its slides' headings and its speaker notes follow each slide. Comments and
tracked deletions are left out; headers and footers (in ``styles.xml``) are not read. A
password-protected file (its manifest says ``content.xml`` is encrypted) is refused.
"""

from __future__ import annotations

import functools
from typing import Any

from trioindex.errors import ContentInvalid
from trioindex.pipeline.formats.flow import FlowTags, write_flow
from trioindex.pipeline.formats.messages import refused_as_corrupt
from trioindex.pipeline.formats.outline import Outline
from trioindex.pipeline.formats.package import ZipPackage, local_name

__all__ = ["odp_text", "ods_text", "odt_text"]

_TEXT_NS = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"
_TABLE_NS = "urn:oasis:names:tc:opendocument:xmlns:table:1.0"
_DRAW_NS = "urn:oasis:names:tc:opendocument:xmlns:drawing:1.0"
_PRESENTATION_NS = "urn:oasis:names:tc:opendocument:xmlns:presentation:1.0"
_FRAME = f"{{{_DRAW_NS}}}frame"
_MAX_SPACES = 64  # text:s c="n": n spaces, at most this many written


def _spaces(element: Any) -> str:
    count = element.get(f"{{{_TEXT_NS}}}c") or "1"
    return " " * min(int(count) if count.isdigit() else 1, _MAX_SPACES)


def _heading_level(paragraph: Any) -> int | None:
    if local_name(paragraph.tag) == "h":
        level = paragraph.get(f"{{{_TEXT_NS}}}outline-level") or "1"
        return int(level) if level.isdigit() else 1
    for frame in paragraph.iterancestors(_FRAME):
        if frame.get(f"{{{_PRESENTATION_NS}}}class") == "title":
            return 1
    return None


def _sheet_name(table: Any) -> str | None:
    parent = table.getparent()
    if parent is None or local_name(parent.tag) != "spreadsheet":
        return None  # a table in a text document has no heading of its own
    return table.get(f"{{{_TABLE_NS}}}name") or ""


_TAGS = FlowTags(
    paragraph=frozenset({"p", "h"}),
    row=frozenset({"table-row"}),
    cell=frozenset({"table-cell", "covered-table-cell"}),
    skip=frozenset({"annotation", "tracked-changes", "note-citation", "forms", "scripts"}),
    marks={
        "s": _spaces,
        "tab": lambda element: "\t",
        "line-break": lambda element: "\n",
        "soft-page-break": lambda element: "",
    },
    heading=_heading_level,
    start_heading={"table": _sheet_name},
)


def _encrypted(package: ZipPackage) -> bool:
    """Whether the manifest says ``content.xml`` is encrypted (a password-protected file)."""
    if "META-INF/manifest.xml" not in package.names:
        return False
    for entry in package.tree("META-INF/manifest.xml").iter("{*}file-entry"):
        path = next((v for k, v in entry.attrib.items() if k.endswith("}full-path")), "")
        if path == "content.xml" and entry.find("{*}encryption-data") is not None:
            return True
    return False


def _odf_text(kind: str, data: bytes, max_bytes: int, max_chars: int) -> str:
    """The body of an OpenDocument file (module docstring); ``kind`` names it in messages."""
    out = Outline(kind, max_chars)
    with refused_as_corrupt(kind):
        package = ZipPackage.open(data, kind, max_bytes)
        if _encrypted(package):
            raise ContentInvalid(f"{kind} is password-protected")
        write_flow(package.events("content.xml"), _TAGS, out)
    return out.text()


odt_text = functools.partial(_odf_text, "ODT")
ods_text = functools.partial(_odf_text, "ODS")
odp_text = functools.partial(_odf_text, "ODP")
