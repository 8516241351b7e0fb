"""E-mail (RFC 5322 / MIME, ``.eml``) to text: the subject as a heading, the From, To, Cc and
Date lines, the body's text and HTML parts, and the attachments listed by name.

Parsed by the standard library (:mod:`email`, its current policy: encoded words such as
``=?EUC-KR?B?...?=`` decoded). The MIME tree is walked without recursion, at most
:data:`EML_MAX_DEPTH` deep and :data:`EML_MAX_PARTS` parts. Of a ``multipart/alternative``
the plain text is read when it has text, else the HTML (both would say the same twice). A part's
bytes are decoded like an uploaded text file (:func:`.text.decode`: its declared charset, then
UTF-8, then detection), an HTML part to its visible text (:mod:`.html`). An attachment (a part
with a file name or ``Content-Disposition: attachment``, or an attached message) is listed by
its name and type, never opened.
"""

from __future__ import annotations

import email
import email.policy
import re
from collections.abc import Iterator
from email.message import EmailMessage, Message

from trioindex.errors import ContentInvalid
from trioindex.pipeline.formats.detect import DocumentFormat
from trioindex.pipeline.formats.limits import EML_MAX_DEPTH, EML_MAX_PARTS
from trioindex.pipeline.formats.messages import refused_as_corrupt
from trioindex.pipeline.formats.outline import Outline
from trioindex.pipeline.formats.text import decode, normalise

__all__ = ["eml_text"]

_ADDRESS_LINES = ("From", "To", "Cc", "Date")
# a multipart's boundary parameter, and a line that may be one of its delimiters (RFC 2046)
_BOUNDARY = re.compile(rb'(?i)\bboundary\s*=\s*"?([^"\s;]{1,70})')
_DELIMITER = re.compile(rb"(?m)^--([^\r\n]{1,70}?)(?:--)?[ \t]*\r?$")


def _header(message: Message, name: str) -> str:
    try:
        value = message.get(name)
        return "" if value is None else " ".join(str(value).split())
    except Exception:  # a header the parser could not decode: left out, not fatal
        return ""


def _is_attachment(part: Message) -> bool:
    if part.get_content_type() == "message/rfc822":
        return True
    disposition = (part.get_content_disposition() or "").lower()
    return disposition == "attachment" or (disposition != "inline" and bool(part.get_filename()))


def _attached_subject(part: Message) -> str:
    """The subject of an attached message (``message/rfc822``), its name in the list."""
    inner = part.get_payload()
    if isinstance(inner, list) and inner and isinstance(inner[0], Message):
        return _header(inner[0], "Subject")
    return ""


def _text_of(part: Message) -> str:
    """A text part's bytes as text (HTML: its visible text)."""
    data = part.get_payload(decode=True)
    if not isinstance(data, bytes) or not data:
        return ""
    charset = part.get_content_charset()
    html = part.get_content_type() == "text/html"
    fmt = DocumentFormat.HTML if html else DocumentFormat.TEXT
    try:
        text, _replaced = decode(data, fmt, f"text/plain; charset={charset}" if charset else None)
    except ContentInvalid:
        return ""  # one undecodable part does not make the message unreadable
    if html:
        from trioindex.pipeline.formats.html import html_text

        return html_text(normalise(text))
    return text


def _chosen_alternative(parts: list[Message]) -> list[Message]:
    """Of alternative renderings, the plain text when it has any text, else the rest."""
    plain = [p for p in parts if p.get_content_type() == "text/plain"]
    if plain and any(_text_of(p).strip() for p in plain):
        return plain[:1]
    return [p for p in parts if p.get_content_type() != "text/plain"][:1] or parts[:1]


def _leaves(message: Message) -> Iterator[Message]:
    """The parts to read or list, in order: a depth-first walk with its own stack."""
    stack: list[tuple[Message, int]] = [(message, 0)]
    seen = 0
    while stack:
        part, depth = stack.pop()
        seen += 1
        if seen > EML_MAX_PARTS:
            raise ContentInvalid(f"EML has more than {EML_MAX_PARTS} MIME parts (the limit)")
        if depth > EML_MAX_DEPTH:
            raise ContentInvalid(f"EML parts nest deeper than {EML_MAX_DEPTH} levels (the limit)")
        if not part.is_multipart() or _is_attachment(part):
            yield part
            continue
        payload = part.get_payload()
        children = (
            [c for c in payload if isinstance(c, Message)] if isinstance(payload, list) else []
        )
        if part.get_content_subtype() == "alternative":
            children = _chosen_alternative(children)
        stack.extend((child, depth + 1) for child in reversed(children))


def _count_parts_before_parsing(data: bytes) -> None:
    """Refuse a message with too many parts from its boundary lines, before the parser (about
    2 ms per part, and slower the deeper they nest) spends minutes on a crafted one."""
    boundaries = {m.group(1) for m in _BOUNDARY.finditer(data)}
    delimiters = sum(1 for m in _DELIMITER.finditer(data) if m.group(1) in boundaries)
    # each multipart has one delimiter line per part and one closing line
    if delimiters > EML_MAX_PARTS + len(boundaries):
        raise ContentInvalid(f"EML has more than {EML_MAX_PARTS} MIME parts (the limit)")


def eml_text(data: bytes, max_bytes: int, max_chars: int) -> str:
    """The message as text (module docstring)."""
    out = Outline("EML", max_chars)
    _count_parts_before_parsing(data)
    with refused_as_corrupt("EML"):
        message = email.message_from_bytes(data, _class=EmailMessage, policy=email.policy.default)
        out.heading(_header(message, "Subject"))
        for name in _ADDRESS_LINES:
            value = _header(message, name)
            if value:
                out.line(f"{name}: {value}")
        attachments: list[str] = []
        for part in _leaves(message):
            if _is_attachment(part):
                name = part.get_filename() or _attached_subject(part) or "unnamed"
                attachments.append(f"{' '.join(name.split())} ({part.get_content_type()})")
            elif part.get_content_maintype() == "text":
                out.paragraph(_text_of(part))
        for attachment in attachments:
            out.line(f"Attachment: {attachment}")
    return out.text()
