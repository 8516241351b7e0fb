"""XLSX to text: sheet by sheet, the sheet's name as a heading, each row a line of its
non-empty cells joined by ``" | "``.

Read with zipfile and lxml under the package bounds (:mod:`.package`): the workbook part gives
the sheets' order and names, the shared strings are read once, and each sheet is streamed row
by row (a sheet part of any size is read in memory near one row's worth). A cell shows the
value the file stores: text, a number as written (dates are serial numbers), ``TRUE`` /
``FALSE``, an error such as ``#DIV/0!``, or a formula's cached result.
"""

from __future__ import annotations

from trioindex.pipeline.formats.messages import refused_as_corrupt
from trioindex.pipeline.formats.ooxml import main_part, relationship_id, relationships
from trioindex.pipeline.formats.outline import Outline
from trioindex.pipeline.formats.package import ZipPackage, local_name, release

__all__ = ["xlsx_text"]

_CELL_SEPARATOR = " | "
_BOOLEANS = {"0": "FALSE", "1": "TRUE"}


def _shared_strings(package: ZipPackage, part: str | None) -> list[str]:
    """Every ``si`` of the shared-strings part, its runs joined (phonetic guides left out)."""
    strings: list[str] = []
    if part is None or part not in package.names:
        return strings
    pieces: list[str] = []
    phonetic = 0
    for event, element in package.events(part):
        name = local_name(element.tag)
        if name == "rPh":
            phonetic += 1 if event == "start" else -1
        elif event == "end" and name == "t" and not phonetic:
            pieces.append(element.text or "")
        elif event == "end" and name == "si":
            strings.append("".join(pieces))
            pieces.clear()
            release(element)
    return strings


def _sheet_rows(package: ZipPackage, part: str, strings: list[str], out: Outline) -> None:
    cells: list[str] = []
    kind = value = ""
    inline: list[str] = []
    for event, element in package.events(part):
        name = local_name(element.tag)
        if event == "start":
            if name == "c":
                kind, value = element.get("t") or "n", ""
                inline.clear()
            continue
        if name == "v":
            value = element.text or ""
        elif name == "t":
            inline.append(element.text or "")  # an inline string's runs
        elif name == "c":
            text = _cell_text(kind, value, inline, strings)
            if text.strip():
                cells.append(text.strip())
            release(element)
        elif name == "row":
            out.line(_CELL_SEPARATOR.join(cells))
            cells.clear()
            release(element)
    out.end_lines()


def _cell_text(kind: str, value: str, inline: list[str], strings: list[str]) -> str:
    if kind == "s":
        index = int(value) if value.isdigit() else -1
        return strings[index] if 0 <= index < len(strings) else ""
    if kind == "inlineStr":
        return "".join(inline)
    if kind == "b":
        return _BOOLEANS.get(value, value)
    return value  # n, str (a formula's text), e, d


def xlsx_text(data: bytes, max_bytes: int, max_chars: int) -> str:
    """The workbook's sheets in order (module docstring)."""
    out = Outline("XLSX", max_chars)
    with refused_as_corrupt("XLSX"):
        package = ZipPackage.open(data, "XLSX", max_bytes)
        workbook = main_part(package, "xl/workbook.xml")
        parts = relationships(package, workbook)
        shared = next((p for kind, p in parts.values() if kind == "sharedStrings"), None)
        strings = _shared_strings(package, shared)
        sheets = package.tree(workbook).find("{*}sheets")
        for sheet in () if sheets is None else sheets:
            kind, part = parts.get(relationship_id(sheet), ("", ""))
            if kind != "worksheet" or part not in package.names:
                continue  # a chart sheet, or a missing part
            out.heading(sheet.get("name") or "")
            _sheet_rows(package, part, strings, out)
    return out.text()
