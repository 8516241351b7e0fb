"""HWP 5.0 (Hangul's binary format, an OLE2 compound file) to text: the paragraph text records
of every body-text section, in order.

The ``FileHeader`` stream says whether the sections are compressed and whether the document
is password-protected, a distribution document (its text encrypted for viewing only) or under
DRM: those are refused, naming why. Each ``BodyText/SectionN`` stream is raw deflate (or
stored), inflated in blocks and never past the ZIP packages' cap (:func:`.package.inflation_cap`,
all sections together). Its records are read one after another; each ``HWPTAG_PARA_TEXT``
(tag 67) is one paragraph's UTF-16LE text with inline controls: characters below 32 are
either one unit (a line break, a hyphen, a fixed space, the paragraph end) or eight (a
control such as a table, a footnote or a field, whose own paragraphs follow as records of
their own: table cells, headers, footers and notes are read in stream order). A Korean text is
copied unit for unit; nothing is guessed.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable, Iterator
from typing import Any

import olefile

from trioindex.errors import ContentInvalid
from trioindex.pipeline.formats.compressed import CutShort, OverCap, inflate_into
from trioindex.pipeline.formats.messages import refused_as_corrupt, size_text
from trioindex.pipeline.formats.outline import Outline
from trioindex.pipeline.formats.package import inflation_cap

__all__ = ["hwp_text"]

_SIGNATURE = b"HWP Document File"
# FileHeader properties (offset 36), HWP 5.0 file format revision 1.3
_COMPRESSED = 1 << 0
_PASSWORD = 1 << 1
_DISTRIBUTION = 1 << 2
_DRM = 1 << 4
_CERTIFICATE_DRM = 1 << 9
_PARA_TEXT = 67  # HWPTAG_BEGIN (16) + 51
_SECTION = re.compile(r"Section(\d+)")
# A paragraph's text, in aligned UTF-16LE units: a run of characters (32 and above), a control
# of eight units (codes 1-9, 11-12, 14-23: the code, six units of parameters, the code again),
# or a control of one unit (0, 10, 13, 24-31, or any code cut short at the end).
_UNITS = re.compile(
    rb"((?:[\x20-\xff][\x00-\xff]|[\x00-\x1f][\x01-\xff])+)"
    rb"|([\x01-\x09\x0b\x0c\x0e-\x17]\x00[\x00-\xff]{14})"
    rb"|([\x00-\x1f]\x00)",
)
_ONE_UNIT = {10: "\n", 24: "-", 30: "\u00a0", 31: " "}  # line break, hyphen, bound/fixed spaces
_EIGHT_UNITS = {9: "\t"}  # a tab is an inline control; the others stand for objects


def _paragraph_text(payload: bytes) -> str:
    """The text of one PARA_TEXT record: characters kept, controls as what they show."""
    pieces: list[str] = []
    for run, wide, narrow in _UNITS.findall(payload[: len(payload) & ~1]):
        if run:
            pieces.append(run.decode("utf-16-le", "surrogatepass"))
        elif wide:
            pieces.append(_EIGHT_UNITS.get(wide[0], ""))
        else:
            pieces.append(_ONE_UNIT.get(narrow[0], ""))
    return "".join(pieces)


def _records(stream: bytes | bytearray) -> Iterator[tuple[int, bytes]]:
    """``(tag, payload)`` of each record: a 32-bit header (tag: 10 bits, level: 10, size: 12;
    size 0xFFF: a 32-bit size follows)."""
    view = memoryview(stream)
    pos = 0
    while pos + 4 <= len(view):
        header = int.from_bytes(view[pos : pos + 4], "little")
        pos += 4
        size = header >> 20
        if size == 0xFFF:
            if pos + 4 > len(view):
                break
            size = int.from_bytes(view[pos : pos + 4], "little")
            pos += 4
        if pos + size > len(view):
            raise ContentInvalid("corrupt HWP: a record runs past the end of its section")
        yield header & 0x3FF, bytes(view[pos : pos + size])
        pos += size


def _inflated(sections: list[bytes], file_size: int, max_bytes: int) -> Iterator[bytearray]:
    """Each section inflated (raw deflate), all of them together at most the cap."""
    cap = inflation_cap(file_size, max_bytes)
    total = 0
    for section in sections:
        out = bytearray()
        try:
            inflate_into(out, zlib.decompressobj(wbits=-15), section, 0, cap - total)
        except OverCap:
            raise ContentInvalid(
                f"HWP body text expands to more than {size_text(cap)} (the limit for a "
                f"{size_text(file_size)} file); decompression bomb or oversized"
            ) from None
        except CutShort:
            raise ContentInvalid("corrupt HWP: a compressed section is cut short") from None
        total += len(out)
        yield out


def _refuse_protected(properties: int) -> None:
    if properties & _PASSWORD:
        raise ContentInvalid("HWP is password-protected")
    if properties & _DISTRIBUTION:
        raise ContentInvalid("HWP is a distribution document (its text is encrypted)")
    if properties & (_DRM | _CERTIFICATE_DRM):
        raise ContentInvalid("HWP is DRM-protected")


def hwp_text(data: bytes, max_bytes: int, max_chars: int) -> str:
    """The paragraphs of every section, in order (module docstring)."""
    out = Outline("HWP", max_chars)
    # every olefile defect raises: a looping sector chain is not followed up to its size
    with (
        refused_as_corrupt("HWP"),
        olefile.OleFileIO(data, raise_defects=olefile.DEFECT_INCORRECT) as ole,
    ):
        properties, stored = _body_streams(ole, len(data))
        sections: Iterable[bytes | bytearray] = (
            _inflated(stored, len(data), max_bytes) if properties & _COMPRESSED else stored
        )
        for body in sections:
            for tag, payload in _records(body):
                if tag == _PARA_TEXT:
                    out.paragraph(_paragraph_text(payload))
    return out.text()


def _body_streams(ole: Any, file_size: int) -> tuple[int, list[bytes]]:
    """The FileHeader's properties (protected documents refused) and the body-text sections'
    stored bytes, in section order."""

    def stream(path: list[str]) -> bytes:
        if ole.get_size("/".join(path)) > file_size:
            raise ContentInvalid("corrupt HWP: a stream larger than the file")
        return bytes(ole.openstream(path).read())

    header = stream(["FileHeader"])
    if not header.startswith(_SIGNATURE) or len(header) < 40:
        raise ContentInvalid("corrupt HWP: no HWP file header")
    properties = int.from_bytes(header[36:40], "little")
    _refuse_protected(properties)
    numbered = sorted(
        (int(found.group(1)), entry)
        for entry in ole.listdir(streams=True, storages=False)
        if len(entry) == 2 and entry[0] == "BodyText" and (found := _SECTION.fullmatch(entry[1]))
    )
    if not numbered:
        raise ContentInvalid("corrupt HWP: no body text section")
    return properties, [stream(entry) for _, entry in numbered]
