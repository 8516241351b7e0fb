"""Every signature and byte-order mark detection knows is found at the start of the bytes, and
text that starts with none of them is text: the checks a text skips by its first byte are
exactly the ones it cannot match."""

from __future__ import annotations

import re

import pytest

from trioindex.errors import ContentInvalid
from trioindex.pipeline.formats.detect import (
    _BINARY_SIGNATURES,
    _BOMS,
    _IMAGE_SIGNATURES,
    DocumentFormat,
    bom,
    detect_format,
)


@pytest.mark.parametrize(("mark", "encoding"), _BOMS)
def test_every_byte_order_mark_is_read(mark: bytes, encoding: str) -> None:
    found = bom(mark + "text".encode(encoding))
    # the UTF-32 LE mark begins with the UTF-16 LE one: the longer one is found first
    assert found == (encoding, len(mark))


def test_no_mark_on_text_or_empty_bytes() -> None:
    for data in (b"", b"A", b"Document 17.", b"\xfe", b"\xef\xbb"):
        assert bom(data) is None


@pytest.mark.parametrize(("signature", "kind"), _BINARY_SIGNATURES)
def test_every_binary_signature_is_refused_by_name(signature: bytes, kind: str) -> None:
    data = signature + b"\x00" * 64
    with pytest.raises(ContentInvalid, match=re.escape(f"unsupported format: {kind}")):
        detect_format(data, "upload.bin")


@pytest.mark.parametrize(("signature", "kind"), _IMAGE_SIGNATURES)
def test_every_image_signature_is_an_image(signature: bytes, kind: str) -> None:
    assert detect_format(signature + b"\x00" * 64, "scan.bin") is DocumentFormat.IMAGE


@pytest.mark.parametrize(
    ("data", "fmt"),
    [
        (b"{\\rtf1 Hello}", DocumentFormat.RTF),
        (b"\x1f\x8b\x08" + b"\x00" * 16, DocumentFormat.GZIP),
        (b"Document 17 of the fleet benchmark.\n", DocumentFormat.TEXT),
        (b"  %PDF-1.7\n", DocumentFormat.PDF),
        ("\ufeffTitle\n".encode(), DocumentFormat.TEXT),
    ],
)
def test_formats_known_by_their_first_bytes(data: bytes, fmt: DocumentFormat) -> None:
    assert detect_format(data, "upload") is fmt
