"""OpenDocument files (ODT, ODS, ODP) written by odfpy (tests/pipeline/format_samples.py): the text, its structure
(headings, rows as lines) and its order, Korean byte-exact. The hostile variants are in
test_formats_packages.py."""

from __future__ import annotations

from tests.pipeline import format_samples as samples
from tests.pipeline.test_formats import extract, invalid
from trioindex.pipeline.formats import DocumentFormat, detect_format


def test_odt_headings_footnotes_and_tables() -> None:
    got = extract(samples.make_odt(), "letter.odt")
    assert got.format is DocumentFormat.ODT
    assert got.text == (
        "# 첫 장 제목\n\n"
        "본문 첫 문장입니다. 굵게   끝 이어서.\n\n"
        "각주 내용.\n\n"
        "a | b\nc | d\n\n"
        "## Sub heading"
    )


def test_ods_sheets_and_odp_slides() -> None:
    sheets = extract(samples.make_ods(), "budget.ods")
    assert sheets.format is DocumentFormat.ODS
    assert sheets.text == "# 예산\n\n항목 | 금액\n식비 | 300\n\n# Other\n\nx"
    slides = extract(samples.make_odp(), "talk.odp")
    assert slides.format is DocumentFormat.ODP
    assert slides.text == (
        f"# {samples.KOREAN_TITLE}\n\n{samples.KOREAN_LINE}\n\n발표자 노트.\n\n"
        "# Second slide\n\nBody two."
    )


def test_detected_from_content_whatever_the_name() -> None:
    for make, fmt in (
        (samples.make_odt, DocumentFormat.ODT),
        (samples.make_ods, DocumentFormat.ODS),
        (samples.make_odp, DocumentFormat.ODP),
    ):
        data = make()
        assert detect_format(data, "upload.bin") is fmt
        assert detect_format(data, "notes.docx") is fmt  # content first


def test_templates_read_like_documents() -> None:
    def template(mimetype: bytes) -> bytes:
        return mimetype + b"-template"

    data = samples.rezip(samples.make_odt(), replace={"mimetype": template})
    assert detect_format(data, "form.ott") is DocumentFormat.ODT


def test_a_password_protected_file_is_refused() -> None:
    manifest = (
        b'<manifest:manifest xmlns:manifest="urn:oasis:names:tc:opendocument:xmlns:manifest:1.0">'
        b'<manifest:file-entry manifest:full-path="content.xml" manifest:media-type="text/xml">'
        b'<manifest:encryption-data manifest:checksum-type="SHA1"/></manifest:file-entry>'
        b"</manifest:manifest>"
    )
    data = samples.rezip(
        samples.make_ods(),
        replace={"META-INF/manifest.xml": manifest, "content.xml": b"\x8f\x03 encrypted bytes"},
    )
    assert invalid(data, "budget.ods") == "ODS is password-protected"
