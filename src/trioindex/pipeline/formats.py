"""Format detection and text extraction: uploaded bytes in, normalised text out.

Owns the pure, synchronous first half of the parse step (ARCHITECTURE §4.5): deciding what a
file is (content first, name and content type as hints), decoding it, and pulling out its
text. Every problem with the bytes themselves — unsupported format, undecodable bytes, a
corrupt or scanned PDF, a corrupt DOCX, an empty document, a file over the size limit — is a
:class:`~trioindex.errors.ContentInvalid` with a short message that never quotes the content.
Nothing else escapes :func:`extract_text` for any input bytes (third-party parsers raise a zoo
of exception types on hostile input; they are translated here, at the layer boundary).

The functions are CPU-bound: the parse step runs them in a worker process it can kill
(:mod:`trioindex.pipeline.parse_process`). They touch no database, storage or network. Each
format's work is bounded before it starts (see "limits" below): PDF pages and content, DOCX
inflation, extracted text size. UTF-8 that is almost right (a character cut off at the end, a
stray byte) is decoded with U+FFFD in place of the bad bytes; the count is returned.

Text is normalised the same way for every format: ``"\\n"`` line endings, no BOM, no NUL
characters (PostgreSQL ``text`` cannot hold them), lone surrogates replaced by U+FFFD, and
Unicode NFC — PDFs and DOCX files written on macOS often carry Korean as decomposed jamo,
while queries arrive composed; NFC makes both the same string.
"""

from __future__ import annotations

import codecs
import enum
import io
import logging
import re
import unicodedata
import zipfile
from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import Any

import attrs
import charset_normalizer
import docx
import pypdf
from bs4.dammit import EncodingDetector
from docx.text.paragraph import Paragraph

# lxml (a dependency of python-docx) ships no type hints.
from lxml import etree  # type: ignore[import-untyped]

from trioindex.errors import ContentInvalid

logger = logging.getLogger(__name__)

__all__ = [
    "DocumentFormat",
    "ExtractedText",
    "detect_format",
    "extract_text",
]


class DocumentFormat(enum.StrEnum):
    TEXT = "TEXT"
    MARKDOWN = "MARKDOWN"
    HTML = "HTML"
    PDF = "PDF"
    DOCX = "DOCX"


@attrs.frozen
class ExtractedText:
    """The normalised text of one document (see the module docstring for the normalisation)."""

    text: str = attrs.field(repr=False)
    format: DocumentFormat
    page_count: int | None = None  # PDF pages, else None
    replaced: int = 0  # invalid byte sequences replaced by U+FFFD while decoding (text formats)


# -- limits -------------------------------------------------------------------------------------
# Every limit bounds the work one document can cause before a single byte of it is inflated or
# interpreted; the parse step's timeout (indexing.parsing.timeout) is the backstop for the rest.
# README "Limits" lists them for users.

MiB = 1024 * 1024

# A DOCX is a ZIP of XML. Real ones inflate 8-30x (a table of identical empty cells ~100x); the
# bomb in the issue inflated 680x. Total uncompressed size: at most DOCX_EXPANSION_RATIO x the
# file (floor DOCX_MIN_UNCOMPRESSED_CAP: an empty Word file already carries ~0.8 MB of styles),
# and never over DOCX_EXPANSION_LIMIT x the configured maximum size. The XML parts python-docx
# parses into a tree (~20x their size in memory) are capped absolutely.
DOCX_EXPANSION_RATIO = 200
DOCX_EXPANSION_LIMIT = 8
DOCX_MIN_UNCOMPRESSED_CAP = 8 * MiB
DOCX_MAX_XML_BYTES = 32 * MiB
DOCX_MAX_ENTRIES = 10_000
_DOCX_READ_BLOCK = 256 * 1024
# Extracted text beyond this multiple of the file size means a crafted file (PDF content streams
# are compressed too); refuse it instead of handing the chunker gigabytes.
TEXT_EXPANSION_LIMIT = 8
# pypdf interprets page content at ~1 MB/s and a 10 KiB PDF can point every page at one 3.5 MiB
# stream, so content is budgeted before it is interpreted: per page (its content streams and
# the form XObjects it uses) at most the total budget and PDF_MAX_PAGE_CONTENT; all pages
# together at most PDF_CONTENT_EXPANSION x the file size (floor PDF_MIN_CONTENT_BUDGET, and
# never over TEXT_EXPANSION_LIMIT x the configured maximum). Real PDFs stay under ~10x.
PDF_MAX_PAGES = 10_000
PDF_CONTENT_EXPANSION = 32
PDF_MIN_CONTENT_BUDGET = 1 * MiB
PDF_MAX_PAGE_CONTENT = 16 * MiB
# Almost-UTF-8 text: UTF8_MIN_REPAIRS invalid sequences tolerated (one stray byte inside a
# character leaves up to three), plus one per UTF8_REPAIR_BYTES; and at least
# UTF8_EVIDENCE_PER_REPAIR bytes of valid multi-byte characters (the bytes beyond the first of
# each: 16 = 8 Hangul syllables) per replaced sequence as evidence that the file is UTF-8.
UTF8_MIN_REPAIRS = 4
UTF8_REPAIR_BYTES = 256 * 1024
UTF8_EVIDENCE_PER_REPAIR = 16

# -- format detection ---------------------------------------------------------------------------

_TEXT_EXTENSIONS = {".txt", ".text", ".log", ".csv", ".tsv"}
_MARKDOWN_EXTENSIONS = {".md", ".markdown", ".mdown", ".mkd", ".mkdn"}
_HTML_EXTENSIONS = {".html", ".htm", ".xhtml", ".shtml"}
_PDF_TYPES = {"application/pdf", "application/x-pdf"}
_DOCX_TYPE = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
_HTML_TYPES = {"text/html", "application/xhtml+xml"}
_MARKDOWN_TYPES = {"text/markdown", "text/x-markdown"}

# Signatures of common binary formats we do not index, named so the message helps the uploader.
_BINARY_SIGNATURES: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "PNG image"),
    (b"\xff\xd8\xff", "JPEG image"),
    (b"GIF87a", "GIF image"),
    (b"GIF89a", "GIF image"),
    (b"II*\x00", "TIFF image"),
    (b"MM\x00*", "TIFF image"),
    (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "legacy Office (OLE2, e.g. .doc/.xls)"),
    (b"{\\rtf", "RTF"),
    (b"\x1f\x8b", "gzip archive"),
    (b"\xfd7zXZ\x00", "xz archive"),
    (b"(\xb5/\xfd", "zstd archive"),
    (b"7z\xbc\xaf'\x1c", "7z archive"),
    (b"Rar!\x1a\x07", "RAR archive"),
    (b"\x7fELF", "executable"),
    (b"SQLite format 3\x00", "SQLite database"),
    (b"\x00asm", "WebAssembly"),
)
# Short printable signatures a text file could also start with ("MZ", "ID3 tags ..."): they
# name the format only when the bytes are binary anyway.
_WEAK_SIGNATURES: tuple[tuple[bytes, str], ...] = (
    (b"MZ", "executable"),
    (b"BZh", "bzip2 archive"),
    (b"OggS", "Ogg media"),
    (b"ID3", "MP3 audio"),
    (b"RIFF", "RIFF media"),
)
_ZIP_SIGNATURES = (b"PK\x03\x04", b"PK\x05\x06")

# Byte order marks, longest first (the UTF-32 LE mark begins with the UTF-16 LE one).
_BOMS: tuple[tuple[bytes, str], ...] = (
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)

_HTML_START = re.compile(
    r"\A(?:\s|<!--.*?-->|<\?xml[^>]*>)*<(?:!doctype\s+html|html|head|body)[\s>/]",
    re.IGNORECASE | re.DOTALL,
)


def _extension(name: str) -> str:
    # Names come from uploaders: take the last path component whatever the separator.
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    return PurePosixPath(base).suffix.lower()


def _media_type(content_type: str | None) -> str:
    if not content_type:
        return ""
    return content_type.split(";", 1)[0].strip().lower()


def _content_type_charset(content_type: str | None) -> str | None:
    if not content_type:
        return None
    for param in content_type.split(";")[1:]:
        key, _, value = param.partition("=")
        if key.strip().lower() == "charset":
            return value.strip().strip("\"'") or None
    return None


def _bom(data: bytes) -> tuple[str, int] | None:
    for mark, encoding in _BOMS:
        if data.startswith(mark):
            return encoding, len(mark)
    return None


def _sniff_prefix(data: bytes) -> str:
    """The first KiB decoded leniently, only to look for HTML markers."""
    head = data[:1024]
    found = _bom(head)
    if found is None:
        return head.decode("utf-8", "ignore")
    encoding, skip = found
    return head[skip:].decode(encoding, "ignore")


def _looks_binary(data: bytes) -> bool:
    # Text without a BOM never contains NUL bytes; binary formats almost always do early on
    # (the test git and file(1) use).
    return _bom(data) is None and b"\x00" in data[:8192]


def _binary_kind(data: bytes) -> str | None:
    for signature, kind in _BINARY_SIGNATURES:
        if data.startswith(signature):
            return kind
    if not _looks_binary(data):
        return None
    for signature, kind in _WEAK_SIGNATURES:
        if data.startswith(signature):
            return kind
    if data[4:8] == b"ftyp":
        return "MP4/QuickTime media"
    return "binary content"


def _failure_name(exc: BaseException) -> str:
    """The exception's class for a message: ``PdfReadError``, ``zlib.error``."""
    cls = type(exc)
    return cls.__name__ if cls.__name__[:1].isupper() else f"{cls.__module__}.{cls.__name__}"


def _zip_is_docx(data: bytes) -> bool | None:
    """True for a ZIP holding a ``word/`` tree, False for another ZIP, None if unreadable."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            names = archive.namelist()
    except Exception:  # zipfile raises BadZipFile, ValueError, OSError, ... on damaged input
        return None
    if "word/document.xml" in names:
        return True
    return any(n.startswith("word/") for n in names) and "[Content_Types].xml" in names


def detect_format(data: bytes, name: str, content_type: str | None = None) -> DocumentFormat:
    """What ``data`` is, judged by its content first; ``name`` / ``content_type`` are hints.

    Raises :class:`ContentInvalid` for bytes that cannot be one of the supported formats:
    a ``.pdf`` name (or PDF content type) on non-PDF bytes is a corrupt PDF, a ``.docx`` on
    something that is not a Word ZIP is a corrupt DOCX, other ZIPs and known binary formats
    are unsupported.
    """
    ext = _extension(name)
    media = _media_type(content_type)
    says_pdf = ext == ".pdf" or media in _PDF_TYPES
    says_docx = ext == ".docx" or media == _DOCX_TYPE

    # Readers accept a PDF header after a little junk within the first KiB; without a PDF
    # name or type, only a header at the start counts (a text may mention "%PDF-").
    if data[:1024].lstrip()[:5] == b"%PDF-" or (says_pdf and b"%PDF-" in data[:1024]):
        return DocumentFormat.PDF
    if data.startswith(_ZIP_SIGNATURES):
        is_docx = _zip_is_docx(data)
        if is_docx:
            return DocumentFormat.DOCX
        if says_docx:
            if is_docx is None:
                raise ContentInvalid("corrupt DOCX: unreadable ZIP package")
            raise ContentInvalid("corrupt DOCX: the ZIP package has no Word document")
        if is_docx is None:
            raise ContentInvalid("unsupported format: unreadable ZIP archive")
        raise ContentInvalid("unsupported format: ZIP archive that is not a DOCX")
    if says_pdf:
        raise ContentInvalid("corrupt PDF: no PDF header")
    if says_docx:
        raise ContentInvalid("corrupt DOCX: not a ZIP package")
    kind = _binary_kind(data)
    if kind is not None:
        raise ContentInvalid(f"unsupported format: {kind}")

    if _HTML_START.match(_sniff_prefix(data)):
        return DocumentFormat.HTML
    if ext in _HTML_EXTENSIONS or media in _HTML_TYPES:
        return DocumentFormat.HTML
    if ext in _MARKDOWN_EXTENSIONS or media in _MARKDOWN_TYPES:
        return DocumentFormat.MARKDOWN
    return DocumentFormat.TEXT


# -- decoding -----------------------------------------------------------------------------------

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


def _decode(data: bytes, fmt: DocumentFormat, content_type: str | None) -> tuple[str, int]:
    """Bytes to str: BOM, then declared charset, then UTF-8 (repairing a few bad bytes), then
    charset detection. Also returns how many invalid sequences were replaced by U+FFFD."""
    found = _bom(data)
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
        EncodingDetector.find_declared_encoding(data, is_html=True)
        if fmt is DocumentFormat.HTML
        else None,
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


def _normalise(text: str) -> str:
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    if "\x00" in text:
        text = text.replace("\x00", "")
    if _SURROGATES.search(text):
        text = _SURROGATES.sub("\ufffd", text)
    # A stray BOM can survive inside the text (concatenated files, DOCX runs); drop the first.
    text = text.removeprefix("\ufeff")
    return unicodedata.normalize("NFC", text)


# -- HTML ---------------------------------------------------------------------------------------

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

    def __init__(self) -> None:
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
        skipped = name in _HTML_SKIP or (attrib is not None and "hidden" in attrib)
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


def _html_text(markup: str) -> str:
    target = _VisibleText()
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
        logger.debug("lxml stopped parsing HTML: %s", _failure_name(exc))
        result = target.close()
    return str(result)


# -- PDF ----------------------------------------------------------------------------------------


def _size(n: float) -> str:
    """A byte count for a message: ``900 bytes``, ``9.9 KiB``, ``32 MiB``."""
    unit = "bytes"
    for bigger in ("KiB", "MiB"):
        if n < 1024:
            break
        n /= 1024
        unit = bigger
    shown = f"{n:.0f}" if unit == "bytes" or n >= 100 else f"{n:.1f}".removesuffix(".0")
    return f"{shown} {unit}"


@attrs.define
class _PdfBudget:
    """Decoded content a PDF may make pypdf interpret (module "limits" comment)."""

    file_size: int
    max_chars: int
    total: int
    per_page: int
    used: int = 0

    @classmethod
    def for_file(cls, file_size: int, max_chars: int) -> _PdfBudget:
        total = min(max_chars, max(PDF_MIN_CONTENT_BUDGET, PDF_CONTENT_EXPANSION * file_size))
        per_page = min(total, PDF_MAX_PAGE_CONTENT)
        return cls(file_size=file_size, max_chars=max_chars, total=total, per_page=per_page)

    def spend(self, page_no: int, content: int) -> None:
        if content > self.per_page:
            raise ContentInvalid(
                f"PDF page {page_no} has over {_size(self.per_page)} of content "
                f"(the per-page limit for a {_size(self.file_size)} file)"
            )
        self.used += content
        if self.used > self.total:
            raise ContentInvalid(
                f"PDF pages 1-{page_no} have over {_size(self.total)} of content "
                f"(the limit for all pages of a {_size(self.file_size)} file)"
            )


def _stream_bytes(obj: Any, limit: int) -> int:
    """Decoded size of a stream object (``limit + 1`` when pypdf refuses to inflate that
    much); 0 for anything else or a stream pypdf cannot decode (extraction skips those too)."""
    try:
        stream = obj.get_object()
        if not isinstance(stream, pypdf.generic.StreamObject):
            return 0
        return len(stream.get_data())
    except pypdf.errors.LimitReachedError:
        return limit + 1
    except Exception:  # damaged streams: extraction decides what to do with them
        return 0


def _form_xobjects(resources: Any) -> Iterator[Any]:
    try:
        xobjects = resources.get_object().get("/XObject")
        entries = xobjects.get_object().values() if xobjects is not None else ()
    except Exception:
        return
    for ref in entries:
        try:
            form = ref.get_object()
            if isinstance(form, pypdf.generic.StreamObject) and form.get("/Subtype") == "/Form":
                yield form
        except Exception:
            continue


def _page_content_bytes(page: Any, limit: int) -> int:
    """Decoded bytes of a page's content streams and of the form XObjects it can draw.

    Forms nested in forms are followed (each counted once per page); counting stops once it
    passes ``limit``, so a hostile page costs at most about ``limit`` bytes of decoding.
    """
    total = 0
    contents = page.get("/Contents")
    if contents is not None:
        contents = contents.get_object()
        parts = contents if isinstance(contents, pypdf.generic.ArrayObject) else [contents]
        for part in parts:
            total += _stream_bytes(part, limit)
            if total > limit:
                return total
    seen: set[int] = set()
    pending = list(_form_xobjects(page.get("/Resources", {})))
    while pending and total <= limit:
        form = pending.pop()
        if id(form) in seen:
            continue
        seen.add(id(form))
        total += _stream_bytes(form, limit)
        pending.extend(_form_xobjects(form.get("/Resources", {})))
    return total


def _pdf_pages(reader: pypdf.PdfReader) -> int:
    try:
        count = len(reader.pages)
    except pypdf.errors.LimitReachedError as exc:
        raise ContentInvalid(f"PDF has more than {PDF_MAX_PAGES} pages (the limit)") from exc
    if count > PDF_MAX_PAGES:
        raise ContentInvalid(f"PDF has {count} pages, over the limit of {PDF_MAX_PAGES}")
    return count


def _pdf_text(data: bytes, max_chars: int) -> tuple[str, int]:
    budget = _PdfBudget.for_file(len(data), max_chars)
    try:
        # pypdf's own limits bound what it inflates and walks before we see a page: streams
        # no larger than the whole content budget, a page tree no larger than our page limit.
        with pypdf.apply_configuration(
            page_tree_maximum_page_entries=PDF_MAX_PAGES + 1,
            zlib_maximum_output_length=max(budget.total, 8 * MiB),
        ):
            return _pdf_text_within(pypdf.PdfReader(io.BytesIO(data), strict=False), budget)
    except ContentInvalid:
        raise
    except MemoryError:
        raise  # a resource failure, not a verdict on the content
    except pypdf.errors.LimitReachedError as exc:
        raise ContentInvalid(f"PDF over a pypdf safety limit ({_failure_name(exc)})") from exc
    except Exception as exc:  # pypdf raises many unrelated types on damaged files
        logger.debug("pypdf failed: %s", _failure_name(exc))
        raise ContentInvalid(f"corrupt PDF ({_failure_name(exc)})") from exc


def _pdf_text_within(reader: pypdf.PdfReader, budget: _PdfBudget) -> tuple[str, int]:
    if reader.is_encrypted:
        # Many PDFs are "encrypted" with an empty user password only to set permissions.
        try:
            opened = reader.decrypt("")
        except Exception as exc:
            raise ContentInvalid(f"encrypted PDF cannot be opened ({_failure_name(exc)})") from exc
        if not opened:
            raise ContentInvalid("PDF is password-protected")
    page_count = _pdf_pages(reader)
    pages: list[str] = []
    chars = 0
    for page_no, page in enumerate(reader.pages, start=1):
        budget.spend(page_no, _page_content_bytes(page, budget.per_page))
        text = page.extract_text() or ""
        chars += len(text)
        if chars > budget.max_chars:
            raise ContentInvalid("PDF text is implausibly large for the file size")
        pages.append(text)
    if page_count == 0:
        raise ContentInvalid("corrupt PDF: it has no pages")
    # Pages are paragraphs to the chunker; a blank page adds nothing.
    joined = "\n\n".join(p.strip("\n") for p in pages if p.strip())
    if not joined.strip():
        raise ContentInvalid(
            f"PDF has no text layer ({page_count} page(s), scanned or image-only): OCR is needed"
        )
    return joined, page_count


# -- DOCX ---------------------------------------------------------------------------------------

_W_NS = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
_MC_NS = "http://schemas.openxmlformats.org/markup-compatibility/2006"


def _docx_caps(size: int, max_bytes: int) -> int:
    """Total uncompressed bytes a DOCX of ``size`` bytes may hold (module "limits" comment)."""
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
                    while block := part.read(_DOCX_READ_BLOCK):
                        counted.add(info.filename, len(block))
    except ContentInvalid:
        raise
    except MemoryError:
        raise
    except Exception as exc:  # BadZipFile (CRC, truncation), zlib.error, NotImplementedError, ...
        raise ContentInvalid(f"corrupt DOCX ({_failure_name(exc)})") from exc


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
                f"DOCX expands to more than {_size(self.cap)} (the limit for a "
                f"{_size(self.file_size)} file); decompression bomb or oversized"
            )
        if self.xml > DOCX_MAX_XML_BYTES:
            raise ContentInvalid(
                f"DOCX holds more than {_size(DOCX_MAX_XML_BYTES)} of XML (the limit); "
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


def _docx_text(data: bytes, max_bytes: int, max_chars: int) -> str:
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
        logger.debug("python-docx failed: %s", _failure_name(exc))
        raise ContentInvalid(f"corrupt DOCX ({_failure_name(exc)})") from exc
    return "\n\n".join(parts)


# -- entry point --------------------------------------------------------------------------------


def extract_text(
    data: bytes, name: str, content_type: str | None = None, *, max_bytes: int
) -> ExtractedText:
    """Detect the format of ``data`` and return its normalised text.

    Synchronous and CPU-bound (run it in a worker thread). Raises :class:`ContentInvalid` for
    every content problem and nothing else for any input bytes — except ``MemoryError``,
    which is a resource failure rather than a verdict on the document.
    """
    if max_bytes <= 0:
        raise ValueError("max_bytes must be positive")
    size = len(data)
    if size > max_bytes:
        raise ContentInvalid(f"file over the maximum size: {size} bytes > {max_bytes} bytes")
    if size == 0:
        raise ContentInvalid("empty file")

    fmt = detect_format(data, name, content_type)
    max_chars = TEXT_EXPANSION_LIMIT * max_bytes
    page_count: int | None = None
    replaced = 0
    if fmt is DocumentFormat.PDF:
        raw, page_count = _pdf_text(data, max_chars)
    elif fmt is DocumentFormat.DOCX:
        raw = _docx_text(data, max_bytes, max_chars)
    elif fmt is DocumentFormat.HTML:
        decoded, replaced = _decode(data, fmt, content_type)
        # Decoded text may carry NULs or lone surrogates that libxml2 would choke on.
        raw = _html_text(_normalise(decoded))
    else:
        raw, replaced = _decode(data, fmt, content_type)

    text = _normalise(raw)
    if not text.strip():
        raise ContentInvalid(f"empty document: the {fmt.value} file has no text")
    if replaced:
        logger.debug("%d invalid byte sequence(s) replaced by U+FFFD", replaced)
    return ExtractedText(text=text, format=fmt, page_count=page_count, replaced=replaced)
