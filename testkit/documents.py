"""Real documents of every supported format, made by the libraries that write them.

Shared by the process tests, the benchmarks and the chaos run (its corpus is in
testkit/chaos/corpus.py). Each document's text carries a distinctive marker word, so a test can
search for it and a log scan can look for chunk text.
"""

from __future__ import annotations

import io
from pathlib import Path

TOPICS = [
    ("trio", "Trio is a Python library for structured concurrency; nurseries own their tasks."),
    ("postgres", "PostgreSQL claims jobs with FOR UPDATE SKIP LOCKED so workers never block."),
    ("vectors", "Cosine distance over pgvector embeddings finds chunks that mean similar things."),
    ("lease", "A renewable lease lets another worker take a job when its owner dies."),
    ("korean", "한국어 문서도 문장 단위로 잘 나뉘어야 합니다. 검색이 잘 되는지 확인합니다."),
]


def paragraph(topic: str, sentence: str, n: int) -> str:
    return " ".join(f"{sentence} (marker-{topic}-{i})" for i in range(n))


def docx_bytes(title: str, paragraphs: list[str]) -> bytes:
    import docx

    document = docx.Document()
    document.add_heading(title, level=1)
    for text in paragraphs:
        document.add_paragraph(text)
    buffer = io.BytesIO()
    document.save(buffer)
    return buffer.getvalue()


def pdf_bytes(paragraphs: list[str]) -> bytes:
    from fpdf import FPDF

    pdf = FPDF()
    pdf.add_page()
    pdf.set_font("helvetica", size=11)
    for text in paragraphs:
        pdf.multi_cell(0, 6, text.encode("latin-1", "replace").decode("latin-1"))
        pdf.ln(2)
    return bytes(pdf.output())


FORMATS = ("txt", "md", "html", "docx", "pdf")


def document_bytes(kind: str, title: str, paragraphs: list[str], *, html_head: str = "") -> bytes:
    """One document of format ``kind`` (a :data:`FORMATS` entry) holding ``paragraphs``."""
    if kind == "txt":
        return "\n\n".join(paragraphs).encode("utf-8")
    if kind == "md":
        return ("# " + title + "\n\n" + "\n\n".join(paragraphs)).encode("utf-8")
    if kind == "html":
        return (
            "<html><head><meta charset='utf-8'>"
            + html_head
            + "</head><body>"
            + "".join(f"<p>{p}</p>" for p in paragraphs)
            + "</body></html>"
        ).encode("utf-8")
    if kind == "docx":
        return docx_bytes(title, paragraphs)
    return pdf_bytes(paragraphs)


# Style and script whose text must never reach a chunk.
_HIDDEN_HEAD = "<style>p{color:red}</style><script>var hidden = 'script-text';</script>"


def write_corpus(folder: Path, *, copies: int = 1, sentences: int = 6) -> list[Path]:
    """One document per (topic, format) — txt, md, html, docx, pdf — ``copies`` times over."""
    folder.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for copy in range(copies):
        for topic, sentence in TOPICS:
            body = [paragraph(topic, sentence, sentences) for _ in range(3)]
            for kind in FORMATS:
                if kind == "pdf" and topic == "korean":
                    continue  # the core PDF fonts cannot draw Hangul
                path = folder / f"{topic}-{copy}.{kind}"
                path.write_bytes(document_bytes(kind, topic, body, html_head=_HIDDEN_HEAD))
                written.append(path)
    return written


# -- small builders for parser tests (shared by tests/pipeline/test_formats.py and the property tests) --

# the checked-in parser test files
DATA = Path(__file__).resolve().parent.parent / "tests" / "data"


def make_pdf(*pages: str, compress: bool = True) -> bytes:
    from fpdf import FPDF

    pdf = FPDF()
    pdf.set_compression(compress)
    pdf.set_font("helvetica", size=12)
    for text in pages:
        pdf.add_page()
        pdf.multi_cell(0, 8, text)
    return bytes(pdf.output())


def make_image_pdf(pages: int = 2) -> bytes:
    """A 'scanned' PDF: every page is one picture, no text layer."""
    from fpdf import FPDF
    from PIL import Image

    image = io.BytesIO()
    Image.new("RGB", (300, 120), "white").save(image, "PNG")
    pdf = FPDF()
    for _ in range(pages):
        pdf.add_page()
        pdf.image(image, x=10, y=10, w=150)
    return bytes(pdf.output())


def make_docx(*paragraphs: str, table: list[list[str]] | None = None) -> bytes:
    import docx

    document = docx.Document()
    for text in paragraphs:
        document.add_paragraph(text)
    if table is not None:
        grid = document.add_table(rows=len(table), cols=len(table[0]))
        for r, row in enumerate(table):
            for c, value in enumerate(row):
                grid.cell(r, c).text = value
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()
