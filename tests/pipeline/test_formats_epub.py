"""EPUB files written by EbookLib (tests/pipeline/format_samples.py): the text, its structure
(headings, rows as lines) and its order, Korean byte-exact. The hostile variants are in
test_formats_packages.py."""

from __future__ import annotations

import io
import zipfile

from tests.pipeline import format_samples as samples
from tests.pipeline.test_formats import extract, invalid
from trioindex.pipeline.formats import DocumentFormat, detect_format


def test_epub_chapters_in_spine_order_without_the_table_of_contents() -> None:
    got = extract(samples.make_epub(), "book.epub")
    assert got.format is DocumentFormat.EPUB
    assert got.text == (
        f"Chapter two\n\nEnglish text.\n\n1장 시작\n\n{samples.KOREAN_LINE}\n\n둘째 문단."
    )


def test_an_encrypted_epub_is_refused() -> None:
    encryption = (
        b'<encryption xmlns="urn:oasis:names:tc:opendocument:xmlns:container" '
        b'xmlns:enc="http://www.w3.org/2001/04/xmlenc#"><enc:EncryptedData>'
        b'<enc:CipherData><enc:CipherReference URI="EPUB/c2.xhtml"/></enc:CipherData>'
        b"</enc:EncryptedData></encryption>"
    )
    data = samples.rezip(samples.make_epub(), add={"META-INF/encryption.xml": encryption})
    assert invalid(data, "a.epub") == "EPUB is encrypted (DRM): its text cannot be read"


def test_detected_from_content_whatever_the_name() -> None:
    data = samples.make_epub()
    assert detect_format(data, "upload.bin") is DocumentFormat.EPUB
    assert detect_format(data, "notes.docx") is DocumentFormat.EPUB  # content first
    assert zipfile.is_zipfile(io.BytesIO(data))
