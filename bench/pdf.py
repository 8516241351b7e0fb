"""PDF text engines side by side: pypdf (what :mod:`trioindex.pipeline.formats.pdf` uses) and
PDFium (pypdfium2, which trioindex already uses to render scans for OCR), on real text-layer
PDFs: CPU ms per page and how far their texts agree (docs/test-results/formats.md).

    .venv/bin/python -m bench.pdf FOLDER_OR_FILE...

Each PDF is read whole by each engine in this process (imports done first), every page's text
taken (pypdf: ``page.extract_text()``, through trioindex's own :func:`pdf_text` with its content
budget; PDFium: ``get_textpage().get_text_range()``, its line-end hyphen mark U+FFFE made a
hyphen and a line break). The texts are compared normalised (trioindex's normalisation, NFKC,
every whitespace run removed, so line breaks and spacing do not count): ``same`` when equal,
else the share of words (split on whitespace after NFKC) the two have in common, over the larger
word count. A file either engine refuses is listed with its reason.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import re
import time
import unicodedata
from collections.abc import Callable
from pathlib import Path

_SPACE = re.compile(r"\s+")


def _pypdf(data: bytes) -> tuple[str, int]:
    from trioindex.pipeline.formats.pdf import pdf_text

    return pdf_text(data, 200 * len(data) + 10_000_000)


def _pdfium(data: bytes) -> tuple[str, int]:
    import pypdfium2

    document = pypdfium2.PdfDocument(data)
    try:
        pages = []
        for index in range(len(document)):
            page = document[index]
            textpage = page.get_textpage()
            pages.append(textpage.get_text_range())
            textpage.close()
            page.close()
        # PDFium marks a hyphen at a line end as U+FFFE: the hyphen and the line break pypdf gives
        text = "\n\n".join(p for p in pages if p.strip()).replace("\ufffe", "-\n")
        return text, len(document)
    finally:
        document.close()


def _words(text: str) -> collections.Counter[str]:
    return collections.Counter(unicodedata.normalize("NFKC", text).split())


def agreement(a: str, b: str) -> float:
    """1.0 when the texts are equal without whitespace, else the share of words in common;
    both as trioindex normalises extracted text first."""
    from trioindex.pipeline.formats.text import normalise

    a, b = normalise(a), normalise(b)
    fold = [_SPACE.sub("", unicodedata.normalize("NFKC", t)) for t in (a, b)]
    if fold[0] == fold[1]:
        return 1.0
    wa, wb = _words(a), _words(b)
    total = max(sum(wa.values()), sum(wb.values()))
    return sum((wa & wb).values()) / total if total else 1.0


def _read(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if path.suffix == ".gz" else data


def _timed(
    engine: Callable[[bytes], tuple[str, int]], data: bytes
) -> tuple[str | None, int, float, str]:
    started = time.process_time()
    try:
        text, pages = engine(data)
        return text, pages, time.process_time() - started, ""
    except Exception as exc:
        return None, 0, time.process_time() - started, f"{type(exc).__name__}: {exc}"[:70]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path)
    args = parser.parse_args(argv)
    files = sorted(
        f
        for p in args.paths
        for f in (p.rglob("*") if p.is_dir() else [p])
        if f.is_file() and f.name.endswith((".pdf", ".pdf.gz")) and f.stat().st_size
    )
    _pypdf(_tiny()), _pdfium(_tiny())  # imports and first-use costs, untimed
    print(f"{'file':<48} {'pages':>5} {'pypdf ms/p':>10} {'pdfium ms/p':>11} {'agree':>6}")
    totals = [0, 0.0, 0.0]
    agreements = []
    for path in files:
        data = _read(path)
        a_text, pages, a_cpu, a_err = _timed(_pypdf, data)
        b_text, b_pages, b_cpu, b_err = _timed(_pdfium, data)
        if a_text is None or b_text is None:
            print(f"{path.name[:48]:<48} refused: pypdf {a_err or 'ok'}; pdfium {b_err or 'ok'}")
            continue
        agree = agreement(a_text, b_text)
        agreements.append(agree)
        totals[0] += pages
        totals[1] += a_cpu
        totals[2] += b_cpu
        print(
            f"{path.name[:48]:<48} {pages:>5} {1000 * a_cpu / pages:>10.1f} "
            f"{1000 * b_cpu / b_pages:>11.1f} {agree:>6.1%}",
            flush=True,
        )
    pages = int(totals[0])
    if pages:
        same = sum(a == 1.0 for a in agreements)
        print(
            f"\n{len(agreements)} PDFs, {pages} pages: pypdf {1000 * totals[1] / pages:.1f} ms/page, "
            f"PDFium {1000 * totals[2] / pages:.1f} ms/page ({totals[1] / totals[2]:.1f}x); "
            f"text equal (whitespace aside) in {same}, median word agreement "
            f"{sorted(agreements)[len(agreements) // 2]:.1%}"
        )


def _tiny() -> bytes:
    from testkit.documents import make_pdf

    return make_pdf("warm up")


if __name__ == "__main__":
    main()
