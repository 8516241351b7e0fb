"""RTF to text: the body's paragraphs, table rows as lines, in the code pages the file names.

One pass over the control words, groups and text (no tree). Text comes out of the body and of
its footnotes, headers and footers; destinations that are not text (the font, colour and style
tables, document information, pictures, embedded objects' data, field instructions, and every
``\\*`` destination a reader may ignore) are skipped with everything inside them. Bytes given
as ``\\'hh`` (or raw) are decoded in the code page of the current font (``\\fcharset``) or of
the document (``\\ansicpg``): two bytes of CP949 make one Hangul syllable. ``\\uN`` is a UTF-16
unit, its fallback characters (``\\ucN``) skipped; a surrogate pair makes one character.

Groups nest at most :data:`RTF_MAX_DEPTH` deep; the text is bounded like every format's.
"""

from __future__ import annotations

import codecs
import re

import attrs

from trioindex.errors import ContentInvalid
from trioindex.pipeline.formats.limits import RTF_MAX_DEPTH
from trioindex.pipeline.formats.messages import refused_as_corrupt
from trioindex.pipeline.formats.outline import Outline

__all__ = ["rtf_text"]

_TOKEN = re.compile(
    rb"\\([a-zA-Z]{1,32})(-?\d{1,10})? ?"  # a control word, its parameter, its delimiter
    rb"|\\'([0-9a-fA-F]{2})"  # a byte in hex
    rb"|\\([^a-zA-Z'])"  # a control symbol
    rb"|([{}])"
    rb"|([\r\n]+)"  # line ends are not text in RTF
    rb"|([^\\{}\r\n]+)",  # text
    re.DOTALL,
)
# Destinations whose content is not text.
_SKIPPED = frozenset(
    {
        "fonttbl", "colortbl", "stylesheet", "info", "pict", "objdata", "objclass", "fldinst",
        "themedata", "colorschememapping", "datastore", "latentstyles", "listtable",
        "listoverridetable", "rsidtbl", "generator", "xmlnstbl", "mmathPr", "filetbl",
        "revtbl", "userprops", "docvar", "listtext", "pntext", "pntxta", "pntxtb", "sp",
        "nonshppict", "bkmkstart", "bkmkend", "template", "pgdsctbl", "protusertbl",
    }
)  # fmt: skip
_WORD_TEXT = {
    "tab": "\t", "line": "\n", "emdash": "\u2014", "endash": "\u2013", "bullet": "\u2022",
    "lquote": "\u2018", "rquote": "\u2019", "ldblquote": "\u201c", "rdblquote": "\u201d",
    "emspace": "\u2003", "enspace": "\u2002", "qmspace": "\u2005",
}  # fmt: skip
_SYMBOL_TEXT = {b"~": "\u00a0", b"_": "\u2011", b"-": "", b"\\": "\\", b"{": "{", b"}": "}"}
_PARAGRAPH_ENDS = frozenset({"par", "sect", "page"})
_NEEDS_PARAMETER = frozenset({"ansicpg", "deff", "f", "u", "uc"})
_CELL_SEPARATOR = " | "
# \fcharsetN -> the code page its bytes are in (Windows code pages, as Word writes them)
_CHARSETS = {
    0: "cp1252", 128: "cp932", 129: "cp949", 130: "johab", 134: "gb18030", 136: "cp950",
    161: "cp1253", 162: "cp1254", 163: "cp1258", 177: "cp1255", 178: "cp1256", 186: "cp1257",
    204: "cp1251", 222: "cp874", 238: "cp1250",
}  # fmt: skip


@attrs.define
class _Group:
    """What a group inherits from its parent and may change."""

    skipped: bool = False
    font: int | None = None
    unicode_skip: int = 1  # \ucN: fallback characters after each \uN
    font_table: bool = False


def _codec(name: str) -> str:
    try:
        return codecs.lookup(name).name
    except LookupError:
        return "cp1252"


class _Reader:
    """The state of one pass: groups, code pages, the paragraph and table row being read."""

    def __init__(self, out: Outline) -> None:
        self.out = out
        self.groups = [_Group()]
        self.document_codec = "cp1252"
        self.font_codecs: dict[int, str] = {}
        self.default_font: int | None = None
        self.defining_font: int | None = None
        self.text: list[str] = []  # the paragraph being read
        self.pending = bytearray()  # bytes decoded together (a DBCS pair is one character)
        self.pending_codec = "cp1252"
        self.in_table = False  # \intbl: this paragraph is in a table cell
        self.cell: list[str] = []  # the paragraphs of the cell being read
        self.cells: list[str] = []  # the cells of the row being read
        self.to_skip = 0  # fallback characters of a \uN still to skip

    @property
    def group(self) -> _Group:
        return self.groups[-1]

    def _codec(self) -> str:
        font = self.group.font if self.group.font is not None else self.default_font
        return (
            self.font_codecs.get(font, self.document_codec)
            if font is not None
            else (self.document_codec)
        )

    def _flush_bytes(self) -> None:
        if self.pending:
            self.text.append(self.pending.decode(self.pending_codec, "replace"))
            self.pending.clear()

    def add_bytes(self, data: bytes) -> None:
        if self.group.skipped:
            return
        codec = self._codec()
        if codec != self.pending_codec:
            self._flush_bytes()
            self.pending_codec = codec
        self.pending += data

    def add_text(self, text: str) -> None:
        if not self.group.skipped:
            self._flush_bytes()
            self.text.append(text)

    def _take_paragraph(self) -> str:
        self._flush_bytes()
        joined = "".join(self.text)
        self.text.clear()
        # \uN units: a surrogate pair becomes one character, a lone surrogate U+FFFD
        return joined.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")

    def end_paragraph(self) -> None:
        text = self._take_paragraph()
        if self.in_table:
            self.cell.append(text)  # a cell of several paragraphs
        else:
            self.out.paragraph(text)

    def end_cell(self) -> None:
        self.cell.append(self._take_paragraph())
        self.cells.append(" ".join(t.strip() for t in self.cell if t.strip()))
        self.cell.clear()

    def end_row(self) -> None:
        if self.text or self.pending or self.cell:
            self.end_cell()
        self.out.line(_CELL_SEPARATOR.join(c for c in self.cells if c))
        self.cells.clear()
        self.in_table = False

    def open_group(self) -> None:
        if len(self.groups) > RTF_MAX_DEPTH:
            raise ContentInvalid(f"RTF groups nest deeper than {RTF_MAX_DEPTH} levels (the limit)")
        self._flush_bytes()
        self.groups.append(attrs.evolve(self.group))
        self.to_skip = 0

    def close_group(self) -> None:
        self._flush_bytes()
        if len(self.groups) > 1:
            self.groups.pop()
        self.to_skip = 0

    def word(self, name: str, parameter: int | None) -> None:
        group = self.group
        if name == "fonttbl":
            group.font_table = group.skipped = True
        elif name in _SKIPPED:
            group.skipped = True
        elif group.font_table:
            if name == "f":
                self.defining_font = parameter
            elif name == "fcharset" and self.defining_font is not None and parameter in _CHARSETS:
                self.font_codecs[self.defining_font] = _codec(_CHARSETS[parameter])
        elif group.skipped or (parameter is None and name in _NEEDS_PARAMETER):
            return
        elif name == "ansicpg":
            self.document_codec = _codec(f"cp{parameter}")
        elif name == "deff":
            self.default_font = parameter
        elif name == "f":
            group.font = parameter
        elif name == "uc":
            group.unicode_skip = max(0, parameter or 0)
        elif name == "u":
            unit = parameter or 0
            self.add_text(chr(unit + 0x10000 if unit < 0 else unit))
            self.to_skip = group.unicode_skip
        elif name in _PARAGRAPH_ENDS:
            self.end_paragraph()
        elif name == "intbl":
            self.in_table = True
        elif name in ("cell", "nestcell"):
            self.end_cell()
        elif name in ("row", "nestrow"):
            self.end_row()
        elif name in _WORD_TEXT:
            self.add_text(_WORD_TEXT[name])

    def symbol(self, symbol: bytes) -> None:
        if symbol == b"*":
            self.group.skipped = True  # an ignorable destination: this reader ignores it
        elif symbol in (b"\n", b"\r"):
            self.end_paragraph()
        elif symbol in _SYMBOL_TEXT:
            self.add_text(_SYMBOL_TEXT[symbol])

    def finish(self) -> None:
        self.end_paragraph()
        if self.cell or self.cells:
            self.end_row()


def rtf_text(data: bytes, max_bytes: int, max_chars: int) -> str:
    """The text of an RTF document (module docstring)."""
    out = Outline("RTF", max_chars)
    reader = _Reader(out)
    pos = 0
    with refused_as_corrupt("RTF"):
        while (token := _TOKEN.match(data, pos)) is not None:
            pos = token.end()
            word, parameter, hex_byte, symbol, brace, _line_end, text = token.groups()
            if word == b"bin":
                pos += max(0, int(parameter or 0))  # binary data: never text
            elif brace is not None:
                (reader.open_group if brace == b"{" else reader.close_group)()
            elif text is not None:
                skip = min(reader.to_skip, len(text))
                reader.to_skip -= skip
                reader.add_bytes(text[skip:])
            elif _line_end is not None:
                continue
            elif reader.to_skip and word != b"u":
                reader.to_skip -= 1  # a fallback character (a control counts as one)
            elif word is not None:
                reader.word(word.decode("ascii"), int(parameter) if parameter else None)
            elif hex_byte is not None:
                reader.add_bytes(bytes.fromhex(hex_byte.decode("ascii")))
            else:
                reader.symbol(symbol)
        reader.finish()
    return out.text()
