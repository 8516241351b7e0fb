"""How a refusal is worded: the pieces every format's :class:`~trioindex.errors.ContentInvalid`
messages share. A message names sizes and the failing parser's exception class, never the
content itself (it ends up in job rows and logs).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from trioindex.errors import ContentInvalid

__all__ = ["failure_name", "refused_as_corrupt", "size_text"]


@contextlib.contextmanager
def refused_as_corrupt(kind: str) -> Iterator[None]:
    """Any exception of a parser inside becomes ``corrupt KIND (ExceptionClass)``; a refusal
    already made (:class:`ContentInvalid`) and ``MemoryError`` (a resource failure, not a
    verdict on the file) pass through."""
    try:
        yield
    except (ContentInvalid, MemoryError):
        raise
    except Exception as exc:  # parsers raise a zoo of types on hostile input
        raise ContentInvalid(f"corrupt {kind} ({failure_name(exc)})") from exc


def failure_name(exc: BaseException) -> str:
    """The exception's class for a message: ``PdfReadError``, ``zlib.error``."""
    cls = type(exc)
    return cls.__name__ if cls.__name__[:1].isupper() else f"{cls.__module__}.{cls.__name__}"


def size_text(n: float) -> str:
    """A byte count for a message: ``900 bytes``, ``9.9 KiB``, ``32 MiB``."""
    unit = "bytes"
    for bigger in ("KiB", "MiB"):
        if n < 1024:
            break
        n /= 1024
        unit = bigger
    shown = f"{n:.0f}" if unit == "bytes" or n >= 100 else f"{n:.1f}".removesuffix(".0")
    return f"{shown} {unit}"
