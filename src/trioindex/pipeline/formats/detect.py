"""What a file is: content first, its name and content type only as hints.

Owns :class:`DocumentFormat` and :func:`detect_format`, and the byte-order marks (the decoder
in :mod:`.text` reads them from here). Known binary formats and ZIPs that are not Word
documents are refused here, naming what they are, before any parser sees them.
"""

from __future__ import annotations

import codecs
import enum
import io
import re
import zipfile
from pathlib import PurePosixPath

from trioindex.errors import ContentInvalid

__all__ = ["DocumentFormat", "bom", "detect_format"]


class DocumentFormat(enum.StrEnum):
    """The formats that are indexed (each value is its own name)."""

    TEXT = "TEXT"
    MARKDOWN = "MARKDOWN"
    HTML = "HTML"
    PDF = "PDF"
    DOCX = "DOCX"
    GZIP = "GZIP"  # read as the document it holds (:mod:`.compressed`)


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
    (b"\x1f\x8b", "gzip archive of an unknown method"),  # deflate ones are read
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
_GZIP_SIGNATURE = b"\x1f\x8b\x08"  # the magic, then deflate: the only method gzip defines

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


def bom(data: bytes) -> tuple[str, int] | None:
    """The codec named by a byte order mark at the start of ``data``, and the mark's length."""
    for mark, encoding in _BOMS:
        if data.startswith(mark):
            return encoding, len(mark)
    return None


def _sniff_prefix(data: bytes) -> str:
    """The first KiB decoded leniently, only to look for HTML markers."""
    head = data[:1024]
    found = bom(head)
    if found is None:
        return head.decode("utf-8", "ignore")
    encoding, skip = found
    return head[skip:].decode(encoding, "ignore")


def _looks_binary(data: bytes) -> bool:
    # Text without a BOM never contains NUL bytes; binary formats almost always do early on
    # (the test git and file(1) use).
    return bom(data) is None and b"\x00" in data[:8192]


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
    if data.startswith(_GZIP_SIGNATURE):
        return DocumentFormat.GZIP
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
