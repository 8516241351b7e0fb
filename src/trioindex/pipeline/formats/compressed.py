"""gzip-compressed documents: inflated in blocks, never past their limits, then read as the
document they hold.

:func:`gunzip` inflates the stream one block at a time and stops as soon as the output passes
the smaller of two bounds (:mod:`.limits`): :data:`GZIP_EXPANSION_RATIO` x the compressed size
(floor :data:`GZIP_MIN_CAP`), and the configured maximum document size (what the file would be
refused for if it were uploaded uncompressed). Concatenated members are read one after another,
as ``gzip -d`` does. :func:`inner_name` is the name the inflated document is detected by.
"""

from __future__ import annotations

import zlib
from typing import Any

from trioindex.errors import ContentInvalid
from trioindex.pipeline.formats.limits import GZIP_EXPANSION_RATIO, GZIP_MIN_CAP, GZIP_READ_BLOCK
from trioindex.pipeline.formats.messages import failure_name, size_text

__all__ = ["GZIP_MEDIA_TYPES", "CutShort", "OverCap", "gunzip", "inflate_into", "inner_name"]

GZIP_MEDIA_TYPES = frozenset({"application/gzip", "application/x-gzip"})
_MAGIC = b"\x1f\x8b"
# gzip header flags (RFC 1952): extra field, original file name
_FEXTRA = 0x04
_FNAME = 0x08
# what a compressed name stands for once inflated
_SUFFIXES = {".tgz": ".tar", ".svgz": ".svg", ".gz": "", ".gzip": ""}


def _gzip_cap(size: int, max_bytes: int) -> tuple[int, str]:
    """The inflated bytes a gzip file of ``size`` bytes may give, and which limit that is."""
    relative = max(GZIP_MIN_CAP, GZIP_EXPANSION_RATIO * size)
    if relative < max_bytes:
        return relative, f"the limit for a {size_text(size)} file; decompression bomb or oversized"
    return max_bytes, "indexing.parsing.max-document-size, the limit uncompressed too"


class OverCap(Exception):
    """Inflating went one byte past the cap (the caller words the refusal)."""


class CutShort(Exception):
    """The compressed stream ended before its end marker."""


def inflate_into(
    out: bytearray, inflater: Any, data: bytes | memoryview, pos: int, cap: int
) -> int:
    """Inflate one compressed stream of ``data`` from ``pos`` into ``out``, never more than
    one byte past ``cap`` bytes in all (:class:`OverCap`), and return where the stream ended.

    Input goes in :data:`GZIP_READ_BLOCK` bytes at a time and each step gives at most as
    much output, so memory stays at ``out`` plus a block."""
    view = memoryview(data)
    while not inflater.eof:
        block: bytes | memoryview = inflater.unconsumed_tail
        if not block and pos < len(view):
            block = view[pos : pos + GZIP_READ_BLOCK]
            pos += len(block)
        before = len(out)
        # len(out) <= cap here, so the length is at least 1 (0 would mean unlimited)
        out += inflater.decompress(block, min(GZIP_READ_BLOCK, cap + 1 - len(out)))
        if len(out) > cap:
            raise OverCap
        if not block and len(out) == before:
            raise CutShort  # no input left, and nothing more comes out
    return pos - len(inflater.unused_data)


def gunzip(data: bytes, max_bytes: int) -> bytes:
    """The inflated content of the gzip file ``data``; :class:`ContentInvalid` past its cap
    (the message names the limit), or for a corrupt or truncated stream."""
    cap, which = _gzip_cap(len(data), max_bytes)
    out = bytearray()
    pos = 0
    try:
        while True:
            # one gzip member: header, deflate stream, trailer
            pos = inflate_into(out, zlib.decompressobj(wbits=31), data, pos, cap)
            if data[pos : pos + len(_MAGIC)] != _MAGIC:
                break  # the end, or trailing padding (gzip -d ignores it too)
    except OverCap:
        raise ContentInvalid(f"gzip expands to more than {size_text(cap)} ({which})") from None
    except CutShort:
        raise ContentInvalid("corrupt gzip: the stream is cut short") from None
    except zlib.error as exc:
        raise ContentInvalid(f"corrupt gzip ({failure_name(exc)})") from exc
    return bytes(out)


def inner_name(name: str, data: bytes) -> str:
    """The name of the document inside: ``notes.md.gz`` -> ``notes.md``, ``a.tgz`` ->
    ``a.tar``; for a name without a gzip suffix, the original name in the gzip header."""
    lowered = name.lower()
    for suffix, replacement in _SUFFIXES.items():
        if lowered.endswith(suffix):
            return name[: -len(suffix)] + replacement
    return _header_name(data) or name


def _header_name(data: bytes) -> str | None:
    """The FNAME field of the first gzip header (RFC 1952), if there is one."""
    if len(data) < 10 or not data[3] & _FNAME:
        return None
    pos = 10
    if data[3] & _FEXTRA:
        pos += 2 + int.from_bytes(data[10:12], "little")
    end = data.find(b"\x00", pos, pos + 1024)
    if end < 0:
        return None
    # RFC 1952: the name is ISO 8859-1; only its last component matters
    return data[pos:end].decode("latin-1").replace("\\", "/").rsplit("/", 1)[-1] or None
