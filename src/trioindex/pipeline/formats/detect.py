"""What a file is: content first, its name and content type only as hints.

Owns :class:`DocumentFormat` and :func:`detect_format`, and the byte-order marks (the decoder
in :mod:`.text` reads them from here). ZIP packages are told apart by their parts (OOXML's root
part, the ``mimetype`` part of OpenDocument, EPUB and HWPX), OLE2 files by an HWP file header.
Known binary formats, other ZIPs and other OLE2 files are refused here, naming what they are,
before any parser sees them.
"""

from __future__ import annotations

import codecs
import enum
import io
import re
import zipfile
from collections.abc import Callable

from trioindex.errors import ContentInvalid

__all__ = ["DocumentFormat", "bom", "detect_format", "image_kind", "office_document", "zip_name"]


class DocumentFormat(enum.StrEnum):
    """The formats that are indexed (each value is its own name)."""

    TEXT = "TEXT"
    MARKDOWN = "MARKDOWN"
    HTML = "HTML"
    PDF = "PDF"
    DOCX = "DOCX"
    PPTX = "PPTX"
    XLSX = "XLSX"
    ODT = "ODT"
    ODS = "ODS"
    ODP = "ODP"
    EPUB = "EPUB"
    HWPX = "HWPX"
    HWP = "HWP"
    IMAGE = "IMAGE"  # PNG, JPEG, TIFF: read by OCR (:mod:`.ocr`)
    RTF = "RTF"
    EML = "EML"
    GZIP = "GZIP"  # read as the document it holds (:mod:`.compressed`)


_MARKDOWN_EXTENSIONS = {".md", ".markdown", ".mdown", ".mkd", ".mkdn"}
_HTML_EXTENSIONS = {".html", ".htm", ".xhtml", ".shtml"}
_PDF_TYPES = {"application/pdf", "application/x-pdf"}
_OOXML = "application/vnd.openxmlformats-officedocument."
_ODF = "application/vnd.oasis.opendocument."
# What a name or a content type says a ZIP package is (content decides; these only name the
# format a damaged file was meant to be).
_PACKAGE_EXTENSIONS = {
    ".docx": DocumentFormat.DOCX, ".docm": DocumentFormat.DOCX,
    ".pptx": DocumentFormat.PPTX, ".pptm": DocumentFormat.PPTX,
    ".xlsx": DocumentFormat.XLSX, ".xlsm": DocumentFormat.XLSX,
    ".odt": DocumentFormat.ODT, ".ott": DocumentFormat.ODT,
    ".ods": DocumentFormat.ODS, ".ots": DocumentFormat.ODS,
    ".odp": DocumentFormat.ODP, ".otp": DocumentFormat.ODP,
    ".epub": DocumentFormat.EPUB, ".hwpx": DocumentFormat.HWPX,
}  # fmt: skip
_PACKAGE_TYPES = {
    _OOXML + "wordprocessingml.document": DocumentFormat.DOCX,
    _OOXML + "presentationml.presentation": DocumentFormat.PPTX,
    _OOXML + "spreadsheetml.sheet": DocumentFormat.XLSX,
    _ODF + "text": DocumentFormat.ODT,
    _ODF + "spreadsheet": DocumentFormat.ODS,
    _ODF + "presentation": DocumentFormat.ODP,
    "application/epub+zip": DocumentFormat.EPUB,
    "application/hwp+zip": DocumentFormat.HWPX,
}
# The root part each OOXML package has.
_OOXML_ROOTS = {
    "word/document.xml": DocumentFormat.DOCX,
    "ppt/presentation.xml": DocumentFormat.PPTX,
    "xl/workbook.xml": DocumentFormat.XLSX,
}
# ... or the main part that _rels/.rels names (a minimal or Strict OOXML package), by its type
_OOXML_CONTENT_TYPES = {
    "wordprocessingml": DocumentFormat.DOCX,
    "presentationml": DocumentFormat.PPTX,
    "spreadsheetml": DocumentFormat.XLSX,
}
_SMALL_PART = 1024 * 1024  # relationships and content types: read no further than this
_RELATIONSHIP = re.compile(rb"<(?:\w+:)?Relationship\b([^>]*)>")
_OVERRIDE = re.compile(rb"<(?:\w+:)?Override\b([^>]*)>")
_ATTRIBUTE = re.compile(rb"""(\w+)\s*=\s*["']([^"']*)["']""")
# OpenDocument, EPUB and HWPX name their type in a first, stored part called "mimetype".
_MIMETYPE_MAX = 256
_EML_EXTENSIONS = {".eml", ".mht", ".mhtml"}
_EML_TYPES = {"message/rfc822", "multipart/related"}
# An e-mail starts with a block of header fields (continuation lines folded in), among them at
# least two of these names, one of which only mail has.
_EML_BLOCK = re.compile(rb"\A(?:[!-9;-~]+:[^\r\n]*\r?\n(?:[ \t][^\r\n]*\r?\n)*){3,}")
_EML_FIELD = re.compile(
    rb"(?im)^(from|to|cc|subject|date|message-id|mime-version|received|"
    rb"return-path|reply-to|delivered-to|content-type):"
)
_EML_ONLY = frozenset({b"from", b"message-id", b"mime-version", b"received", b"return-path",
                       b"delivered-to"})  # fmt: skip
_HWP_SIGNATURE = b"HWP Document File"
_HTML_TYPES = {"text/html", "application/xhtml+xml"}
_MARKDOWN_TYPES = {"text/markdown", "text/x-markdown"}

# Signatures of common binary formats we do not index, named so the message helps the uploader.
_BINARY_SIGNATURES: tuple[tuple[bytes, str], ...] = (
    (b"GIF87a", "GIF image"),
    (b"GIF89a", "GIF image"),
    (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "legacy Office (OLE2, e.g. .doc/.xls)"),
    (b"\x1f\x8b", "gzip archive of an unknown method"),  # deflate ones are read
    (b"\xfd7zXZ\x00", "xz archive"),
    (b"(\xb5/\xfd", "zstd archive"),
    (b"7z\xbc\xaf'\x1c", "7z archive"),
    (b"Rar!\x1a\x07", "RAR archive"),
    (b"HWP Document File V3", "HWP 3.0 document (only HWP 5.0 and HWPX are read)"),
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
# Images OCR reads, and what a refusal calls them.
_IMAGE_SIGNATURES: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "PNG image"),
    (b"\xff\xd8\xff", "JPEG image"),
    (b"II*\x00", "TIFF image"),
    (b"MM\x00*", "TIFF image"),
)
_OLE_SIGNATURE = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
_RTF_SIGNATURE = b"{\\rtf"

# Byte order marks, longest first (the UTF-32 LE mark begins with the UTF-16 LE one).
_BOMS: tuple[tuple[bytes, str], ...] = (
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)

# The first byte of every byte-order mark, and of every signature detect_format looks for at
# the start (PDF aside): bytes that start with none of these (most text) skip those checks.
_BOM_LEADS = frozenset(mark[:1] for mark, _ in _BOMS)
_SIGNATURE_LEADS = frozenset(
    signature[:1]
    for signature in (
        *_ZIP_SIGNATURES,
        _GZIP_SIGNATURE,
        _OLE_SIGNATURE,
        _RTF_SIGNATURE,
        *(signature for signature, _ in _IMAGE_SIGNATURES),
        *(signature for signature, _ in _BINARY_SIGNATURES),
    )
)

_HTML_START = re.compile(
    r"\A(?:\s|<!--.*?-->|<\?xml[^>]*>)*<(?:!doctype\s+html|html|head|body)[\s>/]",
    re.IGNORECASE | re.DOTALL,
)


def zip_name(info: zipfile.ZipInfo) -> str:
    """A ZIP entry's name with ``/`` separators (some Windows tools write ``\\``)."""
    return info.filename.replace("\\", "/")


def _extension(name: str) -> str:
    # Names come from uploaders: take the last path component whatever the separator. Then
    # pathlib's suffix rule (a leading or trailing dot is no suffix) without building a path
    # object, which cost more than the rest of a small document's format detection.
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    dot = base.rfind(".")
    return base[dot:].lower() if 0 < dot < len(base) - 1 else ""


def _media_type(content_type: str | None) -> str:
    if not content_type:
        return ""
    return content_type.split(";", 1)[0].strip().lower()


def bom(data: bytes) -> tuple[str, int] | None:
    """The codec named by a byte order mark at the start of ``data``, and the mark's length."""
    if data[:1] not in _BOM_LEADS:
        return None
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
    if data[:1] in _SIGNATURE_LEADS:
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
    if data[257:262] == b"ustar":
        return "tar archive"
    return "binary content"


def office_document(names: frozenset[str], read: Callable[[str], bytes]) -> tuple[str, str]:
    """The main part of an Office Open XML package and its content type, from the package's
    relationships (``_rels/.rels``) and ``[Content_Types].xml``; ``("", "")`` when it names
    none. Read with patterns, not a parser: these parts are small and only two attributes are
    needed (and detection stays free of lxml's import)."""
    if "_rels/.rels" not in names or "[Content_Types].xml" not in names:
        return "", ""
    target = ""
    for attributes in _RELATIONSHIP.findall(read("_rels/.rels")[:_SMALL_PART]):
        found = {key.lower(): value for key, value in _ATTRIBUTE.findall(attributes)}
        if found.get(b"type", b"").endswith(b"/officeDocument"):
            target = found.get(b"target", b"").decode("utf-8", "replace").lstrip("/")
            break
    if target not in names:
        return "", ""
    types = read("[Content_Types].xml")[:_SMALL_PART]
    for attributes in _OVERRIDE.findall(types):
        found = {key.lower(): value for key, value in _ATTRIBUTE.findall(attributes)}
        if found.get(b"partname", b"").decode("utf-8", "replace").lstrip("/") == target:
            return target, found.get(b"contenttype", b"").decode("ascii", "replace")
    return target, ""


def _zip_format(data: bytes) -> DocumentFormat | None:
    """The document format of a ZIP package; None for another ZIP.

    Raises :class:`ContentInvalid` naming no format when the ZIP's directory is unreadable
    (the caller words it for the format the name says)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            infos = {zip_name(info): info for info in archive.infolist()}
            names = frozenset(infos)
            mimetype = infos.get("mimetype")
            declared = (
                archive.read(mimetype).decode("ascii", "replace").strip()
                if mimetype is not None and mimetype.file_size <= _MIMETYPE_MAX
                else ""
            )
            for root, fmt in _OOXML_ROOTS.items():
                if root in names:
                    return fmt
            _main, content_type = office_document(names, lambda n: archive.read(infos[n]))
    except Exception as exc:  # zipfile raises BadZipFile, ValueError, OSError, ... on damage
        raise ContentInvalid("unreadable ZIP package") from exc
    for marker, fmt in _OOXML_CONTENT_TYPES.items():
        if marker in content_type:
            return fmt
    if declared.endswith("-template"):  # .ott, .ots, .otp: read like the documents
        declared = declared.removesuffix("-template")
    if declared in _PACKAGE_TYPES:
        return _PACKAGE_TYPES[declared]
    if "META-INF/container.xml" in names and any(n.endswith(".opf") for n in names):
        return DocumentFormat.EPUB
    if "Contents/section0.xml" in names:
        return DocumentFormat.HWPX
    if any(n.startswith("word/") for n in names) and "[Content_Types].xml" in names:
        return DocumentFormat.DOCX
    return None


def _package_format(data: bytes, said: DocumentFormat | None) -> DocumentFormat:
    """A ZIP package's format; refused, naming what it is, when none is readable."""
    try:
        fmt = _zip_format(data)
    except ContentInvalid:
        if said is not None:
            raise ContentInvalid(f"corrupt {said.value}: unreadable ZIP package") from None
        raise ContentInvalid("unsupported format: unreadable ZIP archive") from None
    if fmt is not None:
        return fmt
    if said is not None:
        raise ContentInvalid(f"corrupt {said.value}: the ZIP package has no {said.value} parts")
    raise ContentInvalid("unsupported format: ZIP archive of no document format read here")


def _ole_format(data: bytes) -> DocumentFormat:
    """HWP for an OLE2 compound file holding a Hangul document; others are refused."""
    import olefile

    try:
        with olefile.OleFileIO(data) as ole:
            header = ole.exists("FileHeader") and ole.get_size("FileHeader") <= 4096
            if header and ole.openstream("FileHeader").read(32).startswith(_HWP_SIGNATURE):
                return DocumentFormat.HWP
            encrypted = ole.exists("EncryptedPackage")
    except Exception:  # olefile raises OSError, struct.error, ... on damaged input
        encrypted = False
    if encrypted:  # Office keeps a password-protected DOCX/XLSX/PPTX in an OLE2 file
        raise ContentInvalid("Office document is password-protected (encrypted DOCX/XLSX/PPTX)")
    raise ContentInvalid("unsupported format: legacy Office (OLE2, e.g. .doc/.xls)")


def image_kind(data: bytes) -> str | None:
    """``PNG image``, ``JPEG image``, ``TIFF image``, or None for other bytes."""
    return next((kind for signature, kind in _IMAGE_SIGNATURES if data.startswith(signature)), None)


def _looks_like_email(data: bytes) -> bool:
    block = _EML_BLOCK.match(data[:8192])
    if block is None:
        return False
    names = {name.lower() for name in _EML_FIELD.findall(block.group(0))}
    return len(names) >= 2 and bool(names & _EML_ONLY)


def detect_format(data: bytes, name: str, content_type: str | None = None) -> DocumentFormat:
    """What ``data`` is, judged by its content first; ``name`` / ``content_type`` are hints.

    Raises :class:`ContentInvalid` for bytes that cannot be one of the supported formats:
    a ``.pdf`` name (or PDF content type) on non-PDF bytes is a corrupt PDF, a ``.docx``
    (``.pptx``, ``.odt``, ...) on something that is not such a ZIP package is a corrupt DOCX
    (PPTX, ODT, ...), other ZIPs, OLE2 files other than HWP and known binary formats are
    unsupported.
    """
    ext = _extension(name)
    media = _media_type(content_type)
    says_pdf = ext == ".pdf" or media in _PDF_TYPES
    says_package = _PACKAGE_TYPES.get(media) or _PACKAGE_EXTENSIONS.get(ext)

    # Readers accept a PDF header after a little junk within the first KiB; without a PDF
    # name or type, only a header at the start counts (a text may mention "%PDF-").
    if data[:1024].lstrip()[:5] == b"%PDF-" or (says_pdf and b"%PDF-" in data[:1024]):
        return DocumentFormat.PDF
    if data[:1] in _SIGNATURE_LEADS:
        if data.startswith(_ZIP_SIGNATURES):
            return _package_format(data, says_package)
        if data.startswith(_GZIP_SIGNATURE):
            return DocumentFormat.GZIP
        if data.startswith(_OLE_SIGNATURE):
            return _ole_format(data)
        if data.startswith(_RTF_SIGNATURE):
            return DocumentFormat.RTF
        if image_kind(data) is not None:
            return DocumentFormat.IMAGE
    if says_pdf:
        raise ContentInvalid("corrupt PDF: no PDF header")
    if says_package is not None:
        raise ContentInvalid(f"corrupt {says_package.value}: not a ZIP package")
    kind = _binary_kind(data)
    if kind is not None:
        raise ContentInvalid(f"unsupported format: {kind}")

    if _HTML_START.match(_sniff_prefix(data)):
        return DocumentFormat.HTML
    if ext in _EML_EXTENSIONS or media in _EML_TYPES or _looks_like_email(data):
        return DocumentFormat.EML
    if ext in _HTML_EXTENSIONS or media in _HTML_TYPES:
        return DocumentFormat.HTML
    if ext in _MARKDOWN_EXTENSIONS or media in _MARKDOWN_TYPES:
        return DocumentFormat.MARKDOWN
    return DocumentFormat.TEXT
