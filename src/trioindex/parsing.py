"""Format detection and text extraction: uploaded bytes in, normalised text out.

Owns the pure, synchronous first half of the parse step (ARCHITECTURE §4.5): deciding what a
file is (content first, name and content type as hints), decoding it, and pulling out its
text. Every problem with the bytes themselves — unsupported format, undecodable bytes, a
corrupt or scanned PDF, a corrupt DOCX, an empty document, a file over the size limit — is a
:class:`~trioindex.errors.ContentInvalid` with a short message that never quotes the content.
Nothing else escapes :func:`extract_text` for any input bytes (third-party parsers raise a zoo
of exception types on hostile input; they are translated here, at the layer boundary).

The functions are CPU-bound: the caller runs them in ``trio.to_thread``. They touch no
database, storage or network.

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


# -- limits -------------------------------------------------------------------------------------

# A DOCX is a ZIP of XML that compresses 5-10x; a decompression bomb compresses 1000x. The cap is
# relative to the configured maximum file size (so operators tune one number) with a floor so
# that a small limit still admits the ~100 KB of styles every Word file carries.
DOCX_EXPANSION_LIMIT = 8
DOCX_MIN_UNCOMPRESSED_CAP = 8 * 1024 * 1024
DOCX_MAX_ENTRIES = 10_000
# Extracted text beyond this multiple of the file size means a crafted file (PDF content streams
# are compressed too); refuse it instead of handing the chunker gigabytes.
TEXT_EXPANSION_LIMIT = 8

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


def _decode(data: bytes, fmt: DocumentFormat, content_type: str | None) -> str:
    """Bytes to str: BOM, then declared charset, then UTF-8, then charset detection."""
    found = _bom(data)
    if found is not None:
        encoding, skip = found
        text = _try_decode(data[skip:], encoding)
        if text is None:
            raise ContentInvalid(f"undecodable bytes: invalid {encoding.upper()} after its BOM")
        return text

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
            return text

    try:
        best = charset_normalizer.from_bytes(data).best()
        text = None if best is None else str(best)
    except (UnicodeError, LookupError, ValueError):
        text = None
    if text is None:
        raise ContentInvalid("undecodable bytes: not UTF-8 and no known encoding fits")
    return text


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


def _pdf_text(data: bytes, max_chars: int) -> tuple[str, int]:
    try:
        reader = pypdf.PdfReader(io.BytesIO(data), strict=False)
        if reader.is_encrypted:
            # Many PDFs are "encrypted" with an empty user password only to set permissions.
            try:
                opened = reader.decrypt("")
            except Exception as exc:
                raise ContentInvalid(
                    f"encrypted PDF cannot be opened ({_failure_name(exc)})"
                ) from exc
            if not opened:
                raise ContentInvalid("PDF is password-protected")
        page_count = len(reader.pages)
        pages: list[str] = []
        total = 0
        for page in reader.pages:
            text = page.extract_text() or ""
            total += len(text)
            if total > max_chars:
                raise ContentInvalid("PDF text is implausibly large for the file size")
            pages.append(text)
    except ContentInvalid:
        raise
    except MemoryError:
        raise  # a resource failure, not a verdict on the content
    except Exception as exc:  # pypdf raises many unrelated types on damaged files
        logger.debug("pypdf failed: %s", _failure_name(exc))
        raise ContentInvalid(f"corrupt PDF ({_failure_name(exc)})") from exc
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


def _check_docx_package(data: bytes, max_bytes: int) -> None:
    cap = max(DOCX_EXPANSION_LIMIT * max_bytes, DOCX_MIN_UNCOMPRESSED_CAP)
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            infos = archive.infolist()
    except Exception as exc:
        raise ContentInvalid(f"corrupt DOCX ({_failure_name(exc)})") from exc
    if len(infos) > DOCX_MAX_ENTRIES:
        raise ContentInvalid(f"corrupt DOCX: {len(infos)} package parts")
    # zipfile never inflates an entry past its declared size (it fails the CRC instead), so
    # the declared sizes bound the memory python-docx can use.
    if sum(info.file_size for info in infos) > cap:
        raise ContentInvalid(
            f"DOCX expands to more than {cap} bytes (decompression bomb or oversized)"
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
    if fmt is DocumentFormat.PDF:
        raw, page_count = _pdf_text(data, max_chars)
    elif fmt is DocumentFormat.DOCX:
        raw = _docx_text(data, max_bytes, max_chars)
    elif fmt is DocumentFormat.HTML:
        decoded = _decode(data, fmt, content_type)
        # Decoded text may carry NULs or lone surrogates that libxml2 would choke on.
        raw = _html_text(_normalise(decoded))
    else:
        raw = _decode(data, fmt, content_type)

    text = _normalise(raw)
    if not text.strip():
        raise ContentInvalid(f"empty document: the {fmt.value} file has no text")
    return ExtractedText(text=text, format=fmt, page_count=page_count)
