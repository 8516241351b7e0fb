"""PPTX files written by python-pptx (tests/pipeline/format_samples.py): the text, its structure
(headings, rows as lines) and its order, Korean byte-exact. The hostile variants are in
test_formats_packages.py."""

from __future__ import annotations

import io
import re
import zipfile

from tests.pipeline import format_samples as samples
from tests.pipeline.test_formats import extract
from trioindex.pipeline.formats import DocumentFormat, detect_format


def test_pptx_titles_text_frames_tables_and_notes_slide_by_slide() -> None:
    got = extract(samples.make_pptx(), "deck.pptx")
    assert got.format is DocumentFormat.PPTX
    assert got.text == (
        f"# {samples.KOREAN_TITLE}\n\n"
        f"{samples.KOREAN_LINE}\n\n"
        "Second bullet\n\n"
        "지역 | 매출\n서울 | 120\n\n"
        "발표자 노트: 천천히.\n\n"
        "# Slide 2\n\n"
        "A text box without a title"
    )


def test_pptx_slides_follow_the_presentation_order_not_the_part_names() -> None:
    data = samples.make_pptx()

    # swap the two slides in the presentation's list: the text follows the list
    def swap(xml: bytes) -> bytes:
        first, second = re.findall(rb'<p:sldId [^>]*(r:id="rId\d+")', xml)
        return xml.replace(first, b"TMP").replace(second, first).replace(b"TMP", second)

    text = extract(samples.rezip(data, replace={"ppt/presentation.xml": swap}), "a.pptx").text
    assert text.startswith("# Slide 1\n\nA text box without a title\n\n# 분기")


def test_detected_from_content_whatever_the_name() -> None:
    data = samples.make_pptx()
    assert detect_format(data, "upload.bin") is DocumentFormat.PPTX
    assert detect_format(data, "notes.docx") is DocumentFormat.PPTX  # content first
    assert zipfile.is_zipfile(io.BytesIO(data))
