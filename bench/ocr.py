"""OCR quality and speed: character error rate (CER) per language, pages per second and CPU per
page, on pages rendered from known text and then "scanned" (docs/test-results/formats.md).

    .venv/bin/python -m bench.ocr [--pages 4] [--configs base,...] [--json out.json]

The known text is real prose nobody here wrote: the Korean and English Vim tutors
(``/usr/share/vim/*/tutor/tutor.ko.utf-8`` and ``tutor``), their prose lines in order. Each
page is drawn by Pillow at 300 dpi with a Korean font (Debian's ``fonts-nanum``; `just
bench-ocr` installs it when root), then scanned: rotated by a small angle, blurred slightly,
grey noise added, saved as an 8-bit grey PNG and as an image-only PDF of the same page. Both go
through trioindex's own path, :func:`trioindex.pipeline.formats.extract_text` with an
:class:`~trioindex.pipeline.formats.OcrPolicy` (the PDF is rendered by PDFium at the policy's
dpi), and the text read is compared with the text drawn.

CER is the edit distance between the two over the length of the text drawn, after whitespace
runs are folded to one space (and, in the ``no spaces`` column, with every space removed:
Tesseract's word spacing in Korean is its own guess). CPU per page counts this process and
Tesseract's (``RUSAGE_CHILDREN``); pages per second is wall time, one page at a time.
"""

from __future__ import annotations

import argparse
import glob
import io
import json
import random
import re
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

from trioindex.pipeline.formats import OcrPolicy, extract_text

DPI = 300  # the scan's resolution
PAGE = (2480, 3508)  # A4 at 300 dpi
MARGIN = 200
FONT_POINTS = 12
LINES_PER_PAGE = 30
MAX_BYTES = 50_000_000
FONT_PATHS = (
    "/usr/share/fonts/truetype/nanum/NanumGothic.ttf",
    "/usr/share/fonts/truetype/nanum/NanumMyeongjo.ttf",
    "/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc",
)
_MARKER = re.compile(r"^\[OCR page \d+: [^\]]*\]$", re.M)
_SPACES = re.compile(r"\s+")
_HANGUL = re.compile(r"[\uac00-\ud7a3]")

# what the bench compares: trioindex's defaults ("default") and the variants tried against them
CONFIGS: dict[str, dict[str, Any]] = {
    "default": {},
    "psm3": {"psm": 3},
    "psm4": {"psm": 4},
    "dpi150": {"dpi": 150},
    "dpi300": {"dpi": 300},
}


@attrs.frozen
class Page:
    language: str
    text: str  # the text drawn, lines joined by newlines
    png: bytes
    pdf: bytes


def _tutor(name: str) -> Path:
    found = sorted(glob.glob(f"/usr/share/vim/vim*/tutor/{name}"))
    if not found:
        sys.exit(f"no Vim tutor {name} under /usr/share/vim (apt-get install vim-runtime)")
    return Path(found[-1])


def prose_lines(path: Path, korean: bool) -> list[str]:
    """The tutor's prose lines, in order: no rules, no keyboard diagrams, no short fragments."""
    lines = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = _SPACES.sub(" ", raw).strip()
        if len(line) < 25 or len(line) > 70 or re.search(r"[=~^<>|*!]{2}|^\d+\.|^-", line):
            continue
        letters = sum(ch.isalpha() for ch in line)
        if letters < 0.6 * len(line) or (korean and not _HANGUL.search(line)):
            continue
        lines.append(line)
    return lines


def _font(points: int) -> Any:
    from PIL import ImageFont

    for path in FONT_PATHS:
        if Path(path).exists():
            return ImageFont.truetype(path, size=round(points * DPI / 72))
    sys.exit("no Korean font: apt-get install fonts-nanum (or run `just bench-ocr` as root)")


def scan(lines: list[str], rng: random.Random, points: int = FONT_POINTS) -> tuple[bytes, bytes]:
    """The lines drawn on an A4 page, then rotated, blurred and noised like a scan: PNG and PDF."""
    from PIL import Image, ImageDraw, ImageFilter

    page = Image.new("L", PAGE, 255)
    draw = ImageDraw.Draw(page)
    font = _font(points)
    step = round(points * DPI / 72 * 1.6)
    for row, line in enumerate(lines):
        draw.text((MARGIN, MARGIN + row * step), line, font=font, fill=0)
    angle = rng.uniform(0.6, 1.5) * rng.choice((-1, 1))
    page = page.rotate(angle, resample=Image.Resampling.BICUBIC, fillcolor=255)
    page = page.filter(ImageFilter.GaussianBlur(0.8))
    noise = Image.effect_noise(PAGE, 24)  # grey gaussian noise around 128
    page = Image.blend(page, noise, 0.18)
    png, pdf = io.BytesIO(), io.BytesIO()
    page.save(png, "PNG")
    page.save(pdf, "PDF", resolution=DPI)
    return png.getvalue(), pdf.getvalue()


def make_pages(count: int, seed: int = 7, points: int = FONT_POINTS) -> list[Page]:
    rng = random.Random(seed)
    pages = []
    for language, name, korean in (("Korean", "tutor.ko.utf-8", True), ("English", "tutor", False)):
        lines = prose_lines(_tutor(name), korean)
        for number in range(count):
            chosen = lines[number * LINES_PER_PAGE : (number + 1) * LINES_PER_PAGE]
            if not chosen:
                break
            png, pdf = scan(chosen, rng, points)
            pages.append(Page(language, "\n".join(chosen), png, pdf))
    return pages


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (insertions, deletions, substitutions), two rows at a time."""
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def cer(truth: str, read: str, *, spaces: bool = True) -> tuple[int, int]:
    """(errors, characters of the truth) after whitespace is folded (or removed)."""
    fold = " " if spaces else ""
    truth = _SPACES.sub(fold, truth).strip()
    read = _SPACES.sub(fold, _MARKER.sub("", read)).strip()
    return edit_distance(truth, read), len(truth)


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run(
    pages: list[Page], name: str, policy: OcrPolicy, kinds: tuple[str, ...]
) -> Iterator[dict[str, Any]]:
    for kind in kinds:
        by_language: dict[str, list[float]] = {}
        for page in pages:
            data, file = (page.png, "scan.png") if kind == "png" else (page.pdf, "scan.pdf")
            cpu, wall = _cpu(), time.perf_counter()
            try:
                read = extract_text(data, file, max_bytes=MAX_BYTES, ocr=policy)
                text, low = read.text, len(read.low_confidence_pages)
            except Exception as exc:  # a refusal is a page read as nothing
                text, low = "", 0
                print(f"  {name} {kind} {page.language}: {exc}", file=sys.stderr)
            cpu, wall = _cpu() - cpu, time.perf_counter() - wall
            errors, chars = cer(page.text, text)
            errors_ns, chars_ns = cer(page.text, text, spaces=False)
            row = by_language.setdefault(page.language, [0.0] * 8)
            for index, value in enumerate((errors, chars, errors_ns, chars_ns, cpu, wall, 1, low)):
                row[index] += value
        for language, (e, c, ens, cns, cpu, wall, n, low) in by_language.items():
            yield {
                "config": name,
                "input": kind,
                "language": language,
                "pages": int(n),
                "cer": e / c,
                "cer_no_spaces": ens / cns,
                "cpu_ms_per_page": 1000 * cpu / n,
                "pages_per_second": n / wall,
                "low_confidence_pages": int(low),
            }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=3, help="pages per language (3)")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="which, comma-separated")
    parser.add_argument("--inputs", default="png,pdf", help="png (images), pdf (scanned PDFs)")
    parser.add_argument("--points", type=int, default=FONT_POINTS, help="font size (12 pt)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    if shutil.which("tesseract") is None:
        sys.exit("no Tesseract: `just setup-ocr`")
    version = subprocess.run(
        ["tesseract", "--version"], capture_output=True, text=True, check=False
    ).stdout
    pages = make_pages(args.pages, points=args.points)
    print(f"{version.splitlines()[0]}; {len(pages)} pages, {args.points} pt at {DPI} dpi")
    print(f"{'config':<10} {'input':<5} {'language':<8} {'pages':>5} {'CER':>7} "
          f"{'no sp.':>7} {'CPU ms/p':>9} {'pages/s':>8} {'low':>4}")  # fmt: skip
    rows = []
    for name in args.configs.split(","):
        policy = OcrPolicy(**CONFIGS[name])
        kinds = tuple(
            k for k in args.inputs.split(",") if k == "pdf" or not CONFIGS[name].get("dpi")
        )
        for row in run(pages, name, policy, kinds):
            rows.append(row)
            print(f"{name:<10} {row['input']:<5} {row['language']:<8} {row['pages']:>5} "
                  f"{row['cer']:>7.2%} {row['cer_no_spaces']:>7.2%} "
                  f"{row['cpu_ms_per_page']:>9.0f} {row['pages_per_second']:>8.2f} "
                  f"{row['low_confidence_pages']:>4}", flush=True)  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
