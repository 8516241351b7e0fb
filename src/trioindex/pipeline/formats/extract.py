"""The entry point: :func:`extract_text`, uploaded bytes in, normalised text out.

Checks the size, detects the format (:mod:`.detect`), hands the bytes to that format's reader
(:mod:`.text`, :mod:`.html`, :mod:`.pdf`, and one module per structured format, listed in
:data:`_READERS`) and normalises what comes back. This is
the layer boundary: every problem with the bytes is a :class:`ContentInvalid`, and nothing else
escapes for any input (the readers translate their parsers' exceptions).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable

import attrs

from trioindex.errors import ContentInvalid
from trioindex.pipeline.formats.detect import DocumentFormat, detect_format, image_kind
from trioindex.pipeline.formats.limits import TEXT_EXPANSION_LIMIT
from trioindex.pipeline.formats.ocr import DEFAULT_OCR, OcrPolicy
from trioindex.pipeline.formats.text import decode, normalise

# The readers of every format but plain text are imported when a document of their format
# arrives: their parsers (pypdf with cryptography and fontTools, python-docx, lxml) cost ~0.3 s of
# CPU to import, which every worker start paid although small text files are parsed in the worker
# itself and everything else in a parse process (docs/test-results/peer.md, "Where the CPU goes").
# Each reader of a structured format: (module, function), called as (data, max_bytes, max_chars).
_READERS = {
    DocumentFormat.DOCX: ("docx", "docx_text"),
    DocumentFormat.PPTX: ("pptx", "pptx_text"),
    DocumentFormat.XLSX: ("xlsx", "xlsx_text"),
    DocumentFormat.ODT: ("odf", "odt_text"),
    DocumentFormat.ODS: ("odf", "ods_text"),
    DocumentFormat.ODP: ("odf", "odp_text"),
    DocumentFormat.EPUB: ("epub", "epub_text"),
    DocumentFormat.HWPX: ("hwpx", "hwpx_text"),
    DocumentFormat.HWP: ("hwp", "hwp_text"),
    DocumentFormat.RTF: ("rtf", "rtf_text"),
    DocumentFormat.EML: ("eml", "eml_text"),
}

__all__ = ["ExtractedText", "extract_text"]

# The package's logger: the parser modules log under one name, as when they were one module.
logger = logging.getLogger(__package__)


class _PypdfAtDebug(logging.Handler):
    """Takes pypdf's records (its repairs of damaged files) and re-logs them at DEBUG."""

    def emit(self, record: logging.LogRecord) -> None:
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("pypdf %s: %s", record.levelname.lower(), record.getMessage())


def _demote_pypdf_logs() -> None:
    """pypdf's WARNINGs are repairs of non-compliant files, noise on a worker's log (the job's
    outcome says whether the file could be read). Installed here, not in :mod:`.pdf`: that module
    is imported with the first PDF, and the demotion must hold in every process from its start."""
    pypdf_logger = logging.getLogger("pypdf")
    if not any(isinstance(h, _PypdfAtDebug) for h in pypdf_logger.handlers):
        pypdf_logger.addHandler(_PypdfAtDebug())
    pypdf_logger.propagate = False


_demote_pypdf_logs()


@attrs.frozen
class ExtractedText:
    """The text of one document, normalised (:func:`.text.normalise`), and what it was."""

    text: str = attrs.field(repr=False)
    format: DocumentFormat
    page_count: int | None = None  # PDF pages, else None
    replaced: int = 0  # invalid byte sequences replaced by U+FFFD while decoding (text formats)
    ocr_pages: int = 0  # pages read by OCR (a scanned PDF, an image)
    low_confidence_pages: tuple[int, ...] = ()  # of those, the ones marked as uncertain


def extract_text(
    data: bytes,
    name: str,
    content_type: str | None = None,
    *,
    max_bytes: int,
    ocr: OcrPolicy = DEFAULT_OCR,
    detected: DocumentFormat | None = None,
) -> ExtractedText:
    """Detect the format of ``data`` and return its normalised text. ``detected``: what
    :func:`detect_format` already answered for these same ``data``, ``name`` and
    ``content_type`` (a caller that needed the format first), so it is not judged twice.

    Synchronous and CPU-bound (run it in a worker thread). Raises :class:`ContentInvalid` for
    every content problem and nothing else for any input bytes — except ``MemoryError``,
    which is a resource failure rather than a verdict on the document. A gzip file is read as
    the document it holds (:mod:`.compressed`); its ``format`` is that document's. A scanned
    PDF or an image is read by OCR as ``ocr`` says (:mod:`.ocr`).
    """
    if max_bytes <= 0:
        raise ValueError("max_bytes must be positive")
    size = len(data)
    if size > max_bytes:
        raise ContentInvalid(f"file over the maximum size: {size} bytes > {max_bytes} bytes")
    if size == 0:
        raise ContentInvalid("empty file")

    fmt = detected if detected is not None else detect_format(data, name, content_type)
    if fmt is DocumentFormat.GZIP:
        from trioindex.pipeline.formats.compressed import GZIP_MEDIA_TYPES, gunzip, inner_name

        inner = gunzip(data, max_bytes)
        if not inner:
            raise ContentInvalid("empty file: the gzip file holds no bytes")
        name = inner_name(name, data)
        if content_type and content_type.split(";", 1)[0].strip().lower() in GZIP_MEDIA_TYPES:
            content_type = None  # says what the wrapper is, not what it holds
        data = inner
        fmt = detect_format(data, name, content_type)
        if fmt is DocumentFormat.GZIP:
            raise ContentInvalid("unsupported format: gzip inside gzip")
    if fmt is DocumentFormat.IMAGE or fmt is DocumentFormat.PDF:
        read = _read_maybe_by_ocr(data, fmt, max_bytes, ocr)
        if isinstance(read, ExtractedText):
            return read
        raw, page_count, replaced = read
    else:
        raw, page_count, replaced = _read(data, fmt, content_type, max_bytes)
    text = normalise(raw)
    if not text.strip():
        raise ContentInvalid(f"empty document: the {fmt.value} file has no text")
    if replaced:
        logger.debug("%d invalid byte sequence(s) replaced by U+FFFD", replaced)
    return ExtractedText(text=text, format=fmt, page_count=page_count, replaced=replaced)


def _read_maybe_by_ocr(
    data: bytes, fmt: DocumentFormat, max_bytes: int, policy: OcrPolicy
) -> ExtractedText | tuple[str, int | None, int]:
    """A PDF's text layer, or else (and for an image) what OCR reads."""
    from trioindex.pipeline.formats.ocr import ocr_image, ocr_pdf, ocr_unavailable

    max_chars = TEXT_EXPANSION_LIMIT * max_bytes
    if fmt is DocumentFormat.PDF:
        from trioindex.pipeline.formats.pdf import NoTextLayer, pdf_text

        try:
            raw, page_count = pdf_text(data, max_chars)
            return raw, page_count, 0
        except NoTextLayer as scanned:
            unavailable = ocr_unavailable(policy)
            if unavailable is not None:
                raise ContentInvalid(f"{scanned.message} ({unavailable})") from None
            result = ocr_pdf(data, policy, max_chars)
            nothing = f"{scanned.message.split(':')[0]} and OCR found no text"
    else:
        kind = image_kind(data) or "image"
        unavailable = ocr_unavailable(policy)
        if unavailable is not None:
            raise ContentInvalid(f"unsupported format: {kind} ({unavailable})")
        result = ocr_image(data, kind.split()[0], policy, max_chars)
        nothing = f"empty document: OCR found no text in the {kind}"
    text = normalise(result.text)
    if not text.strip():
        raise ContentInvalid(nothing)
    return ExtractedText(
        text=text,
        format=fmt,
        page_count=result.pages if fmt is DocumentFormat.PDF else None,
        ocr_pages=result.pages,
        low_confidence_pages=result.low_confidence_pages,
    )


def _read(
    data: bytes, fmt: DocumentFormat, content_type: str | None, max_bytes: int
) -> tuple[str, int | None, int]:
    """The raw text of ``data`` read as ``fmt`` (any format but PDF and images), its page
    count (None) and the bytes replaced while decoding (text formats)."""
    max_chars = TEXT_EXPANSION_LIMIT * max_bytes
    if fmt in _READERS:
        module, function = _READERS[fmt]
        reader: Callable[[bytes, int, int], str] = getattr(
            importlib.import_module(f"{__package__}.{module}"), function
        )
        return reader(data, max_bytes, max_chars), None, 0
    decoded, replaced = decode(data, fmt, content_type)
    if fmt is DocumentFormat.HTML:
        from trioindex.pipeline.formats.html import html_text

        # Decoded text may carry NULs or lone surrogates that libxml2 would choke on.
        return html_text(normalise(decoded)), None, replaced
    return decoded, None, replaced
