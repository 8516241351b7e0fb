"""HWPX (Hangul OWPML) documents: paragraphs, tables, headers, footers, footnotes, Korean
byte-exact.

No program on a CI machine writes HWPX, so :func:`make_hwpx` *generates* the sample: a package
laid out part for part like one saved by Hancom Office Hangul (the ``mimetype`` part stored
first, ``version.xml``, ``META-INF/container.xml``, ``Contents/content.hpf``, ``header.xml``
and one XML part per section, the element names and namespaces of OWPML 2011). The reader was
also checked on 41 real files saved by Hangul (docs/test-results/formats.md), which are not
committed.
"""

from __future__ import annotations

import io
import zipfile

from tests.pipeline.test_formats import extract, invalid
from trioindex.pipeline.formats import DocumentFormat, detect_format

_NAMESPACES = (
    'xmlns:hp="http://www.hancom.co.kr/hwpml/2011/paragraph" '
    'xmlns:hs="http://www.hancom.co.kr/hwpml/2011/section" '
    'xmlns:hc="http://www.hancom.co.kr/hwpml/2011/core" '
    'xmlns:hh="http://www.hancom.co.kr/hwpml/2011/head"'
)
_DECLARATION = '<?xml version="1.0" encoding="UTF-8" standalone="yes" ?>'


def _p(*runs: str) -> str:
    body = "".join(f'<hp:run charPrIDRef="0">{run}</hp:run>' for run in runs)
    return f'<hp:p id="0" paraPrIDRef="0" styleIDRef="0" pageBreak="0">{body}</hp:p>'


def _sub_list(*paragraphs: str) -> str:
    return f'<hp:subList id="" textDirection="HORIZONTAL">{"".join(paragraphs)}</hp:subList>'


def _table(rows: list[list[str]]) -> str:
    cells = "".join(
        "<hp:tr>"
        + "".join(f'<hp:tc name=""><hp:subList>{_p(f"<hp:t>{v}</hp:t>")}</hp:subList></hp:tc>'
                  for v in row)
        + "</hp:tr>"
        for row in rows
    )  # fmt: skip
    return f'<hp:tbl id="1" rowCnt="{len(rows)}" colCnt="{len(rows[0])}">{cells}</hp:tbl>'


SECTION0 = (
    f"{_DECLARATION}<hs:sec {_NAMESPACES}>"
    + _p(
        '<hp:secPr id="" textDirection="HORIZONTAL"><hp:pagePr width="59528"/></hp:secPr>'
        '<hp:ctrl><hp:header id="1" applyPageType="BOTH">'
        + _sub_list(_p("<hp:t>머리말 테스트</hp:t>"))
        + '</hp:header></hp:ctrl><hp:ctrl><hp:footer id="2" applyPageType="BOTH">'
        + _sub_list(_p("<hp:t>꼬리말 쪽</hp:t>"))
        + "</hp:footer></hp:ctrl>",
        "<hp:t>대한민국의 수도는 서울입니다.</hp:t>",
    )
    + _p(
        '<hp:ctrl><hp:fieldBegin id="5" type="HYPERLINK"><hp:parameters cnt="1">'
        '<hp:stringParam name="Command">www.example.com</hp:stringParam></hp:parameters>'
        "</hp:fieldBegin></hp:ctrl>",
        "<hp:t>한글은<hp:tab/>세종대왕이<hp:lineBreak/>만들었습니다.</hp:t>",
        '<hp:ctrl><hp:footNote number="1">'
        + _sub_list(_p("<hp:t>각주 내용입니다.</hp:t>"))
        + "</hp:footNote></hp:ctrl>",
        "<hp:t> 이어지는 문장.</hp:t>",
    )
    + _p(_table([["이름", "점수"], ["김철수", "90"]]), "<hp:t/>")
    + "</hs:sec>"
)
SECTION1 = f"{_DECLARATION}<hs:sec {_NAMESPACES}>{_p('<hp:t>둘째 구역.</hp:t>')}</hs:sec>"


def make_hwpx(sections: tuple[str, ...] = (SECTION0, SECTION1)) -> bytes:
    """A generated HWPX package (module docstring)."""
    items = "".join(
        f'<opf:item id="section{i}" href="Contents/section{i}.xml" media-type="application/xml"/>'
        for i in range(len(sections))
    )
    spine = "".join(f'<opf:itemref idref="section{i}" linear="yes"/>' for i in range(len(sections)))
    parts = {
        "version.xml": f'{_DECLARATION}<hv:HCFVersion xmlns:hv="http://www.hancom.co.kr/hwpml/2011/version" tagetApplication="WORDPROCESSOR" major="5" minor="0" micro="5" xmlVersion="1.4"/>',
        "Contents/header.xml": f'{_DECLARATION}<hh:head {_NAMESPACES} version="1.4" secCnt="{len(sections)}"/>',
        **{f"Contents/section{i}.xml": xml for i, xml in enumerate(sections)},
        "META-INF/container.xml": f'{_DECLARATION}<ocf:container xmlns:ocf="urn:oasis:names:tc:opendocument:xmlns:container"><ocf:rootfiles><ocf:rootfile full-path="Contents/content.hpf" media-type="application/hwpml-package+xml"/></ocf:rootfiles></ocf:container>',
        "Contents/content.hpf": f'{_DECLARATION}<opf:package xmlns:opf="http://www.idpf.org/2007/opf/"><opf:manifest><opf:item id="header" href="Contents/header.xml" media-type="application/xml"/>{items}</opf:manifest><opf:spine><opf:itemref idref="header" linear="yes"/>{spine}</opf:spine></opf:package>',
        "Preview/PrvText.txt": "미리보기 글은 색인하지 않습니다",
    }
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as package:
        package.writestr("mimetype", "application/hwp+zip", zipfile.ZIP_STORED)
        for name, content in parts.items():
            package.writestr(name, content.encode("utf-8"))
    return out.getvalue()


def test_paragraphs_tables_headers_footers_and_footnotes_in_order() -> None:
    got = extract(make_hwpx(), "보고서.hwpx")
    assert got.format is DocumentFormat.HWPX
    assert got.text == (
        "대한민국의 수도는 서울입니다.\n\n"
        "머리말 테스트\n\n"
        "꼬리말 쪽\n\n"
        "한글은\t세종대왕이\n만들었습니다. 이어지는 문장.\n\n"
        "각주 내용입니다.\n\n"
        "이름 | 점수\n"
        "김철수 | 90\n\n"
        "둘째 구역."
    )


def test_the_korean_text_is_byte_exact() -> None:
    text = extract(make_hwpx(), "a.hwpx").text
    for sentence in ("대한민국의 수도는 서울입니다.", "각주 내용입니다.", "김철수 | 90"):
        assert sentence.encode("utf-8") in text.encode("utf-8")
    assert "www.example.com" not in text, "a field's parameters are not text"
    assert "미리보기" not in text, "the preview is not the document"


def test_detected_by_content_and_sections_read_in_number_order() -> None:
    data = make_hwpx(
        tuple(
            f"{_DECLARATION}<hs:sec {_NAMESPACES}>{_p(f'<hp:t>구역 {i}</hp:t>')}</hs:sec>"
            for i in range(12)
        )
    )
    assert detect_format(data, "upload.bin") is DocumentFormat.HWPX
    assert extract(data, "a.hwpx").text == "\n\n".join(f"구역 {i}" for i in range(12))


def test_a_package_without_sections_is_corrupt() -> None:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as package:
        package.writestr("mimetype", "application/hwp+zip")
        package.writestr("Contents/header.xml", "<head/>")
    assert invalid(out.getvalue(), "a.hwpx") == "corrupt HWPX: no section"


def test_a_section_that_is_not_xml_is_corrupt() -> None:
    data = make_hwpx((f"{_DECLARATION}<hs:sec {_NAMESPACES}><hp:p>",))
    assert invalid(data, "a.hwpx") == "corrupt HWPX (XMLSyntaxError)"
