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

from trioindex.errors import ContentInvalid
from trioindex.pipeline.formats.limits import GZIP_EXPANSION_RATIO, GZIP_MIN_CAP, GZIP_READ_BLOCK
from trioindex.pipeline.formats.messages import failure_name, size_text

__all__ = ["GZIP_MEDIA_TYPES", "gunzip", "inner_name"]

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


def gunzip(data: bytes, max_bytes: int) -> bytes:
    """The inflated content of the gzip file ``data``; :class:`ContentInvalid` past its cap
    (the message names the limit), or for a corrupt or truncated stream."""
    cap, which = _gzip_cap(len(data), max_bytes)
    out = bytearray()
    view = memoryview(data)
    pos = 0
    try:
        while True:
            inflater = zlib.decompressobj(wbits=31)  # one gzip member: header, deflate, trailer
            while not inflater.eof:
                block: bytes | memoryview = inflater.unconsumed_tail
                if not block:
                    if pos >= len(view):
                        raise ContentInvalid("corrupt gzip: the stream is cut short")
                    block = view[pos : pos + GZIP_READ_BLOCK]
                    pos += len(block)
                # at most one byte past the cap (len(out) <= cap here, so never 0: unlimited)
                out += inflater.decompress(block, cap + 1 - len(out))
                if len(out) > cap:
                    raise ContentInvalid(f"gzip expands to more than {size_text(cap)} ({which})")
            pos -= len(inflater.unused_data)  # the bytes after this member, back to the file
            if view[pos : pos + len(_MAGIC)] != _MAGIC:
                break  # the end, or trailing padding (gzip -d ignores it too)
    except ContentInvalid:
        raise
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
