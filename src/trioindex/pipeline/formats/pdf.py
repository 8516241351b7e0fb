"""PDF to text with pypdf, its content budgeted before pypdf interprets it.

A crafted PDF can make pypdf interpret far more content than the file holds (every page drawing
one large stream); :class:`_PdfBudget` charges each page's content streams and the forms it draws
before its text is extracted (the bounds are in :mod:`.limits`). Encrypted PDFs open only with
the empty password; a PDF without a text layer is refused as needing OCR. pypdf raises many
unrelated exception types on damaged files: all become :class:`ContentInvalid` here.

pypdf logs a WARNING for every repair it makes to a non-compliant file ("EOF marker not
found", ...): noise on a worker's log, since the job's outcome already says whether the file
could be read. Those records are re-logged at DEBUG under this package's logger instead (set up
by :mod:`.extract`, which every process imports before this module).
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from typing import Any

import attrs
import pypdf

from trioindex.errors import ContentInvalid
from trioindex.pipeline.formats.limits import (
    PDF_CONTENT_EXPANSION,
    PDF_MAX_PAGE_CONTENT,
    PDF_MAX_PAGES,
    PDF_MIN_CONTENT_BUDGET,
    MiB,
)
from trioindex.pipeline.formats.messages import failure_name, size_text

__all__ = ["NoTextLayer", "pdf_text"]


class NoTextLayer(ContentInvalid):
    """A PDF whose pages hold no text (scanned, or images only): OCR is needed."""


# The package's logger: the parser modules log under one name, as when they were one module.
logger = logging.getLogger(__package__)


@attrs.define
class _PdfBudget:
    """Decoded content a PDF may make pypdf interpret (see :mod:`.limits`)."""

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
                f"PDF page {page_no} has over {size_text(self.per_page)} of content "
                f"(the per-page limit for a {size_text(self.file_size)} file)"
            )
        self.used += content
        if self.used > self.total:
            raise ContentInvalid(
                f"PDF pages 1-{page_no} have over {size_text(self.total)} of content "
                f"(the limit for all pages of a {size_text(self.file_size)} file)"
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


def pdf_text(data: bytes, max_chars: int) -> tuple[str, int]:
    """The text of every page (pages joined as paragraphs) and the page count."""
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
        raise ContentInvalid(f"PDF over a pypdf safety limit ({failure_name(exc)})") from exc
    except Exception as exc:  # pypdf raises many unrelated types on damaged files
        logger.debug("pypdf failed: %s", failure_name(exc))
        raise ContentInvalid(f"corrupt PDF ({failure_name(exc)})") from exc


def _pdf_text_within(reader: pypdf.PdfReader, budget: _PdfBudget) -> tuple[str, int]:
    if reader.is_encrypted:
        # Many PDFs are "encrypted" with an empty user password only to set permissions.
        try:
            opened = reader.decrypt("")
        except Exception as exc:
            raise ContentInvalid(f"encrypted PDF cannot be opened ({failure_name(exc)})") from exc
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
        raise NoTextLayer(
            f"PDF has no text layer ({page_count} page(s), scanned or image-only): OCR is needed"
        )
    return joined, page_count
