"""Bytes to text, and the normalisation every format's text goes through.

Decoding (:func:`decode`, for the text formats and HTML): a byte order mark, then the declared
charset (content type, or an HTML ``<meta>``), then UTF-8; UTF-8 that is almost right (a
character cut off at the end, a stray byte) is decoded with U+FFFD in place of the bad bytes
and the count is returned; anything else goes to charset detection.

Normalisation (:func:`normalise`, for every format): ``"\\n"`` line endings, no BOM, no NUL
characters (PostgreSQL ``text`` cannot hold them), lone surrogates replaced by U+FFFD, and
Unicode NFC — PDFs and DOCX files written on macOS often carry Korean as decomposed jamo,
while queries arrive composed; NFC makes both the same string.
"""

from __future__ import annotations

import codecs
import re
import unicodedata

import attrs
import charset_normalizer

from trioindex.errors import ContentInvalid
from trioindex.pipeline.formats.detect import DocumentFormat, bom
from trioindex.pipeline.formats.limits import (
    UTF8_EVIDENCE_PER_REPAIR,
    UTF8_MIN_REPAIRS,
    UTF8_REPAIR_BYTES,
)

__all__ = ["decode", "normalise"]

# Labels browsers decode with a superset codec (WHATWG Encoding Standard); documents declaring
# them are almost always written in the superset.
_WEB_CODEC_ALIASES = {
    "iso-8859-1": "cp1252",
    "iso8859-1": "cp1252",
    "latin1": "cp1252",
    "latin-1": "cp1252",
    "l1": "cp1252",
    "ascii": "cp1252",
    "us-ascii": "cp1252",
    "euc-kr": "cp949",
    "ks_c_5601-1987": "cp949",
    "ksc5601": "cp949",
    "korean": "cp949",
    "gb2312": "gb18030",
    "gbk": "gb18030",
    "x-gbk": "gb18030",
    "iso-8859-9": "cp1254",
    "tis-620": "cp874",
    # A document found without a BOM cannot really be UTF-16; browsers read it as UTF-8.
    "utf-16": "utf-8",
    "utf-16le": "utf-8",
    "utf-16be": "utf-8",
}
# Python text codecs that are transformations, not character sets a document can declare.
_REFUSED_CODECS = {
    "idna",
    "punycode",
    "raw-unicode-escape",
    "unicode-escape",
    "undefined",
    "utf-7",
    "mbcs",
    "oem",
}

_SURROGATES = re.compile(r"[\ud800-\udfff]")


def _content_type_charset(content_type: str | None) -> str | None:
    if not content_type:
        return None
    for param in content_type.split(";")[1:]:
        key, _, value = param.partition("=")
        if key.strip().lower() == "charset":
            return value.strip().strip("\"'") or None
    return None


def _codec_for(label: str | None) -> str | None:
    """A Python codec name for a declared charset label, or None if unknown or unsuitable."""
    if not label:
        return None
    label = label.strip().lower()
    label = _WEB_CODEC_ALIASES.get(label, label)
    try:
        info = codecs.lookup(label)
    except (LookupError, ValueError, TypeError):
        return None
    if not getattr(info, "_is_text_encoding", True) or info.name in _REFUSED_CODECS:
        return None
    return info.name


def _try_decode(data: bytes, codec: str) -> str | None:
    try:
        return data.decode(codec)
    except (UnicodeDecodeError, LookupError, ValueError):
        return None


@attrs.frozen
class _Repair:
    """UTF-8 decoded with U+FFFD for each invalid sequence, and what that took."""

    text: str = attrs.field(repr=False)
    replaced: int  # invalid sequences replaced (each by one U+FFFD)
    complete: bool  # False when the scan stopped after more than the tolerated number
    truncated_end: bool  # the only fault is a character cut off at the very end
    multibyte_evidence: int  # bytes spent on valid multi-byte characters (UTF-8 evidence)


def _utf8_with_replacements(data: bytes | memoryview) -> _Repair:
    """Decode UTF-8 replacing invalid sequences as Python's ``errors="replace"`` does.

    Stops after :func:`_utf8_tolerance` + 1 replacements, so hostile input costs one pass.
    """
    view = memoryview(data)
    allowed = _utf8_tolerance(len(view))
    pieces: list[str] = []
    pos = bad_bytes = replaced = 0
    truncated_end = False
    while True:
        try:
            pieces.append(codecs.utf_8_decode(view[pos:], "strict", True)[0])
            break
        except UnicodeDecodeError as exc:
            pieces.append(codecs.utf_8_decode(view[pos : pos + exc.start], "strict", True)[0])
            pieces.append("\ufffd")
            replaced += 1
            bad_bytes += exc.end - exc.start
            truncated_end = pos + exc.end >= len(view) and exc.reason == "unexpected end of data"
            pos += exc.end
            if replaced > allowed:
                break
    text = "".join(pieces)
    decoded_bytes = min(pos, len(view)) if replaced > allowed else len(view)
    # Every valid non-ASCII character spends 1-3 bytes more than the one character it gives.
    evidence = (decoded_bytes - bad_bytes) - (len(text) - replaced)
    return _Repair(
        text=text,
        replaced=replaced,
        complete=replaced <= allowed,
        truncated_end=replaced == 1 and truncated_end,
        multibyte_evidence=evidence,
    )


def _utf8_tolerance(size: int) -> int:
    """Invalid UTF-8 sequences tolerated in ``size`` bytes: four, plus one per 256 KiB."""
    return UTF8_MIN_REPAIRS + size // UTF8_REPAIR_BYTES


def _almost_utf8(data: bytes | memoryview) -> tuple[str, int] | None:
    """Text that is UTF-8 but for a few bad bytes, with the count replaced; else None.

    The rule (README "Limits"): a character cut off at the very end is always repaired;
    otherwise at most :func:`_utf8_tolerance` invalid sequences are replaced, and only when the
    rest carries clear UTF-8 evidence — :data:`UTF8_EVIDENCE_PER_REPAIR` continuation bytes
    of valid multi-byte characters per replaced sequence (a Latin-1 or CP949 file has few).
    UTF-8 with clear evidence but more faults than tolerated is a mixed-up file: refused,
    rather than handed to charset detection, which would turn it into mojibake.
    """
    repair = _utf8_with_replacements(data)
    if repair.truncated_end:
        return repair.text, repair.replaced
    utf8_like = repair.multibyte_evidence >= UTF8_EVIDENCE_PER_REPAIR * repair.replaced
    if not utf8_like:
        return None
    if not repair.complete:
        raise ContentInvalid(
            "undecodable bytes: UTF-8 text with more than "
            f"{_utf8_tolerance(len(data))} invalid sequence(s) (mixed encodings or damaged)"
        )
    return repair.text, repair.replaced


def decode(data: bytes, fmt: DocumentFormat, content_type: str | None) -> tuple[str, int]:
    """Bytes to str: BOM, then declared charset, then UTF-8 (repairing a few bad bytes), then
    charset detection. Also returns how many invalid sequences were replaced by U+FFFD."""
    found = bom(data)
    if found is not None:
        encoding, skip = found
        text = _try_decode(data[skip:], encoding)
        if text is not None:
            return text, 0
        if encoding == "utf-8":
            repaired = _almost_utf8(memoryview(data)[skip:])
            if repaired is not None:
                return repaired
        raise ContentInvalid(f"undecodable bytes: invalid {encoding.upper()} after its BOM")

    declared: list[str] = []
    for label in (
        _content_type_charset(content_type),
        _html_declared_encoding(data) if fmt is DocumentFormat.HTML else None,
    ):
        codec = _codec_for(label)
        if codec is not None and codec not in declared:
            declared.append(codec)
    for codec in [*declared, "utf-8"]:
        text = _try_decode(data, codec)
        if text is not None:
            return text, 0
    repaired = _almost_utf8(data)
    if repaired is not None:
        return repaired

    try:
        best = charset_normalizer.from_bytes(data).best()
        text = None if best is None else str(best)
    except (UnicodeError, LookupError, ValueError):
        text = None
    if text is None:
        raise ContentInvalid("undecodable bytes: not UTF-8 and no known encoding fits")
    return text, 0


def normalise(text: str) -> str:
    """The same text in the one form every format ends in (module docstring)."""
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    if "\x00" in text:
        text = text.replace("\x00", "")
    if _SURROGATES.search(text):
        text = _SURROGATES.sub("\ufffd", text)
    # A stray BOM can survive inside the text (concatenated files, DOCX runs); drop the first.
    text = text.removeprefix("\ufeff")
    return unicodedata.normalize("NFC", text)


def _html_declared_encoding(data: bytes) -> str | None:
    """The charset an HTML document declares (``<meta charset>``), found by bs4.

    Imported here, not at the top: bs4 brings its tree builders and lxml (~0.1 s of CPU), which
    the worker process would pay at every start for text files that never need them.
    """
    from bs4.dammit import EncodingDetector

    declared: str | None = EncodingDetector.find_declared_encoding(data, is_html=True)
    return declared
