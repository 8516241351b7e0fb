"""OCR of scanned PDFs and images (PNG, JPEG, TIFF) with Tesseract, Korean and English.

The scans are made in the test: the committed Korean PDF (tests/data/korean.pdf) rendered to
pictures by PDFium, as a scanner would give them, then put in an image-only PDF by fpdf2.
Tesseract comes from Debian's packages (``just setup-ocr``, run by ``just test`` as root); the
tests that need it are skipped, saying so, where it is not installed.
"""

from __future__ import annotations

import functools
import io
import struct
import time
import zlib

import pytest

from testkit.documents import DATA, make_pdf
from tests.pipeline.test_formats import MAX, invalid
from trioindex.pipeline.formats import DocumentFormat, OcrPolicy, detect_format, extract_text
from trioindex.pipeline.formats.ocr import ocr_unavailable

needs_tesseract = pytest.mark.skipif(
    ocr_unavailable(OcrPolicy()) is not None,
    reason="Tesseract with Korean and English is not installed (just setup-ocr installs it)",
)
OFF = OcrPolicy(enabled=False)
PAGE_1 = "대한민국의 수도는 서울입니다. 한글은 세종대왕이 만들었습니다."
PAGE_2 = "셋째 쪽입니다. Mixed 한국어 and English text."


@functools.cache
def scanned_pages(dpi: int = 200) -> tuple[bytes, ...]:
    """The Korean fixture's pages as grey PNG pictures."""
    import pypdfium2

    document = pypdfium2.PdfDocument((DATA / "korean.pdf").read_bytes())
    pages = []
    for index in range(len(document)):
        out = io.BytesIO()
        document[index].render(scale=dpi / 72, grayscale=True).to_pil().save(out, "PNG")
        pages.append(out.getvalue())
    return tuple(pages)


def picture(kind: str, pages: tuple[bytes, ...]) -> bytes:
    from PIL import Image

    images = [Image.open(io.BytesIO(page)) for page in pages]
    out = io.BytesIO()
    options = {"compression": "tiff_deflate"} if kind == "TIFF" else {}
    images[0].save(out, kind, save_all=len(images) > 1, append_images=images[1:], **options)
    return out.getvalue()


def image_only_pdf(pages: tuple[bytes, ...]) -> bytes:
    from fpdf import FPDF

    pdf = FPDF()
    for page in pages:
        pdf.add_page()
        pdf.image(io.BytesIO(page), x=0, y=0, w=210)
    return bytes(pdf.output())


def read(data: bytes, name: str, ocr: OcrPolicy = OcrPolicy()) -> str:  # noqa: B008
    return extract_text(data, name, max_bytes=MAX, ocr=ocr).text


@needs_tesseract
def test_a_scanned_korean_pdf_is_read_by_ocr() -> None:
    got = extract_text(image_only_pdf(scanned_pages()), "scan.pdf", max_bytes=MAX)
    assert got.format is DocumentFormat.PDF
    assert got.page_count == got.ocr_pages == 2
    assert PAGE_1 in got.text and PAGE_2 in got.text
    assert got.low_confidence_pages == ()


@needs_tesseract
@pytest.mark.parametrize("kind", ["PNG", "JPEG", "TIFF"])
def test_images_are_read_by_ocr(kind: str) -> None:
    data = picture(kind, scanned_pages()[:1])
    assert detect_format(data, "upload.bin") is DocumentFormat.IMAGE
    assert PAGE_1 in read(data, f"scan.{kind.lower()}")


@needs_tesseract
def test_every_page_of_a_tiff_is_read() -> None:
    got = extract_text(picture("TIFF", scanned_pages()), "fax.tif", max_bytes=MAX)
    assert got.ocr_pages == 2 and PAGE_2 in got.text


@needs_tesseract
def test_low_confidence_pages_are_marked() -> None:
    # a policy that trusts nothing: the mark is written before the page's text
    text = read(scanned_pages()[1], "scan.png", OcrPolicy(low_confidence=101))
    assert text.startswith("[OCR page 1: low confidence, ")
    assert text.split("\n\n", 1)[1].startswith("셋째")


@needs_tesseract
def test_a_page_over_its_time_budget_is_killed_and_named() -> None:
    started = time.perf_counter()
    message = invalid_with(scanned_pages()[0], "scan.png", OcrPolicy(page_seconds=0.001))
    assert message == "OCR took over 0.001 s on each of 1 page(s) (the per-page time budget)"
    assert time.perf_counter() - started < 5.0


@needs_tesseract
def test_a_blank_scan_is_empty() -> None:
    from testkit.documents import make_image_pdf

    assert invalid(make_image_pdf(pages=1), "blank.pdf") == (
        "PDF has no text layer (1 page(s), scanned or image-only) and OCR found no text"
    )


def test_with_ocr_off_scans_and_images_are_refused_saying_so() -> None:
    assert invalid_with(image_only_pdf(scanned_pages()), "scan.pdf", OFF) == (
        "PDF has no text layer (2 page(s), scanned or image-only): OCR is needed "
        "(OCR is turned off)"
    )
    assert invalid_with(scanned_pages()[0], "scan.png", OFF) == (
        "unsupported format: PNG image (OCR is turned off)"
    )
    # a PDF with a text layer never goes near OCR
    assert read(make_pdf("Text layer."), "a.pdf", OFF) == "Text layer."


def invalid_with(data: bytes, name: str, ocr: OcrPolicy) -> str:
    from trioindex.errors import ContentInvalid

    with pytest.raises(ContentInvalid) as info:
        extract_text(data, name, max_bytes=MAX, ocr=ocr)
    assert "\n" not in info.value.message
    return info.value.message


def _png_header_only(width: int, height: int) -> bytes:
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    chunk = b"IHDR" + header
    ihdr = struct.pack(">I", len(header)) + chunk + struct.pack(">I", zlib.crc32(chunk))
    data = zlib.compress(b"\x00" * 1000)
    idat = (
        struct.pack(">I", len(data))
        + b"IDAT"
        + data
        + struct.pack(">I", zlib.crc32(b"IDAT" + data))
    )
    return b"\x89PNG\r\n\x1a\n" + ihdr + idat


@needs_tesseract
def test_an_image_declaring_too_many_pixels_is_refused_before_decoding() -> None:
    started = time.perf_counter()
    for width, height in ((10_000, 10_000), (100_000, 100_000)):
        message = invalid(_png_header_only(width, height), "huge.png")
        assert message.startswith("PNG image of ") and "40 megapixels" in message
    assert time.perf_counter() - started < 1.0


@needs_tesseract
def test_too_many_pages_and_damaged_images() -> None:
    from PIL import Image

    frames = [Image.new("L", (8, 8), 255) for _ in range(201)]
    out = io.BytesIO()
    frames[0].save(out, "TIFF", save_all=True, append_images=frames[1:])
    assert invalid(out.getvalue(), "many.tif") == "TIFF has 201 pages to OCR, over the limit of 200"
    png = scanned_pages()[0]
    assert invalid(png[: len(png) // 2], "cut.png").startswith("corrupt PNG (")


def test_indexing_parsing_ocr_off_reaches_the_parse() -> None:
    """``indexing.parsing.ocr = off`` -> the worker's steps -> the parse request -> no OCR."""
    import hashlib

    from trioindex.config import load_settings
    from trioindex.errors import ContentInvalid
    from trioindex.pipeline.chunk_values import ChunkingPolicy
    from trioindex.pipeline.chunking import Chunker
    from trioindex.pipeline.parse_process import ParseRequest, parse_document

    settings = load_settings(environ={"TRIOINDEX_PARSING_OCR": "off"})
    assert settings.parsing.ocr == "off"
    png = scanned_pages()[0]
    request = ParseRequest(
        data=png,
        sha256=hashlib.sha256(png).hexdigest(),
        name="scan.png",
        content_type="image/png",
        max_bytes=MAX,
        ocr=settings.parsing.ocr != "off",
    )
    with pytest.raises(ContentInvalid, match=r"PNG image \(OCR is turned off\)"):
        parse_document(request, Chunker(ChunkingPolicy(max_size=500)))
