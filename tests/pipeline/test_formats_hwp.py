"""HWP 5.0 documents (OLE2 compound files): paragraph text records, controls skipped by their
extent, Korean byte-exact, protected documents refused, bombs bounded.

No program on a CI machine writes HWP, so the samples are *generated*: :func:`make_cfb` writes
a compound file (CFB version 3: 512-byte sectors, a mini stream for streams under 4 KiB) and
:func:`make_hwp` lays out the streams of an HWP 5.0 document in it (``FileHeader``,
``DocInfo``, ``BodyText/SectionN`` as raw-deflate record streams, ``PrvText``), records and
control characters as the HWP 5.0 format specification (revision 1.3) gives them. The reader
was also checked on 36 real files saved by Hangul (docs/test-results/formats.md), which are not
committed.
"""

from __future__ import annotations

import itertools
import struct
import zlib

import pytest

from tests.pipeline.test_formats import extract, invalid, refusal_cost
from trioindex.pipeline.formats import DocumentFormat, detect_format

MiB = 1024 * 1024
_SECTOR = 512
_MINI = 64
_CUTOFF = 4096
_FREE, _END, _FAT_SECTOR, _NONE = 0xFFFFFFFF, 0xFFFFFFFE, 0xFFFFFFFD, 0xFFFFFFFF


def _chain(fat: list[int], first: int, count: int) -> None:
    for i in range(count):
        fat[first + i] = first + i + 1 if i + 1 < count else _END


def make_cfb(streams: dict[str, bytes]) -> bytes:
    """A compound file holding ``streams`` ("Storage/Stream" paths, one level of storages)."""
    # directory entries: root, then each storage and its streams
    storages = sorted({path.split("/")[0] for path in streams if "/" in path})
    entries: list[dict[str, object]] = [{"name": "Root Entry", "type": 5, "kids": []}]
    index = {}
    for storage in storages:
        index[storage] = len(entries)
        entries.append({"name": storage, "type": 1, "kids": []})
    for path, data in streams.items():
        parent = index[path.split("/")[0]] if "/" in path else 0
        entries[parent]["kids"].append(len(entries))  # type: ignore[attr-defined]
        entries.append({"name": path.split("/")[-1], "type": 2, "data": data, "kids": []})
    for storage in storages:
        entries[0]["kids"].append(index[storage])  # type: ignore[attr-defined]

    # small streams into the mini stream, large ones into sectors of their own
    mini = bytearray()
    mini_fat: list[int] = []
    for entry in entries:
        data = entry.get("data")
        if isinstance(data, bytes) and len(data) < _CUTOFF:
            entry["start"] = len(mini) // _MINI if data else _END
            count = -(-len(data) // _MINI)
            base = len(mini_fat)
            mini_fat.extend(base + i + 1 if i + 1 < count else _END for i in range(count))
            mini += data.ljust(count * _MINI, b"\x00")
    large = [e for e in entries if isinstance(e.get("data"), bytes) and len(e["data"]) >= _CUTOFF]  # type: ignore[arg-type]
    sizes = {
        "dir": -(-len(entries) * 128 // _SECTOR),
        "minifat": -(-len(mini_fat) * 4 // _SECTOR),
        "ministream": -(-len(mini) // _SECTOR),
    }
    big = [-(-len(e["data"]) // _SECTOR) for e in large]  # type: ignore[arg-type]
    other = sum(sizes.values()) + sum(big)
    fat_sectors = 1
    while fat_sectors * 128 < other + fat_sectors:
        fat_sectors += 1
    fat = [_FREE] * (fat_sectors * 128)
    for i in range(fat_sectors):
        fat[i] = _FAT_SECTOR
    at = fat_sectors
    starts = {}
    for key, count in sizes.items():
        starts[key] = at if count else _END
        _chain(fat, at, count)
        at += count
    body = bytearray()
    for entry, count in zip(large, big, strict=True):
        entry["start"] = at
        _chain(fat, at, count)
        at += count
        body += entry["data"].ljust(count * _SECTOR, b"\x00")  # type: ignore[attr-defined]
    entries[0]["start"] = starts["ministream"]
    entries[0]["size"] = len(mini)

    directory = bytearray()
    for entry in entries:
        kids: list[int] = entry["kids"]  # type: ignore[assignment]
        name = str(entry["name"]).encode("utf-16-le") + b"\x00\x00"
        data = entry.get("data")
        size = len(data) if isinstance(data, bytes) else int(entry.get("size", 0))  # type: ignore[call-overload]
        directory += struct.pack(
            "<64sHBBIII16sIQQIQ",
            name, len(name), int(entry["type"]), 1,  # type: ignore[call-overload]
            _NONE, _NONE, kids[0] if kids else _NONE,
            b"", 0, 0, 0, int(entry.get("start", _END)), size,  # type: ignore[call-overload]
        )  # fmt: skip
    # siblings: each child's right sibling is the next child (a valid, if unbalanced, tree)
    for entry in entries:
        kids = entry["kids"]  # type: ignore[assignment]
        for left, right in itertools.pairwise(kids):
            struct.pack_into("<I", directory, left * 128 + 72, right)
    directory = directory.ljust(sizes["dir"] * _SECTOR, b"\xff")
    for i in range(len(entries), sizes["dir"] * 4):  # unused entries: empty, no siblings
        directory[i * 128 : (i + 1) * 128] = (
            b"\x00" * 64 + b"\x00" * 4 + b"\xff" * 12 + b"\x00" * 48
        )
    difat = [*range(fat_sectors), *[_FREE] * (109 - fat_sectors)]
    header = struct.pack(
        "<8s16sHHHHH6sIIIIIIIII109I",
        b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", b"", 0x3E, 3, 0xFFFE, 9, 6, b"",
        0, fat_sectors, starts["dir"], 0, _CUTOFF,
        starts["minifat"], sizes["minifat"], _END, 0, *difat,
    )  # fmt: skip
    return b"".join(
        [
            header,
            struct.pack(f"<{len(fat)}I", *fat),
            bytes(directory),
            struct.pack(f"<{len(mini_fat)}I", *mini_fat).ljust(sizes["minifat"] * _SECTOR, b"\xff"),
            bytes(mini).ljust(sizes["ministream"] * _SECTOR, b"\x00"),
            bytes(body),
        ]
    )


# -- HWP 5.0 records ------------------------------------------------------------------------------

PARA_HEADER, PARA_TEXT, CTRL_HEADER, LIST_HEADER, TABLE = 66, 67, 71, 72, 77


def record(tag: int, level: int, payload: bytes) -> bytes:
    size = len(payload)
    if size >= 0xFFF:
        return struct.pack("<II", tag | level << 10 | 0xFFF << 20, size) + payload
    return struct.pack("<I", tag | level << 10 | size << 20) + payload


def units(text: str) -> bytes:
    return text.encode("utf-16-le")


def control(code: int, ctrl_id: bytes = b"    ") -> bytes:
    """An eight-unit control: its code, four bytes of id, eight of parameters, its code."""
    return struct.pack("<H", code) + ctrl_id[::-1] + b"\x00" * 8 + struct.pack("<H", code)


def paragraph(text: bytes, level: int = 0) -> bytes:
    return record(PARA_HEADER, level, b"\x00" * 22) + record(PARA_TEXT, level, text + units("\r"))


SECTION0 = b"".join(
    [
        # a section definition and a column control (extended controls) before the text
        paragraph(control(2, b"secd") + control(2, b"cold") + units("대한민국의 수도는 서울입니다.")),
        # a tab (inline control), a line break, a hyphen and a fixed-width space
        paragraph(
            units("한글은") + control(9) + units("세종대왕이") + units("\n") + units("만들었습니다")
            + b"\x18\x00" + units("가나") + b"\x1f\x00" + units("끝.")
        ),
        # a footnote anchored in the paragraph: its own paragraph follows, one level down
        paragraph(units("본문") + control(17, b"fn  ") + units(" 이어서.")),
        record(CTRL_HEADER, 1, b"fn  "[::-1]),
        record(LIST_HEADER, 1, b"\x00" * 8),
        paragraph(units("각주 내용입니다."), level=2),
        # a table: its cells' paragraphs follow
        paragraph(control(11, b"tbl ")),
        record(CTRL_HEADER, 1, b"tbl "[::-1]),
        record(TABLE, 1, b"\x00" * 20),
        record(LIST_HEADER, 1, b"\x00" * 8),
        paragraph(units("이름"), level=2),
        record(LIST_HEADER, 1, b"\x00" * 8),
        paragraph(units("점수"), level=2),
        # a record other than text, with a long size (0xFFF escape)
        record(80, 0, b"\x00" * 5000),
    ]
)  # fmt: skip
SECTION1 = paragraph(units("둘째 구역: 𝄞 emoji 😀 and English."))


def file_header(properties: int = 1) -> bytes:
    signature = b"HWP Document File".ljust(32, b"\x00")
    return (signature + struct.pack("<II", 0x05000300, properties)).ljust(256, b"\x00")


def deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, -15)
    return packer.compress(data) + packer.flush()


def make_hwp(sections: tuple[bytes, ...] = (SECTION0, SECTION1), *, properties: int = 1) -> bytes:
    """A generated HWP 5.0 document (module docstring); ``properties`` bit 0: compressed."""
    pack = deflate if properties & 1 else (lambda data: data)
    streams = {
        "FileHeader": file_header(properties),
        "DocInfo": pack(record(16, 0, b"\x00" * 26)),
        **{f"BodyText/Section{i}": pack(data) for i, data in enumerate(sections)},
        "PrvText": units("미리보기"),
    }
    return make_cfb(streams)


EXPECTED = (
    "대한민국의 수도는 서울입니다.\n\n"
    "한글은\t세종대왕이\n만들었습니다-가나 끝.\n\n"
    "본문 이어서.\n\n"
    "각주 내용입니다.\n\n"
    "이름\n\n"
    "점수\n\n"
    "둘째 구역: 𝄞 emoji 😀 and English."
)


def test_paragraphs_of_every_section_with_controls_skipped_by_their_extent() -> None:
    got = extract(make_hwp(), "보고서.hwp")
    assert got.format is DocumentFormat.HWP
    assert got.text == EXPECTED


def test_korean_and_astral_characters_are_byte_exact() -> None:
    text = extract(make_hwp(), "a.hwp").text
    assert text.encode("utf-8") == EXPECTED.encode("utf-8")
    assert "미리보기" not in text, "the preview is not the document"


def test_uncompressed_sections_and_detection_by_content() -> None:
    data = make_hwp(properties=0)
    assert detect_format(data, "upload.bin") is DocumentFormat.HWP
    assert extract(data, "a.hwp").text == EXPECTED


@pytest.mark.parametrize(
    ("properties", "message"),
    [
        (1 | 2, "HWP is password-protected"),
        (1 | 4, "HWP is a distribution document (its text is encrypted)"),
        (1 | 16, "HWP is DRM-protected"),
    ],
)
def test_protected_documents_are_refused_with_the_reason(properties: int, message: str) -> None:
    assert invalid(make_hwp(properties=properties), "secret.hwp") == message


def test_other_ole2_files_encrypted_office_and_hwp_3_are_refused() -> None:
    doc = make_cfb({"WordDocument": b"\x00" * 600, "1Table": b"\x00" * 100})
    assert invalid(doc, "letter.doc") == "unsupported format: legacy Office (OLE2, e.g. .doc/.xls)"
    encrypted = make_cfb({"EncryptionInfo": b"\x04\x00" * 100, "EncryptedPackage": b"\x00" * 5000})
    assert invalid(encrypted, "salary.xlsx") == (
        "Office document is password-protected (encrypted DOCX/XLSX/PPTX)"
    )
    hwp3 = b"HWP Document File V3.00 \x1a\x01\x02\x03\x04\x05" + b"\x00" * 100
    assert invalid(hwp3, "old.hwp") == (
        "unsupported format: HWP 3.0 document (only HWP 5.0 and HWPX are read)"
    )


def test_a_section_bomb_is_refused_by_the_cap_after_inflating_no_more() -> None:
    data = make_hwp((record(PARA_TEXT, 0, b"\x00" * (64 * MiB)),))  # deflated by make_hwp
    assert len(data) < 256 * 1024
    message, elapsed, peak = refusal_cost(data, "bomb.hwp", max_bytes=64 * MiB)
    assert message.startswith("HWP body text expands to more than ")
    assert message.endswith("file); decompression bomb or oversized")
    cap = max(8 * MiB, 200 * len(data))  # the ZIP packages' cap, for all sections together
    assert peak < cap + 4 * MiB, "stopped at the cap, not after inflating everything"
    assert elapsed < 2.0


def test_truncated_and_damaged_files_are_corrupt() -> None:
    data = make_hwp()
    for cut in (data[: len(data) // 2], data[:700]):
        assert invalid(cut, "cut.hwp").startswith(("corrupt HWP", "unsupported format"))
    # a record whose size runs past its section
    assert invalid(make_hwp((record(PARA_TEXT, 0, units("x"))[:-1],)), "a.hwp") == (
        "corrupt HWP: a record runs past the end of its section"
    )
    # a compressed section cut short
    cut_section = deflate(SECTION0)[:-20]
    assert invalid(make_cfb({
        "FileHeader": file_header(1), "BodyText/Section0": cut_section,
    }), "a.hwp") == "corrupt HWP: a compressed section is cut short"  # fmt: skip
    # no body text at all
    assert invalid(make_cfb({"FileHeader": file_header(1)}), "a.hwp") == (
        "corrupt HWP: no body text section"
    )


def test_the_messages_never_quote_the_content() -> None:
    secret = paragraph(units("TOPSECRET-CONTENT"))
    data = make_hwp((secret[:-3],))
    assert "TOPSECRET" not in invalid(data, "a.hwp")
