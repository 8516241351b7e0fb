"""E-mail messages (.eml): headers, text and HTML parts, attachments listed, Korean
byte-exact in any of its charsets, hostile MIME trees refused naming the limit.

The messages are written by the standard library's e-mail generator (the one many programs
send with): encoded-word headers, base64 and quoted-printable bodies, EUC-KR and UTF-8."""

from __future__ import annotations

import base64
import time
from email.message import EmailMessage
from email.policy import SMTP

from tests.pipeline.test_formats import KOREAN, extract, invalid
from trioindex.pipeline.formats import DocumentFormat, detect_format


def message(subject: str = "분기 보고서 검토 요청") -> EmailMessage:
    mail = EmailMessage()
    mail["Subject"] = subject
    mail["From"] = "김철수 <chulsoo@example.com>"
    mail["To"] = "team@example.com"
    mail["Cc"] = "이영희 <younghee@example.com>"
    mail["Date"] = "Tue, 01 Dec 2026 09:30:00 +0900"
    return mail


def wire(mail: EmailMessage) -> bytes:
    return mail.as_bytes(policy=SMTP)


def test_headers_plain_text_and_attachments_listed_not_read() -> None:
    mail = message()
    mail.set_content(KOREAN, charset="utf-8", cte="base64")
    mail.add_attachment(
        b"%PDF-1.4 secret", maintype="application", subtype="pdf", filename="실적.pdf"
    )
    mail.add_attachment("attached notes", filename="notes.txt")
    got = extract(wire(mail), "mail.eml")
    assert got.format is DocumentFormat.EML
    assert got.text == (
        "# 분기 보고서 검토 요청\n\n"
        "From: 김철수 <chulsoo@example.com>\n"
        "To: team@example.com\n"
        "Cc: 이영희 <younghee@example.com>\n"
        "Date: Tue, 01 Dec 2026 09:30:00 +0900\n\n"
        f"{KOREAN}\n\n"
        "Attachment: 실적.pdf (application/pdf)\n"
        "Attachment: notes.txt (text/plain)"
    )
    assert "secret" not in got.text and "attached notes" not in got.text


def test_alternative_parts_give_the_text_once_and_html_alone_its_visible_text() -> None:
    mail = message()
    mail.set_content("Plain version of the body.")
    mail.add_alternative("<html><body><p>HTML version</p></body></html>", subtype="html")
    assert extract(wire(mail), "a.eml").text.endswith("\n\nPlain version of the body.")
    html_only = message()
    html_only.set_content(
        "<html><head><style>p{}</style></head><body><p>첫 문단</p><p>둘째</p></body></html>",
        subtype="html",
    )
    assert extract(wire(html_only), "b.eml").text.endswith("\n\n첫 문단\n\n둘째")


def test_legacy_korean_charsets_are_decoded() -> None:
    mail = message("placeholder")
    mail.set_content(KOREAN, charset="euc-kr", cte="quoted-printable")
    subject = b"=?EUC-KR?B?" + base64.b64encode("한글 제목".encode("euc-kr")) + b"?="
    data = wire(mail).replace(b"placeholder", subject)
    assert b"euc-kr" in data.lower() and KOREAN.encode("utf-8") not in data
    got = extract(data, "legacy.eml").text
    assert got.startswith("# 한글 제목\n\n") and KOREAN in got


def test_detected_by_its_headers_and_by_its_name() -> None:
    mail = message()
    mail.set_content("Body.")
    assert detect_format(wire(mail), "saved.txt") is DocumentFormat.EML
    assert detect_format(b"Just a note: three words.", "note.eml") is DocumentFormat.EML
    assert detect_format(b"Note: this is text.\nTo: whom it may concern", "a.txt") is (
        DocumentFormat.TEXT
    )
    # a changelog of "field: value" lines (libisl's, under /usr/share/doc) is no e-mail
    changelog = b"version: 0.25\ndate: Sat 02 Jul 2022\nchanges:\n\t- more bindings\n---\n" * 5
    assert detect_format(changelog, "changelog") is DocumentFormat.TEXT


def _nested(depth: int) -> bytes:
    head = b"From: a@example.com\r\nSubject: deep\r\nMIME-Version: 1.0\r\n"
    opening = b"".join(
        b'Content-Type: multipart/mixed; boundary="b%d"\r\n\r\n--b%d\r\n' % (i, i)
        for i in range(depth)
    )
    closing = b"".join(b"\r\n--b%d--\r\n" % i for i in reversed(range(depth)))
    return head + opening + b"Content-Type: text/plain\r\n\r\ninnermost\r\n" + closing


def test_mime_parts_nested_too_deep_are_refused_naming_the_limit() -> None:
    assert extract(_nested(10), "ok.eml").text.endswith("innermost")
    started = time.perf_counter()
    assert invalid(_nested(200), "deep.eml") == "EML parts nest deeper than 32 levels (the limit)"
    assert time.perf_counter() - started < 2.0


def test_too_many_parts_are_refused_naming_the_limit() -> None:
    parts = b"".join(b"--b\r\nContent-Type: text/plain\r\n\r\np\r\n" for _ in range(1001))
    data = (
        b'From: a@example.com\r\nSubject: many\r\nContent-Type: multipart/mixed; boundary="b"\r\n\r\n'
        + parts
        + b"--b--\r\n"
    )
    started = time.perf_counter()
    assert invalid(data, "many.eml") == "EML has more than 1000 MIME parts (the limit)"
    assert time.perf_counter() - started < 0.5, "counted before the parser reads a part"
    # a million parts in 40 MB: still refused before parsing
    huge = data.replace(parts, b"--b\r\n\r\np\r\n" * 1_000_000)
    started = time.perf_counter()
    assert invalid(huge, "huge.eml", max_bytes=64 * 1024 * 1024) == (
        "EML has more than 1000 MIME parts (the limit)"
    )
    assert time.perf_counter() - started < 5.0


def test_truncated_and_undecodable_parts_keep_the_rest() -> None:
    mail = message()
    mail.set_content("The body survives. " * 20, cte="base64")
    data = wire(mail)
    got = extract(data[: len(data) - 40], "cut.eml").text
    assert got.startswith("# 분기 보고서 검토 요청") and "The body survives." in got
    broken = data.replace(b'charset="utf-8"', b'charset="no-such-charset"')
    assert "The body survives." in extract(broken, "odd.eml").text


def test_the_messages_never_quote_the_content() -> None:
    data = _nested(100).replace(b"innermost", b"TOPSECRET-CONTENT")
    assert "TOPSECRET" not in invalid(data, "s.eml")
