"""Sample documents of the structured formats, written by real writers inside the tests.

PPTX by python-pptx, XLSX by openpyxl, ODT/ODS/ODP by odfpy and EPUB by EbookLib: the same
libraries many programs save these files with. HWPX, HWP 5.0, RTF and e-mail samples are made by
the tests of those formats (tests/pipeline/test_formats_hwp.py, ...). The hostile variants
(bombs, deep nesting, damage) are made from these by :func:`rezip`.
"""

from __future__ import annotations

import datetime
import io
import zipfile
from collections.abc import Callable, Mapping

KOREAN_TITLE = "분기 실적 요약"
KOREAN_LINE = "대한민국의 수도는 서울입니다."


def make_pptx() -> bytes:
    from pptx import Presentation
    from pptx.util import Inches

    deck = Presentation()
    first = deck.slides.add_slide(deck.slide_layouts[1])  # title and content
    first.shapes.title.text = KOREAN_TITLE
    body = first.placeholders[1].text_frame
    body.text = KOREAN_LINE
    bullet = body.add_paragraph()
    bullet.text = "Second bullet"
    bullet.level = 1
    table = first.shapes.add_table(2, 2, Inches(1), Inches(4), Inches(4), Inches(1)).table
    for (r, c), value in {(0, 0): "지역", (0, 1): "매출", (1, 0): "서울", (1, 1): "120"}.items():
        table.cell(r, c).text = value
    first.notes_slide.notes_text_frame.text = "발표자 노트: 천천히."
    second = deck.slides.add_slide(deck.slide_layouts[6])  # blank: no title
    box = second.shapes.add_textbox(Inches(1), Inches(1), Inches(3), Inches(1))
    box.text_frame.text = "A text box without a title"
    out = io.BytesIO()
    deck.save(out)
    return out.getvalue()


def make_xlsx() -> bytes:
    import openpyxl

    book = openpyxl.Workbook()
    sheet = book.active
    sheet.title = "매출"
    sheet.append(["지역", "매출", "비고"])
    sheet.append(["서울", 120, None])
    sheet.append(["부산", 80.5, "증가"])
    sheet["E7"] = "far cell"
    sheet["A9"] = True
    sheet["B9"] = datetime.date(2024, 1, 2)
    book.create_sheet("Notes")["A1"] = "Second sheet text"
    out = io.BytesIO()
    book.save(out)
    return out.getvalue()


def _saved(document: object) -> bytes:
    out = io.BytesIO()
    document.save(out)  # type: ignore[attr-defined]
    return out.getvalue()


def make_odt() -> bytes:
    from odf.opendocument import OpenDocumentText
    from odf.table import Table, TableCell, TableColumn, TableRow
    from odf.text import H, Note, NoteBody, NoteCitation, P, S, Span

    document = OpenDocumentText()
    document.text.addElement(H(outlinelevel=1, text="첫 장 제목"))
    paragraph = P(text="본문 첫 문장입니다.")
    paragraph.addElement(Span(text=" 굵게"))
    paragraph.addElement(S(c=3))
    paragraph.addText("끝")
    note = Note(noteclass="footnote")
    note.addElement(NoteCitation(text="1"))
    note_body = NoteBody()
    note_body.addElement(P(text="각주 내용."))
    note.addElement(note_body)
    paragraph.addElement(note)
    paragraph.addText(" 이어서.")
    document.text.addElement(paragraph)
    table = Table(name="Table1")
    table.addElement(TableColumn(numbercolumnsrepeated=2))
    for row in (["a", "b"], ["c", "d"]):
        table_row = TableRow()
        for value in row:
            cell = TableCell()
            cell.addElement(P(text=value))
            table_row.addElement(cell)
        table.addElement(table_row)
    document.text.addElement(table)
    document.text.addElement(H(outlinelevel=2, text="Sub heading"))
    return _saved(document)


def make_ods() -> bytes:
    from odf.opendocument import OpenDocumentSpreadsheet
    from odf.table import Table, TableCell, TableRow
    from odf.text import P

    document = OpenDocumentSpreadsheet()
    for name, rows in (("예산", [["항목", "금액"], ["식비", "300"]]), ("Other", [["x"]])):
        table = Table(name=name)
        for row in rows:
            table_row = TableRow()
            for value in [*row, ""]:
                cell = TableCell()
                if value:
                    cell.addElement(P(text=value))
                table_row.addElement(cell)
            table.addElement(table_row)
        document.spreadsheet.addElement(table)
    return _saved(document)


def make_odp() -> bytes:
    from odf import draw, presentation, style
    from odf.opendocument import OpenDocumentPresentation
    from odf.text import P

    document = OpenDocumentPresentation()
    layout = style.PageLayout(name="layout")
    document.automaticstyles.addElement(layout)
    master = style.MasterPage(name="master", pagelayoutname=layout)
    document.masterstyles.addElement(master)
    for number, (title, body, notes) in enumerate(
        [(KOREAN_TITLE, KOREAN_LINE, "발표자 노트."), ("Second slide", "Body two.", "")], 1
    ):
        page = draw.Page(name=f"page{number}", masterpagename=master)
        for kind, text in (("title", title), ("outline", body)):
            frame = draw.Frame(width="20cm", height="3cm", x="1cm", y="1cm", **{"class": kind})
            box = draw.TextBox()
            box.addElement(P(text=text))
            frame.addElement(box)
            page.addElement(frame)
        if notes:
            speaker = presentation.Notes()
            frame = draw.Frame(width="20cm", height="3cm", x="1cm", y="1cm", **{"class": "notes"})
            box = draw.TextBox()
            box.addElement(P(text=notes))
            frame.addElement(box)
            speaker.addElement(frame)
            page.addElement(speaker)
        document.presentation.addElement(page)
    return _saved(document)


def make_epub() -> bytes:
    from ebooklib import epub

    book = epub.EpubBook()
    book.set_identifier("sample-1")
    book.set_title("책 제목")
    book.set_language("ko")
    first = epub.EpubHtml(title="1장", file_name="chapter one.xhtml", lang="ko")
    first.content = f"<h1>1장 시작</h1><p>{KOREAN_LINE}</p><p>둘째 문단.</p>"
    second = epub.EpubHtml(title="2", file_name="c2.xhtml")
    second.content = "<h1>Chapter two</h1><p>English text.</p>"
    book.add_item(first)
    book.add_item(second)
    book.toc = (first, second)
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    book.spine = ["nav", second, first]  # reading order is the spine's, not the files'
    out = io.BytesIO()
    epub.write_epub(out, book)
    return out.getvalue()


def rezip(
    data: bytes,
    *,
    replace: Mapping[str, bytes | Callable[[bytes], bytes]] | None = None,
    add: Mapping[str, bytes] | None = None,
    method: int = zipfile.ZIP_DEFLATED,
) -> bytes:
    """``data``'s ZIP with parts replaced (by bytes, or a function of the old bytes) or added
    (by ``method``: deflated by default, so repeated bytes make a small bomb)."""
    out = io.BytesIO()
    with (
        zipfile.ZipFile(io.BytesIO(data)) as original,
        zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as copy,
    ):
        for info in original.infolist():
            content = original.read(info)
            change = (replace or {}).get(info.filename)
            if change is not None:
                content = change(content) if callable(change) else change
            stored = info.filename == "mimetype"  # OpenDocument and EPUB keep it stored first
            copy.writestr(info, content, zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED)
        for name, content in (add or {}).items():
            copy.writestr(name, content, method)
    return out.getvalue()
