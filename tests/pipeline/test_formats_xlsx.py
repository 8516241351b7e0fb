"""XLSX files written by openpyxl (tests/pipeline/format_samples.py): the text, its structure
(headings, rows as lines) and its order, Korean byte-exact. The hostile variants are in
test_formats_packages.py."""

from __future__ import annotations

import io
import zipfile

from tests.pipeline import format_samples as samples
from tests.pipeline.test_formats import extract
from trioindex.pipeline.formats import DocumentFormat, detect_format


def test_xlsx_sheets_as_headings_and_rows_as_lines() -> None:
    got = extract(samples.make_xlsx(), "book.xlsx")
    assert got.format is DocumentFormat.XLSX
    assert got.text == (
        "# 매출\n\n"
        "지역 | 매출 | 비고\n"
        "서울 | 120\n"
        "부산 | 80.5 | 증가\n"
        "far cell\n"
        "TRUE | 45293\n\n"  # a date is stored as its serial number
        "# Notes\n\n"
        "Second sheet text"
    )


def test_xlsx_inline_strings_and_phonetic_guides() -> None:
    sheet = (
        b'<worksheet xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main"><sheetData>'
        b'<row r="1"><c r="A1" t="inlineStr"><is><t>inline </t><r><t>runs</t></r></is></c>'
        b'<c r="B1" t="e"><v>#DIV/0!</v></c><c r="C1" t="s"><v>0</v></c><c r="D1" t="s"><v>99</v></c></row>'
        b"</sheetData></worksheet>"
    )
    shared = (
        '<sst xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main">'
        '<si><t>漢字</t><rPh sb="0" eb="2"><t>かんじ</t></rPh></si></sst>'
    ).encode()
    relationship = (
        b'<Relationship Id="rId99" Target="sharedStrings.xml" Type="http://schemas.openxmlformats'
        b'.org/officeDocument/2006/relationships/sharedStrings"/></Relationships>'
    )
    data = samples.rezip(
        samples.make_xlsx(),  # openpyxl writes inline strings: add Excel's shared ones
        replace={
            "xl/worksheets/sheet1.xml": sheet,
            "xl/_rels/workbook.xml.rels": lambda xml: xml.replace(
                b"</Relationships>", relationship
            ),
        },
        add={"xl/sharedStrings.xml": shared},
    )
    assert extract(data, "a.xlsx").text.startswith(
        "# 매출\n\ninline runs | #DIV/0! | 漢字\n\n# Notes"
    )


def test_detected_from_content_whatever_the_name() -> None:
    data = samples.make_xlsx()
    assert detect_format(data, "upload.bin") is DocumentFormat.XLSX
    assert detect_format(data, "notes.docx") is DocumentFormat.XLSX  # content first
    assert zipfile.is_zipfile(io.BytesIO(data))


def test_packages_made_elsewhere_backslashes_and_a_main_part_named_by_its_relationships() -> None:
    data = samples.make_xlsx()
    # a Windows tool writing "xl\worksheets\sheet1.xml"
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as original, zipfile.ZipFile(out, "w") as copy:
        for info in original.infolist():
            copy.writestr(info.filename.replace("/", "\\"), original.read(info))
    assert extract(out.getvalue(), "a.xlsx").text.startswith("# 매출\n\n지역 | 매출 | 비고")
    # a minimal package: the workbook at the root, found through _rels/.rels
    moved = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as original, zipfile.ZipFile(moved, "w") as copy:
        for info in original.infolist():
            content = original.read(info).replace(b"/xl/", b"/").replace(b'"xl/', b'"')
            copy.writestr(info.filename.removeprefix("xl/"), content)
    assert "xl/workbook.xml" not in zipfile.ZipFile(moved).namelist()
    assert detect_format(moved.getvalue(), "book.bin") is DocumentFormat.XLSX
    assert extract(moved.getvalue(), "a.xlsx").text.startswith("# 매출\n\n지역 | 매출 | 비고")
