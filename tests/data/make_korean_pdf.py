"""Regenerate ``korean.pdf``, the committed Korean PDF fixture.

fpdf2 can only write Hangul with a TrueType font that has the glyphs, and no such font is on
a fresh CI machine, so the PDF (which embeds a subset of the font, as PDFs do) is committed.
Made with NanumGothic (SIL Open Font License) from Debian's ``fonts-nanum``:

    apt-get install fonts-nanum
    .venv/bin/python tests/data/make_korean_pdf.py
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from fpdf import FPDF

FONT = Path("/usr/share/fonts/truetype/nanum/NanumGothic.ttf")
OUT = Path(__file__).with_name("korean.pdf")

PAGE_1 = (
    "대한민국의 수도는 서울입니다. 한글은 세종대왕이 만들었습니다.\n\n"
    "둘째 문단: 검색 색인 시험용 문서입니다! 정말 그런가요?"
)
PAGE_2 = "셋째 쪽입니다. Mixed 한국어 and English text."


def main() -> None:
    pdf = FPDF()
    # A fixed timestamp: the file is byte-identical on every run.
    pdf.set_creation_date(datetime(2025, 1, 1, tzinfo=UTC))
    pdf.add_font("Nanum", fname=str(FONT))
    pdf.set_font("Nanum", size=12)
    for text in (PAGE_1, PAGE_2):
        pdf.add_page()
        pdf.multi_cell(0, 8, text)
    OUT.write_bytes(bytes(pdf.output()))


if __name__ == "__main__":
    main()
