"""OCR of scanned PDFs and images (PNG, JPEG, TIFF) with Tesseract, Korean and English.

Tesseract (Debian's ``tesseract-ocr`` with ``tesseract-ocr-kor`` and ``-eng``) runs as a
subprocess, one page at a time, each within :attr:`OcrPolicy.page_seconds` (a page over it is
killed, marked and skipped). A PDF page is rendered by PDFium (pypdfium2) at
:attr:`OcrPolicy.dpi`, an image decoded by Pillow; either is scaled down to at most
:data:`OCR_MAX_PIXELS` first, and an image declaring more than :data:`IMAGE_MAX_PIXELS` is
refused before it is decoded. At most :data:`OCR_MAX_PAGES` pages are read.

Tesseract reads each page as one block of text (``--psm 6``: on pages that are mostly blank its
automatic layout analysis scattered a Korean paragraph into fragments; columns are read line
by line across). Each page's words come with Tesseract's confidence; a page whose mean
(weighted by word length) is under :attr:`OcrPolicy.low_confidence` is marked with a line of
its own, ``[OCR page N: low confidence, NN%]``, so a reader of a chunk knows the text is
uncertain. A document none of whose pages could be read in time is refused, naming the budget.
"""

from __future__ import annotations

import functools
import io
import math
import os
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Iterator
from typing import Any

import attrs

from trioindex.errors import ContentInvalid
from trioindex.pipeline.formats.limits import IMAGE_MAX_PIXELS, OCR_MAX_PAGES, OCR_MAX_PIXELS
from trioindex.pipeline.formats.messages import refused_as_corrupt
from trioindex.pipeline.formats.outline import Outline

__all__ = ["DEFAULT_OCR", "OcrPolicy", "OcrResult", "ocr_image", "ocr_pdf", "ocr_unavailable"]

_LANGUAGES = ("kor", "eng")


@attrs.frozen
class OcrPolicy:
    """Whether and how OCR runs (the default: on when Tesseract can read Korean and English)."""

    enabled: bool = True
    page_seconds: float = 60.0  # a page's Tesseract run, killed past this
    dpi: int = 200  # a PDF page's rendering, before the pixel bound
    low_confidence: float = 60.0  # a page's mean word confidence (0-100) under this is marked
    psm: int = 6  # Tesseract's page segmentation mode: 6 reads the page as one block of text


DEFAULT_OCR = OcrPolicy()


@attrs.frozen
class OcrResult:
    """The text read, pages read and which of them were marked as of low confidence."""

    text: str = attrs.field(repr=False)
    pages: int
    low_confidence_pages: tuple[int, ...] = ()


@functools.cache
def _installed_languages() -> frozenset[str]:
    tesseract = shutil.which("tesseract")
    if tesseract is None:
        return frozenset()
    try:
        listed = subprocess.run(
            [tesseract, "--list-langs"], capture_output=True, text=True, timeout=30, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    return frozenset(line.strip() for line in listed.splitlines()[1:])


def ocr_unavailable(policy: OcrPolicy) -> str | None:
    """Why OCR cannot run (words for a refusal), or None when it can."""
    if not policy.enabled:
        return "OCR is turned off"
    missing = [lang for lang in _LANGUAGES if lang not in _installed_languages()]
    if missing:
        return "OCR needs Tesseract with Korean and English (tesseract-ocr-kor, -eng)"
    return None


def _tesseract(png: bytes, policy: OcrPolicy) -> tuple[str, float] | None:
    """The text of one page image and its mean word confidence; None past the time budget.

    Tesseract writes the text (its own word spacing: Korean syllables are words in its TSV)
    and the TSV (each word's confidence) to a folder of the call's own."""
    with tempfile.TemporaryDirectory(prefix="trioindex-ocr-") as folder:
        base = os.path.join(folder, "page")
        try:
            done = subprocess.run(
                ["tesseract", "stdin", base, "-l", "+".join(_LANGUAGES), "--psm", str(policy.psm),
                 "txt", "tsv"],
                input=png,
                capture_output=True,
                timeout=policy.page_seconds,
                check=False,
                # one thread: the worker bounds how many parses run at once, each on one core
                env={**os.environ, "OMP_THREAD_LIMIT": "1"},
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            return None
        if done.returncode != 0:
            raise ContentInvalid("corrupt image: Tesseract could not read the page")
        with open(base + ".txt", encoding="utf-8", errors="replace") as text:
            words = text.read()
        with open(base + ".tsv", encoding="utf-8", errors="replace") as table:
            confidence = _confidence(table.read())
    return words.strip(), confidence


def _confidence(tsv: str) -> float:
    """The mean confidence (0-100) of the words in Tesseract's TSV, weighted by length."""
    weight = total = 0.0
    for row in tsv.splitlines()[1:]:
        fields = row.split("\t")
        if len(fields) < 12 or fields[0] != "5" or not fields[11].strip():
            continue
        confidence = float(fields[10])
        if confidence >= 0:
            weight += len(fields[11])
            total += confidence * len(fields[11])
    return total / weight if weight else 0.0


def _png(image: Any) -> bytes:
    """A PIL image, grey, at most OCR_MAX_PIXELS, as PNG bytes for Tesseract's stdin; what is
    transparent is white (as on a page), not the black its colour values often hold."""
    from PIL import Image

    if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
        rgba = image.convert("RGBA")
        image = Image.alpha_composite(Image.new("RGBA", rgba.size, "white"), rgba)
    width, height = image.size
    if width * height > OCR_MAX_PIXELS:
        factor = math.sqrt(OCR_MAX_PIXELS / (width * height))
        image = image.resize((max(1, int(width * factor)), max(1, int(height * factor))))
    out = io.BytesIO()
    image.convert("L").save(out, "PNG")
    return out.getvalue()


def _read_pages(pages: Iterator[bytes], policy: OcrPolicy, max_chars: int) -> OcrResult:
    out = Outline("OCR", max_chars)
    low: list[int] = []
    count = late = 0
    for number, png in enumerate(pages, 1):
        count = number
        read = _tesseract(png, policy)
        if read is None:
            late += 1
            out.paragraph(f"[OCR page {number}: over the time budget of {policy.page_seconds:g} s]")
            continue
        text, confidence = read
        if text.strip() and confidence < policy.low_confidence:
            low.append(number)
            out.paragraph(f"[OCR page {number}: low confidence, {confidence:.0f}%]")
        out.paragraph(text)
    if late and late == count:
        raise ContentInvalid(
            f"OCR took over {policy.page_seconds:g} s on each of {count} page(s) "
            "(the per-page time budget)"
        )
    return OcrResult(out.text(), count, tuple(low))


def _page_count(count: int, what: str) -> None:
    if count > OCR_MAX_PAGES:
        raise ContentInvalid(f"{what} has {count} pages to OCR, over the limit of {OCR_MAX_PAGES}")


def ocr_pdf(data: bytes, policy: OcrPolicy, max_chars: int) -> OcrResult:
    """Every page of a PDF without a text layer, rendered and read."""
    import pypdfium2

    with refused_as_corrupt("PDF"):
        document = pypdfium2.PdfDocument(data)
        try:
            _page_count(len(document), "PDF")

            def rendered() -> Iterator[bytes]:
                for index in range(len(document)):
                    page = document[index]
                    width, height = page.get_size()  # points, 72 to the inch
                    scale = policy.dpi / 72
                    if width * height * scale * scale > OCR_MAX_PIXELS:
                        scale = math.sqrt(OCR_MAX_PIXELS / max(1.0, width * height))
                    bitmap = page.render(scale=scale, grayscale=True)
                    yield _png(bitmap.to_pil())
                    page.close()

            return _read_pages(rendered(), policy, max_chars)
        finally:
            document.close()


def ocr_image(data: bytes, kind: str, policy: OcrPolicy, max_chars: int) -> OcrResult:
    """Every frame of an image (a TIFF may hold many pages), each read as a page."""
    from PIL import Image

    def bounded(image: Any) -> Any:
        width, height = image.size
        if width * height > IMAGE_MAX_PIXELS:
            raise ContentInvalid(
                f"{kind} image of {width}x{height} pixels, over the limit of "
                f"{IMAGE_MAX_PIXELS // 1_000_000} megapixels"
            )
        return image

    with refused_as_corrupt(kind), warnings.catch_warnings():
        # Pillow warns from 89 megapixels; the bound here is lower and refuses instead
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            image = bounded(Image.open(io.BytesIO(data)))  # reads the header only
        except Image.DecompressionBombError:
            raise ContentInvalid(
                f"{kind} image of over {IMAGE_MAX_PIXELS // 1_000_000} megapixels (the limit)"
            ) from None
        frames = getattr(image, "n_frames", 1)
        _page_count(frames, kind)

        def decoded() -> Iterator[bytes]:
            for frame in range(frames):
                image.seek(frame)
                yield _png(bounded(image))  # each frame of a TIFF has a size of its own

        return _read_pages(decoded(), policy, max_chars)
