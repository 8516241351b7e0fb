"""Hostile documents, built byte by byte in the tests: each costs far more to parse than its size.

The shapes reproduce issue 11 §4: a small PDF whose pages share one heavy content stream, a PDF
whose page tree fans out to millions of pages, a DOCX whose XML inflates hundreds of times, a
PDF that is simply slow (within every limit) for the timeout, and text without any boundary
the splitter could use.
"""

from __future__ import annotations

import base64
import io
import random
import zipfile
import zlib

# A content-stream operation that draws nothing: costs pypdf work, adds no text.
EMPTY_SHOW = b"BT /F1 12 Tf () Tj ET\n"
_FONT = b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"


def _pdf(objects: list[bytes]) -> bytes:
    """A PDF with ``objects`` numbered 1.. (1 is the catalog) and a correct xref table."""
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n" % number + body + b"\nendobj\n")
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    for offset in offsets:
        out.write(b"%010d 00000 n \n" % offset)
    out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\n" % (len(objects) + 1))
    out.write(b"startxref\n%d\n%%%%EOF\n" % xref)
    return out.getvalue()


def _stream(content: bytes) -> bytes:
    packed = zlib.compress(content)
    return (
        b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(packed) + packed + b"\nendstream"
    )


def pdf_with_pages(contents: list[bytes], *, shared: bool = False) -> bytes:
    """One page per content stream; ``shared``: every page draws ``contents[0]``."""
    pages = len(contents)
    streams = contents[:1] if shared else contents
    first_stream = 4 + pages
    kids = " ".join(f"{4 + i} 0 R" for i in range(pages))
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        f"<< /Type /Pages /Kids [{kids}] /Count {pages} >>".encode(),
        _FONT,
    ]
    for i in range(pages):
        stream = first_stream if shared else first_stream + i
        objects.append(
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
            b"/Resources << /Font << /F1 3 0 R >> >> /Contents %d 0 R >>" % stream
        )
    objects.extend(_stream(content) for content in streams)
    return _pdf(objects)


def pdf_sharing_one_heavy_stream(pages: int = 6, content_bytes: int = 3_600_000) -> bytes:
    """Issue 11: a few KiB of PDF whose pages all interpret one multi-MiB content stream."""
    content = EMPTY_SHOW * (content_bytes // len(EMPTY_SHOW))
    return pdf_with_pages([content] * pages, shared=True)


def slow_pdf(pages: int = 8, content_bytes: int = 1_000_000, seed: int = 1) -> bytes:
    """A PDF inside every content limit (content ~8x its size) that still takes pypdf about
    a second per page: random operands keep the streams from compressing."""
    rng = random.Random(seed)
    contents = []
    for _ in range(pages):
        ops = []
        size = 0
        while size < content_bytes:
            op = b"BT /F1 12 Tf %d %d Td () Tj ET\n" % (rng.randrange(1000), rng.randrange(1000))
            ops.append(op)
            size += len(op)
        contents.append(b"".join(ops))
    return pdf_with_pages(contents)


def pdf_page_tree_bomb(levels: int = 6, fanout: int = 10) -> bytes:
    """A ~1 KiB PDF whose page tree reaches ``fanout ** levels`` pages by repeated references."""
    page = levels + 2
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>"]
    for level in range(levels):
        child = 3 + level if level < levels - 1 else page
        kids = " ".join([f"{child} 0 R"] * fanout)
        count = fanout ** (levels - level)
        objects.append(f"<< /Type /Pages /Kids [{kids}] /Count {count} >>".encode())
    objects.append(b"<< /Type /Page /MediaBox [0 0 612 792] /Contents << /Length 0 >> >>")
    return _pdf(objects)


def docx_bomb(template: bytes, xml_bytes: int) -> bytes:
    """``template`` (a real DOCX) with a ``word/document.xml`` of ``xml_bytes`` tiny paragraphs,
    streamed into the ZIP so the test never holds the inflated XML."""
    paragraph = b"<w:p><w:r><w:t>x</w:t></w:r></w:p>"
    block = paragraph * (65536 // len(paragraph))
    out = io.BytesIO()
    with (
        zipfile.ZipFile(io.BytesIO(template)) as source,
        zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as bomb,
    ):
        for info in source.infolist():
            if info.filename != "word/document.xml":
                bomb.writestr(info, source.read(info))
        with bomb.open("word/document.xml", "w") as xml:
            xml.write(
                b'<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
                b'<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/'
                b'main"><w:body>'
            )
            for _ in range(xml_bytes // len(block)):
                xml.write(block)
            xml.write(b"</w:body></w:document>")
    return out.getvalue()


# -- text without boundaries --------------------------------------------------------------------


def one_word(size: int) -> str:
    return "a" * size


def base64_blob(size: int, seed: int = 4) -> str:
    return base64.b64encode(random.Random(seed).randbytes(size * 3 // 4)).decode()[:size]


def words_on_one_line(size: int) -> str:
    return ("word " * (size // 5 + 1))[:size]


def unpunctuated_cjk(size: int, seed: int = 5) -> str:
    """Ideographs with no space or punctuation: every character is its own word."""
    rng = random.Random(seed)
    return "".join(chr(rng.randrange(0x4E00, 0x9FA5)) for _ in range(size))


def prose(size: int) -> str:
    """The linear baseline: sentences and paragraphs, as real documents have."""
    sentence = "Workers claim jobs with SKIP LOCKED and renew their lease. "
    paragraph = sentence * 6 + "\n\n"
    return (paragraph * (size // len(paragraph) + 1))[:size]
