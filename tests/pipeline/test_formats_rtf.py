"""RTF documents: body text, code pages (CP949 Hangul byte pairs), Unicode escapes, tables,
skipped destinations, and hostile nesting.

The samples are written in the tests, in the shape Word and WordPad save (font table with
``\\fcharset``, ``\\ansicpg``, ``\\uN`` with fallbacks, ``\\*`` destinations, ``\\trowd`` tables):
no RTF writer is on a CI machine. The reader was also compared with the expected text of 32
public RTF test files (docs/test-results/formats.md), which are not committed.
"""

from __future__ import annotations

import time

from tests.pipeline.test_formats import KOREAN, extract, invalid
from trioindex.pipeline.formats import DocumentFormat, detect_format


def cp949_escaped(text: str) -> bytes:
    return "".join(
        ch if ord(ch) < 128 else "".join(f"\\'{b:02x}" for b in ch.encode("cp949")) for ch in text
    ).encode("ascii")


def unicode_escaped(text: str) -> bytes:
    out = []
    for ch in text:
        if ord(ch) < 128:
            out.append(ch)
        else:
            for unit in range(0, len(ch.encode("utf-16-le")), 2):
                value = int.from_bytes(ch.encode("utf-16-le")[unit : unit + 2], "little")
                out.append(f"\\u{value - 65536 if value > 32767 else value}?")
    return "".join(out).encode("ascii")


WORDPAD_KOREAN = (
    rb"{\rtf1\ansi\ansicpg949\deff0\nouicompat{\fonttbl{\f0\fnil\fcharset129 \'b8\'bc\'c0\'ba "
    rb"\'b0\'ed\'b5\'f1;}{\f1\fnil\fcharset0 Calibri;}}" + b"\r\n"
    rb"{\colortbl ;\red255\green0\blue0;}{\*\generator Riched20 10.0.19041}"
    rb"{\info{\title Not the text}{\author Nobody}}\viewkind4\uc1" + b"\r\n"
    rb"\pard\sa200\sl276\slmult1\f0\fs22\lang1042 "
    + cp949_escaped(KOREAN.split("\n\n")[0]).replace(b"\n", b"\\par\r\n")
    + rb"\par" + b"\r\n"
    + cp949_escaped(KOREAN.split("\n\n")[1])
    + rb"\par" + b"\r\n"
    rb"\f1 English with a \b bold\b0  word,\tab a tab\line and a line break.\par" + b"\r\n"
    rb"{\pict\wmetafile8\picw100\pich100 0100090000035000000000002700000000000400}\par" + b"\r\n"
    rb"}" + b"\r\n"
)  # fmt: skip


def test_wordpad_korean_in_its_code_page_is_byte_exact() -> None:
    got = extract(WORDPAD_KOREAN, "memo.rtf")
    assert got.format is DocumentFormat.RTF
    assert got.text == (KOREAN + "\n\nEnglish with a bold word,\ta tab\nand a line break.")
    assert "Not the text" not in got.text and "맑은" not in got.text


def test_unicode_escapes_fallbacks_and_surrogate_pairs() -> None:
    body = unicode_escaped("유니코드 문장과 이모지 😀 끝.")
    data = rb"{\rtf1\ansi\uc1 " + body + rb"\par{\uc2\u54620\'c7\'d1 two-byte fallback}}"
    assert extract(data, "u.rtf").text == "유니코드 문장과 이모지 😀 끝.\n\n한 two-byte fallback"


def test_tables_as_rows_of_cells() -> None:
    data = (
        rb"{\rtf1\ansi\ansicpg949{\fonttbl{\f0\fcharset129 Gulim;}}\f0"
        rb"\trowd\cellx2000\cellx4000\pard\intbl " + cp949_escaped("이름") + rb"\cell "
        + cp949_escaped("점수") + rb"\cell\row"
        rb"\trowd\cellx2000\cellx4000\pard\intbl Kim\cell 90\par extra\cell\row"
        rb"\pard After the table.\par}"
    )  # fmt: skip
    assert extract(data, "t.rtf").text == "이름 | 점수\nKim | 90 extra\n\nAfter the table."


def test_fields_keep_their_result_and_ignorable_destinations_are_skipped() -> None:
    data = (
        rb"{\rtf1\ansi{\field{\*\fldinst{HYPERLINK \"https://example.com\"}}{\fldrslt{the link}}}"
        rb" and {\*\unknowndestination hidden} text {\footnote A footnote.} \{braces\}\par}"
    )
    assert extract(data, "f.rtf").text == "the link and  text A footnote. {braces}"


def test_detected_by_content() -> None:
    assert detect_format(WORDPAD_KOREAN, "upload.txt") is DocumentFormat.RTF


def test_groups_nested_too_deep_are_refused_naming_the_limit() -> None:
    data = b"{\\rtf1 " + b"{" * 100_000 + b"x" + b"}" * 100_000 + b"}"
    started = time.perf_counter()
    assert invalid(data, "deep.rtf") == "RTF groups nest deeper than 128 levels (the limit)"
    assert time.perf_counter() - started < 1.0


def test_binary_data_and_damaged_files_are_bounded() -> None:
    # \bin skips its bytes without reading them as text, even when it claims more than there is
    data = b"{\\rtf1 before \\bin5 \x00\x01{}\\ after\\bin99999999999 }"
    assert extract(data, "bin.rtf").text == "before  after"
    # cut in the middle: what was read is kept
    assert extract(WORDPAD_KOREAN[: len(WORDPAD_KOREAN) // 2], "cut.rtf").text.startswith(
        KOREAN[:10]
    )
    # 300,000 control words and no text: empty, and fast
    started = time.perf_counter()
    assert "no text" in invalid(b"{\\rtf1 " + b"\\b\\i\\ul0" * 100_000 + b"}", "noise.rtf")
    assert time.perf_counter() - started < 3.0


def test_the_messages_never_quote_the_content() -> None:
    message = invalid(b"{\\rtf1 " + b"{" * 200 + b"TOPSECRET-CONTENT", "s.rtf")
    assert "TOPSECRET" not in message
