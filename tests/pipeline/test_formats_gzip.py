"""gzip-compressed documents: read as the document inside, inflation bounded.

The files are made with the standard library's gzip writer, the one Debian's ``gzip`` matches
(the same deflate stream and header), so they are real gzip files.
"""

from __future__ import annotations

import gzip
import io
import tarfile

import pytest

from testkit.documents import make_docx, make_pdf
from tests.pipeline.test_formats import KOREAN, extract, invalid, refusal_cost
from trioindex.pipeline.formats import DocumentFormat, detect_format

MiB = 1024 * 1024


def gz(data: bytes, *, fname: str | None = None) -> bytes:
    out = io.BytesIO()
    with gzip.GzipFile(filename=fname or "", mode="wb", fileobj=out, mtime=0) as writer:
        writer.write(data)
    return out.getvalue()


def test_gzipped_text_is_read_byte_exact() -> None:
    got = extract(gz(KOREAN.encode("utf-8")), "notes.txt.gz")
    assert got.text == KOREAN and got.format is DocumentFormat.TEXT


@pytest.mark.parametrize(
    ("inner", "name", "fmt", "expected"),
    [
        (b"# Title\n\nBody text.", "README.md.gz", DocumentFormat.MARKDOWN, "# Title\n\nBody text."),
        (b"<html><body><p>Visible</p><script>x</script></body></html>", "page.html.gz",
         DocumentFormat.HTML, "Visible"),
        (make_pdf("Text on a page."), "manual.pdf.gz", DocumentFormat.PDF, "Text on a page."),
        (make_docx("Word paragraph."), "letter.docx.gz", DocumentFormat.DOCX, "Word paragraph."),
        (b"pkg (1.0-1) unstable; urgency=medium", "changelog.Debian.gz", DocumentFormat.TEXT,
         "pkg (1.0-1) unstable; urgency=medium"),
    ],
)  # fmt: skip
def test_the_inner_name_and_content_decide_the_format(
    inner: bytes, name: str, fmt: DocumentFormat, expected: str
) -> None:
    data = gz(inner)
    assert detect_format(data, name) is DocumentFormat.GZIP
    got = extract(data, name)
    assert got.format is fmt and got.text == expected


def test_the_name_in_the_gzip_header_is_used_when_the_upload_name_has_no_suffix() -> None:
    got = extract(gz(b"# Heading\n\ntext", fname="notes.md"), "upload")
    assert got.format is DocumentFormat.MARKDOWN


def test_a_gzip_content_type_is_not_passed_to_the_document_inside() -> None:
    latin = "café crème".encode("cp1252")
    # the declared charset of an HTML content type still applies to the inflated page
    html = extract(gz(b"<p>" + latin + b"</p>"), "a.html.gz", "text/html; charset=windows-1252")
    assert html.text == "café crème"
    assert extract(gz(b"plain words"), "a.gz", "application/gzip").text == "plain words"


def test_concatenated_members_are_read_as_one_document() -> None:
    assert extract(gz(b"first half, ") + gz(b"second half"), "log.gz").text == (
        "first half, second half"
    )


def test_a_gzip_bomb_is_refused_by_its_ratio_after_inflating_no_more_than_the_cap() -> None:
    data = gz(b"\x00" * (256 * MiB))  # 256 MiB of zeros in ~250 KiB
    assert len(data) < 300 * 1024
    message, elapsed, peak = refusal_cost(data, "bomb.txt.gz", max_bytes=512 * MiB)
    cap = 100 * len(data)  # GZIP_EXPANSION_RATIO x the file
    assert message.startswith("gzip expands to more than ")
    assert message.endswith(" file; decompression bomb or oversized)")
    # the output grows by an eighth at a time, so a little over the cap; never 256 MiB
    assert peak < cap * 5 // 4 + 2 * MiB, "stopped at the cap, not after inflating everything"
    assert elapsed < 2.0


def test_inflating_past_the_maximum_document_size_is_refused_naming_it() -> None:
    text = " ".join(f"word{i}" for i in range(400_000)).encode()  # ~4.5 MB, compresses ~4x
    message = invalid(gz(text), "big.txt.gz", max_bytes=3 * MiB)
    assert message == (
        "gzip expands to more than 3 MiB "
        "(indexing.parsing.max-document-size, the limit uncompressed too)"
    )


def test_small_files_may_inflate_far_beyond_the_ratio_up_to_the_floor() -> None:
    # 900 KiB of one repeated line: ~1000x, under the 1 MiB floor, so it is read
    assert len(extract(gz(b"same line\n" * 92_000), "repeated.log.gz").text) == 920_000


def test_truncated_and_corrupt_gzip_files_are_corrupt() -> None:
    data = gz(KOREAN.encode() * 200)
    assert invalid(data[: len(data) // 2], "cut.txt.gz") == "corrupt gzip: the stream is cut short"
    assert invalid(data[:-4], "cut.txt.gz") == "corrupt gzip: the stream is cut short"
    damaged = bytearray(data)
    damaged[-8] ^= 0xFF  # the CRC in the trailer
    assert invalid(bytes(damaged), "crc.txt.gz") == "corrupt gzip (zlib.error)"
    assert invalid(b"\x1f\x8b\x08", "header.gz") == "corrupt gzip: the stream is cut short"


def test_what_gzip_may_not_hold() -> None:
    assert invalid(gz(gz(b"twice")), "a.txt.gz.gz") == "unsupported format: gzip inside gzip"
    assert invalid(gz(b""), "empty.gz") == "empty file: the gzip file holds no bytes"
    assert invalid(gz(b"GIF89a" + b"\x00" * 40), "a.gif.gz") == "unsupported format: GIF image"
    tar = io.BytesIO()
    with tarfile.open(fileobj=tar, mode="w") as archive:
        archive.addfile(tarfile.TarInfo("notes.txt"), io.BytesIO(b""))
    assert invalid(gz(tar.getvalue()), "logs.tar.gz") == "unsupported format: tar archive"
    assert invalid(b"\x1f\x8b\x00" + b"\x00" * 20, "odd.gz") == (
        "unsupported format: gzip archive of an unknown method"
    )


def test_the_messages_never_quote_the_content() -> None:
    secret = b"TOPSECRET-CONTENT " * 50
    data = gz(secret)
    for cut in (data[:40], data[:-6]):
        assert "TOPSECRET" not in invalid(cut, "s.txt.gz")
