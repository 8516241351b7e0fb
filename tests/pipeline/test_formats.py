"""Format detection and text extraction on real files of every supported format.

PDFs are written by fpdf2 and DOCX files by python-docx inside the tests; the Korean PDF is a
committed fixture (tests/data/korean.pdf, see make_korean_pdf.py) because writing Hangul needs
a font that CI machines do not have.
"""

from __future__ import annotations

import io
import logging
import random
import subprocess
import sys
import time
import tracemalloc
import unicodedata
import zipfile

import pytest
from fpdf import FPDF

from testkit.documents import DATA, make_docx, make_image_pdf, make_pdf
from tests import hostile_documents as hostile
from trioindex.errors import ContentInvalid, FailureType
from trioindex.pipeline.formats import (
    PDF_MAX_PAGES,
    DocumentFormat,
    ExtractedText,
    detect_format,
    extract_text,
)

MAX = 5 * 1024 * 1024

KOREAN = (
    "대한민국의 수도는 서울입니다. 한글은 세종대왕이 만들었습니다.\n\n"
    "둘째 문단입니다! 검색 색인이 잘 되나요?"
)


def extract(data: bytes, name: str, content_type: str | None = None) -> ExtractedText:
    return extract_text(data, name, content_type, max_bytes=MAX)


def invalid(data: bytes, name: str, content_type: str | None = None, **kw: int) -> str:
    with pytest.raises(ContentInvalid) as info:
        extract_text(data, name, content_type, max_bytes=kw.get("max_bytes", MAX))
    assert info.value.failure_type is FailureType.DOCUMENT_CONTENT_INVALID
    assert not info.value.retryable
    return info.value.message


# -- plain text and Markdown --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("encoded", "label"),
    [
        (KOREAN.encode("utf-8"), "utf-8"),
        (b"\xef\xbb\xbf" + KOREAN.encode("utf-8"), "utf-8 with BOM"),
        (KOREAN.encode("utf-16"), "utf-16 with BOM (native order)"),
        (b"\xff\xfe" + KOREAN.encode("utf-16-le"), "utf-16-le with BOM"),
        (b"\xfe\xff" + KOREAN.encode("utf-16-be"), "utf-16-be with BOM"),
    ],
)
def test_text_encodings_decode_to_the_same_text(encoded: bytes, label: str) -> None:
    result = extract(encoded, "notes.txt")
    assert result.format is DocumentFormat.TEXT, label
    assert result.text == KOREAN, label
    assert result.page_count is None


def test_line_endings_bom_and_nul_are_normalised() -> None:
    data = b"\xef\xbb\xbfline one\r\nline two\rline\x00 three\n"
    assert extract(data, "a.txt").text == "line one\nline two\nline three\n"


def test_decomposed_korean_is_composed() -> None:
    nfd = unicodedata.normalize("NFD", KOREAN)
    assert nfd != KOREAN
    assert extract(nfd.encode("utf-8"), "mac.txt").text == KOREAN


def test_legacy_korean_encoding_is_detected() -> None:
    # EUC-KR/CP949 without any declaration: charset detection has to find it.
    text = KOREAN * 5
    assert extract(text.encode("cp949"), "old.txt").text == text


def test_content_type_charset_is_honoured_for_text() -> None:
    data = "café crème brûlée, déjà vu".encode("latin-1")
    result = extract(data, "menu.txt", "text/plain; charset=ISO-8859-1")
    assert result.text == "café crème brûlée, déjà vu"


def test_markdown_is_kept_as_written() -> None:
    source = "# 제목\n\n본문 *강조* 입니다.\n\n- 항목 하나\n- 항목 둘\n"
    result = extract(source.encode(), "README.md")
    assert result.format is DocumentFormat.MARKDOWN
    assert result.text == source
    assert extract(source.encode(), "notes", "text/markdown").format is DocumentFormat.MARKDOWN


# -- HTML ---------------------------------------------------------------------------------------

PAGE = """<!DOCTYPE html>
<html><head><meta charset="euc-kr"><title>문서 제목</title>
<style>body { color: red; }</style>
<script>var secret = "<p>not text</p>";</script></head>
<body>
<h1>안녕하세요</h1>
<p>첫째   문단
입니다. <b>굵게</b>와 <i>기울임</i> &amp; 엔티티.</p>
<div>줄<br>바꿈</div>
<table><tr><td>가</td><td>나</td></tr><tr><td>다</td><td>라</td></tr></table>
<pre>  code
    indented</pre>
<p hidden>숨김 글</p><noscript>스크립트 없음</noscript><!-- 주석 -->
<ul><li>하나<li>둘</ul>
</body></html>"""


def test_html_visible_text_only_with_declared_charset() -> None:
    result = extract(PAGE.encode("cp949"), "page.html")
    assert result.format is DocumentFormat.HTML
    assert result.text == (
        "문서 제목\n\n안녕하세요\n\n첫째 문단 입니다. 굵게와 기울임 & 엔티티.\n\n"
        "줄\n바꿈\n\n가 나\n다 라\n\n  code\n    indented\n\n하나\n둘"
    )
    for hidden in ("color", "secret", "not text", "숨김", "스크립트", "주석"):
        assert hidden not in result.text


def test_html_http_equiv_and_content_type_charset() -> None:
    body = "<p>한국어 본문입니다.</p>"
    http_equiv = (
        '<html><head><meta http-equiv="Content-Type" content="text/html; charset=EUC-KR">'
        f"</head><body>{body}</body></html>"
    )
    assert extract(http_equiv.encode("cp949"), "a.htm").text == "한국어 본문입니다."
    # The transport's charset wins over nothing declared in the document.
    assert extract(body.encode("cp949"), "b.html", "text/html; charset=euc-kr").text == (
        "한국어 본문입니다."
    )


def test_html_bom_overrides_a_wrong_meta_charset() -> None:
    page = '<html><head><meta charset="iso-8859-1"></head><body><p>한글</p></body></html>'
    assert extract(page.encode("utf-16"), "x.html").text == "한글"


def test_html_is_detected_from_content_whatever_the_name() -> None:
    page = b"<!doctype html><html><body><p>Hello <script>x()</script>world</p></body></html>"
    result = extract(page, "download.txt")
    assert result.format is DocumentFormat.HTML
    assert result.text == "Hello world"


def test_html_with_only_scripts_is_empty() -> None:
    msg = invalid(b"<html><head><script>var a = 1;</script></head><body> </body></html>", "a.html")
    assert "no text" in msg


# -- PDF ----------------------------------------------------------------------------------------


def test_pdf_text_layer_and_page_count() -> None:
    data = make_pdf("First page. It has two sentences.", "Second page here.")
    result = extract(data, "report.pdf")
    assert result.format is DocumentFormat.PDF
    assert result.page_count == 2
    assert result.text == "First page. It has two sentences.\n\nSecond page here."


def test_korean_pdf_fixture() -> None:
    result = extract((DATA / "korean.pdf").read_bytes(), "korean.pdf", "application/pdf")
    assert result.page_count == 2
    assert "대한민국의 수도는 서울입니다." in result.text
    assert "정말 그런가요?" in result.text
    assert result.text.endswith("셋째 쪽입니다. Mixed 한국어 and English text.")
    assert unicodedata.is_normalized("NFC", result.text)


def test_scanned_pdf_needs_ocr() -> None:
    msg = invalid(make_image_pdf(pages=2), "scan.pdf")
    assert "no text layer" in msg
    assert "OCR" in msg
    assert "2 page" in msg


def test_truncated_pdf_is_corrupt() -> None:
    data = make_pdf("Some text that will be cut off.")
    assert "corrupt PDF" in invalid(data[: len(data) // 3], "cut.pdf")


def test_pdf_name_on_other_bytes_is_a_corrupt_pdf() -> None:
    assert invalid(b"just some text", "fake.pdf") == "corrupt PDF: no PDF header"
    assert "corrupt PDF" in invalid(b"plain", "fake", "application/pdf")


def test_pypdf_repair_warnings_go_to_debug_not_the_worker_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The worker's log is a handler on the root logger (trioindex.logs): a pypdf WARNING
    about a repair ("EOF marker not found", ...) must reach it only as a DEBUG line."""
    data = make_pdf("A page whose cross-reference pointer is wrong.")
    data = data[: data.rindex(b"startxref")] + b"startxref\n1\n%%EOF\n"  # pypdf repairs it
    worker_log: list[logging.LogRecord] = []

    class WorkerLog(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            worker_log.append(record)

    handler = WorkerLog()
    logging.getLogger().addHandler(handler)
    try:
        with caplog.at_level(logging.DEBUG):
            result = extract(data, "repaired.pdf")
    finally:
        logging.getLogger().removeHandler(handler)
    assert result.text == "A page whose cross-reference pointer is wrong."
    assert [r.getMessage() for r in worker_log if r.levelno >= logging.WARNING] == []
    debug = [r.getMessage() for r in worker_log if r.name == "trioindex.pipeline.formats"]
    assert any("incorrect startxref pointer" in m for m in debug), debug


def test_password_protected_pdf() -> None:
    pdf = FPDF()
    pdf.set_encryption(owner_password="owner", user_password="secret")
    pdf.add_page()
    pdf.set_font("helvetica", size=12)
    pdf.cell(text="Locked text.")
    assert invalid(bytes(pdf.output()), "locked.pdf") == "PDF is password-protected"


def test_pdf_encrypted_with_an_empty_user_password_is_read() -> None:
    pdf = FPDF()
    pdf.set_encryption(owner_password="owner", user_password="")
    pdf.add_page()
    pdf.set_font("helvetica", size=12)
    pdf.cell(text="Readable text.")
    assert extract(bytes(pdf.output()), "perm.pdf").text == "Readable text."


# -- DOCX ---------------------------------------------------------------------------------------


def test_docx_paragraphs_and_tables_in_order() -> None:
    data = make_docx(
        "첫째 문단입니다.",
        "Second paragraph.",
        table=[["이름", "값"], ["alpha", "1"]],
    )
    result = extract(data, "doc.docx")
    assert result.format is DocumentFormat.DOCX
    assert result.page_count is None
    assert result.text == "첫째 문단입니다.\n\nSecond paragraph.\n\n이름\n\n값\n\nalpha\n\n1"


def test_docx_detected_from_content_and_decomposed_korean_composed() -> None:
    data = make_docx(unicodedata.normalize("NFD", "한글 문서"))
    result = extract(data, "upload.bin")
    assert result.format is DocumentFormat.DOCX
    assert result.text == "한글 문서"


def test_empty_docx() -> None:
    assert "no text" in invalid(make_docx("", "   "), "blank.docx")


def test_truncated_docx_is_corrupt() -> None:
    data = make_docx("Some text.")
    assert "corrupt DOCX" in invalid(data[: len(data) // 2], "cut.docx")


def test_docx_name_on_other_bytes() -> None:
    assert invalid(b"hello", "fake.docx") == "corrupt DOCX: not a ZIP package"


def test_zip_without_word_tree_is_unsupported() -> None:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("data/records.csv", "a,b")
    assert invalid(out.getvalue(), "book.zip").startswith("unsupported format")
    assert "corrupt DOCX" in invalid(out.getvalue(), "book.docx")


def test_docx_decompression_bomb_is_refused() -> None:
    source = io.BytesIO(make_docx("Innocent text."))
    out = io.BytesIO()
    with (
        zipfile.ZipFile(source) as original,
        zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as bomb,
    ):
        for info in original.infolist():
            bomb.writestr(info, original.read(info))
        bomb.writestr("word/media/padding.bin", b"\x00" * (64 * 1024 * 1024))
    data = out.getvalue()
    assert len(data) < 1024 * 1024  # zeros compress ~1000:1
    msg = invalid(data, "bomb.docx", max_bytes=1024 * 1024)
    assert "decompression bomb" in msg


# -- bounded work on hostile files (issue 11 §4) ------------------------------------------------

MiB = 1024 * 1024


def timed_invalid(data: bytes, name: str, **kw: int) -> tuple[str, float]:
    started = time.perf_counter()
    message = invalid(data, name, **kw)
    return message, time.perf_counter() - started


def refusal_cost(data: bytes, name: str, **kw: int) -> tuple[str, float, int]:
    """The one-line refusal of ``data``, the seconds it took and tracemalloc's peak bytes."""
    tracemalloc.start()
    try:
        message, elapsed = timed_invalid(data, name, **kw)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "\n" not in message
    return message, elapsed, peak


def test_pdf_pages_sharing_one_heavy_content_stream_are_refused_before_interpretation() -> None:
    # main: 26 s (about 4 s per page), and max_chars never tripped: the pages emit no text
    data = hostile.pdf_sharing_one_heavy_stream(pages=6, content_bytes=3_600_000)
    assert len(data) < 16 * 1024
    message, elapsed = timed_invalid(data, "heavy.pdf")
    assert message.startswith("PDF page 1 has over 1 MiB of content (the per-page limit")
    assert elapsed < 2.0, "refused from the stream sizes, before pypdf interprets page 1"


def test_pdf_content_over_the_total_for_its_size_is_refused() -> None:
    # Each page is under the per-page limit; together they are not (main: ~4 s, then "no text
    # layer" after interpreting every page).
    data = hostile.pdf_sharing_one_heavy_stream(pages=6, content_bytes=600_000)
    # refused before page 2 is interpreted: one page of work instead of six
    assert invalid(data, "heavy.pdf").startswith(
        "PDF pages 1-2 have over 1 MiB of content (the limit for all"
    )


def test_pdf_with_a_page_tree_of_a_million_pages_is_refused() -> None:
    data = hostile.pdf_page_tree_bomb(levels=6, fanout=10)
    assert len(data) < 2048
    message, elapsed = timed_invalid(data, "pages.pdf")
    assert message == f"PDF has more than {PDF_MAX_PAGES} pages (the limit)"
    assert elapsed < 2.0


def test_docx_that_inflates_far_beyond_its_own_size_is_refused_before_inflating() -> None:
    # Under the old cap (8 x max-document-size = 64 MiB here) the 40 MiB document.xml was
    # parsed whole: minutes and over a GiB (issue 11: 60 MiB took 140 s and 1.4 GiB).
    data = hostile.docx_bomb(make_docx("Innocent text."), xml_bytes=40 * MiB)
    assert len(data) < 512 * 1024
    tracemalloc.start()
    try:
        message, elapsed = timed_invalid(data, "bomb.docx", max_bytes=8 * MiB)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "decompression bomb" in message
    assert "the limit for a" in message
    assert peak < 4 * MiB and elapsed < 2.0


def test_docx_over_the_absolute_xml_cap_is_refused() -> None:
    # Random words do not compress, so the ratio passes; but python-docx would build a tree of
    # 36 MiB of XML (~20x that in memory): the absolute cap refuses it.
    rng = random.Random(2)
    words = [
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
        for _ in range(2000)
    ]
    paragraph = " ".join(rng.choice(words) for _ in range(2000))
    body = f"<w:p><w:r><w:t>{paragraph}</w:t></w:r></w:p>" * (36 * MiB // len(paragraph))
    xml = (
        '<?xml version="1.0" encoding="UTF-8" standalone="yes"?><w:document xmlns:w='
        f'"http://schemas.openxmlformats.org/wordprocessingml/2006/main"><w:body>{body}'
        "</w:body></w:document>"
    )
    out = io.BytesIO()
    with (
        zipfile.ZipFile(io.BytesIO(make_docx("x"))) as original,
        zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as big,
    ):
        for info in original.infolist():
            if info.filename != "word/document.xml":
                big.writestr(info.filename, original.read(info))
        big.writestr("word/document.xml", xml)
    message = invalid(out.getvalue(), "big.docx", max_bytes=64 * MiB)
    assert message.startswith("DOCX holds more than 32 MiB of XML (the limit)")


# -- almost-right text (issue 11 §5) ------------------------------------------------------------

KOREAN_20KB = (KOREAN.replace("?", "") + " 마지막 문장은 한글로 끝") * 140


def test_utf8_cut_in_the_middle_of_its_last_character_is_decoded_with_one_replacement() -> None:
    encoded = KOREAN_20KB.encode("utf-8")
    assert len(encoded) > 20_000 and encoded[-3:] == "끝".encode()
    result = extract(encoded[:-1], "cut.txt")
    assert result.text == KOREAN_20KB[:-1] + "\ufffd"
    assert result.replaced == 1


def test_a_stray_byte_inside_a_character_is_replaced_and_the_rest_kept() -> None:
    encoded = KOREAN_20KB.encode("utf-8")
    middle = len(encoded) // 2
    while encoded[middle] & 0xC0 != 0x80:  # land inside a character on purpose
        middle += 1
    damaged = encoded[:middle] + b"\xff" + encoded[middle:]
    result = extract(damaged, "stray.txt")
    assert 1 <= result.replaced <= 4  # a lead byte, 0xFF, orphaned continuation bytes
    head, _, tail = result.text.partition("\ufffd")
    assert KOREAN_20KB.startswith(head) and KOREAN_20KB.endswith(tail.lstrip("\ufffd"))
    assert len(result.text) >= len(KOREAN_20KB) - 1
    # BOM'd UTF-8 gets the same tolerance; a lone stray byte between characters costs one
    with_bom = b"\xef\xbb\xbf" + encoded[:100] + b"\xfe" + encoded[100:]
    assert extract(with_bom, "bom.txt").replaced == 1


def test_binary_or_mixed_up_bytes_are_still_refused() -> None:
    korean = KOREAN_20KB.encode("utf-8")
    rng = random.Random(9)
    garbage = bytes(rng.randrange(0x80, 0x100) for _ in range(1024))
    # UTF-8 with a kilobyte of garbage inside (main refused this one too, but let charset
    # detection turn other such files into a Cyrillic-codepage mojibake)
    assert invalid(korean[:9000] + garbage + korean[9000:], "mixed.txt").startswith(
        "undecodable bytes: UTF-8 text with more than"
    )
    # UTF-8 followed by the same text in CP949: two encodings in one file
    assert invalid(korean + KOREAN_20KB.encode("cp949"), "two.txt").startswith("undecodable bytes")
    # random bytes (no NUL, so not caught as binary by the signature check)
    noise = bytes(rng.randrange(1, 256) for _ in range(20_000))
    assert invalid(noise, "noise.txt").startswith("undecodable bytes")
    # and legacy single-byte text is still detected, not "repaired" as UTF-8
    latin = extract(("café crème " + "plain words " * 300).encode("cp1252"), "menu.txt")
    assert latin.text.startswith("café cr") and latin.replaced == 0


# -- unsupported, empty, undecodable, too large -------------------------------------------------


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (b"GIF89a" + b"\x00" * 20, "GIF"),  # PNG, JPEG and TIFF are read by OCR
        (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\x00" * 20, "OLE2"),
        (b"\xfd7zXZ\x00" + b"\x00" * 20, "xz"),
        (b"abc\x00\x01\x02def", "binary"),
    ],
)
def test_binary_formats_are_unsupported(data: bytes, kind: str) -> None:
    msg = invalid(data, "file.txt")
    assert msg.startswith("unsupported format")
    assert kind in msg


def test_text_that_looks_like_a_signature_is_still_text() -> None:
    for text in ("MZ is a pair of initials.", "ID3 tags, RIFF chunks, BZh.", "See %PDF-1.7 spec"):
        assert extract(text.encode(), "notes.txt").text == text
    assert invalid(b"MZ\x90\x00\x03\x00", "tool.txt") == "unsupported format: executable"
    junk_then_pdf = b"junk line\n" + make_pdf("Late header.")
    assert extract(junk_then_pdf, "late.pdf").text == "Late header."


@pytest.mark.parametrize("name", ["a.txt", "a.md", "a.html", "a"])
def test_blank_text_is_empty(name: str) -> None:
    assert "no text" in invalid(b" \r\n\t \n\xc2\xa0 ", name)
    assert invalid(b"", name) == "empty file"


def test_invalid_bytes_after_a_bom_are_undecodable() -> None:
    assert invalid(b"\xff\xfe\x00\xd8", "a.txt").startswith("undecodable bytes")
    assert invalid(b"\xef\xbb\xbfok \xff\xfe\xfd", "a.txt").startswith("undecodable bytes")


def test_over_the_size_limit() -> None:
    msg = invalid(b"x" * 101, "a.txt", max_bytes=100)
    assert msg == "file over the maximum size: 101 bytes > 100 bytes"
    assert extract_text(b"x" * 100, "a.txt", max_bytes=100).text == "x" * 100


def test_messages_never_quote_the_content() -> None:
    secret = "TOPSECRET-CONTENT"
    cases = [
        (make_pdf(secret)[:300], "s.pdf"),
        (make_docx(secret)[:500], "s.docx"),
        (b"\xff\xfe" + secret.encode("utf-8"), "s.txt"),  # odd length: not UTF-16
    ]
    for data, name in cases:
        assert secret not in invalid(data, name)


# -- detect_format ------------------------------------------------------------------------------


def test_detection_prefers_content_to_name() -> None:
    assert detect_format(make_pdf("x"), "notes.txt") is DocumentFormat.PDF
    assert detect_format(make_docx("x"), "notes.txt") is DocumentFormat.DOCX
    assert detect_format(b"<html><body>x</body></html>", "notes.md") is DocumentFormat.HTML
    assert detect_format(b"plain words", "page.html") is DocumentFormat.HTML
    assert detect_format(b"# title", "x", "text/markdown; charset=utf-8") is (
        DocumentFormat.MARKDOWN
    )
    assert detect_format(b"plain words", "C:\\docs\\notes.TXT") is DocumentFormat.TEXT
    assert detect_format(b"plain words", "no-extension") is DocumentFormat.TEXT
    utf16_html = "<!DOCTYPE html><p>x</p>".encode("utf-16")
    assert detect_format(utf16_html, "a.txt") is DocumentFormat.HTML


def test_the_name_hint_is_the_suffix_of_the_names_last_component() -> None:
    title = b"# title"
    for name in ("notes.MD", "a/b.txt/notes.md", "a\\b.txt\\notes.md", "x.tar.md"):
        assert detect_format(title, name) is DocumentFormat.MARKDOWN, name
    # a folder's suffix, a hidden file's leading dot and a trailing dot are no suffix
    for name in ("notes.md/readme", ".md", "a/.md", "notes.md.", "", "."):
        assert detect_format(title, name) is DocumentFormat.TEXT, name


def test_the_worker_starts_without_the_document_parsers() -> None:
    """pypdf, python-docx, bs4 and lxml are imported with the first document that needs them:
    a worker process parsing small text files inline never pays ~0.3 s of CPU to load them."""
    heavy = ("pypdf", "docx", "bs4", "lxml")
    probe = (
        "import sys, trioindex.cli, trioindex.worker.wiring\n"
        f"print(sorted(m for m in {heavy!r} if m in sys.modules))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert loaded.strip() == "[]"
    # and a PDF, a DOCX and an HTML page still read (each reader imported when first needed)
    assert "Hello" in extract(make_pdf("Hello PDF"), "a.pdf").text
    assert "Hello" in extract(make_docx("Hello DOCX"), "a.docx").text
    assert "Hello" in extract(b"<html><body><p>Hello HTML</p></body></html>", "a.html").text
