"""Counting a model's tokens for the chunker (:mod:`trioindex.pipeline.chunking`), in bounded
batches, and bounding them when the model's tokenizer is not at hand.

A ``tokenizers.Encoding`` holds its tokens' strings, offsets and masks (~40 KiB for a
256-token chunk): encoding a document's thousands of chunks in one ``encode_batch`` call held
hundreds of MiB (323 MiB above the baseline for a 5 MB text, docs/test-results/memory.md).
Every count here, and every pass of the chunker that encodes pieces, goes
:data:`COUNT_BATCH` pieces at a time (:func:`in_batches`).

:func:`token_bound` is a cautious count for a model whose tokenizer we do not have (an embedding
server's): characters weighted by script, :data:`UNKNOWN_SPECIAL_TOKENS` added. The weights
were measured with the all-MiniLM-L6-v2 tokenizer (a BERT WordPiece vocabulary, among the most
expensive for non-English text: it spells Hangul as jamo) on the Korean, Chinese, Japanese,
German, French, Polish, Russian and Vietnamese message catalogs of a Debian system, in windows
of 600 characters:

=================================  ======  ===================================================
characters                         weight  measured tokens per character (MiniLM)
=================================  ======  ===================================================
ASCII whitespace                   0       (separates words)
ASCII letters and digits           0.4     English 0.29-0.30 per non-space character, German
                                           0.42
U+A000-U+DFFF: Hangul syllables    2.5     1.96 median, 2.42 at the 99th percentile of
                                           windows; a syllable alone is 1 to 3 tokens
U+3000-U+9FFF, U+F000-U+FFFF and   1.5     1.0 (every ideograph is a token of its own);
beyond: CJK marks, kana,                   byte-level BPE vocabularies take 2 or more for
ideographs, fullwidth forms, emoji         rare ones
anything else                      1       ASCII punctuation is a token each; Cyrillic,
                                           Greek, Arabic 0.6-1.0
=================================  ======  ===================================================

Each class is a range of the first byte of a character's UTF-8 form, so a text is weighed by one
``bytes.translate`` and a few counts (18 µs for 1,500 Korean characters; a regular expression
per class took 300 µs).

In windows mostly of Hangul, ideographs or kana the real count stayed below the bound (real /
bound: median 0.68-0.79, at most 0.98 for Korean, 0.90 for Chinese, 0.78 for Japanese); a
1,500-character Korean text is 1,957 to 2,358 MiniLM tokens and bounded at about 2,800. ASCII
codes (``10x11 A0x2``), where every letter and digit is a token, and European languages in an
English vocabulary exceed it (Polish at most 1.36 times, German in 7% of windows), so a
server's refusal of an input as too long must still be handled: the embedding clients split it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import TypeVar

from tokenizers import Tokenizer

__all__ = [
    "COUNT_BATCH",
    "UNKNOWN_SPECIAL_TOKENS",
    "character_size",
    "count_tokens",
    "in_batches",
    "largest_token_bound",
    "overlap_reach",
    "special_token_count",
    "token_bound",
]

COUNT_BATCH = 256

#: What an unknown model adds to one sequence: [CLS] + [SEP] (BERT), <s> + </s> (XLM-R).
UNKNOWN_SPECIAL_TOKENS = 2

# The weight of each character class (module docstring), indexed by class.
_WEIGHTS = (0.0, 0.4, 1.0, 1.5, 2.5)


def _byte_classes() -> bytes:
    classes = bytearray([2]) * 256  # punctuation, other scripts: 1
    for byte in b" \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f":
        classes[byte] = 0  # whitespace
    for byte in b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789":
        classes[byte] = 1
    classes[0x80:0xC0] = bytes(0x40)  # continuation bytes: the lead byte weighs the character
    classes[0xE3:0xEA] = b"\x03" * 7  # U+3000-U+9FFF: CJK marks, kana, ideographs
    classes[0xEA:0xEE] = b"\x04" * 4  # U+A000-U+DFFF: Hangul syllables (and rare scripts)
    classes[0xEF] = 3  # U+F000-U+FFFF: CJK compatibility ideographs, fullwidth forms
    classes[0xF0:0xF5] = b"\x03" * 5  # beyond the BMP: CJK extensions, emoji
    return bytes(classes)


_BYTE_CLASSES = _byte_classes()

T = TypeVar("T")


def in_batches(items: Sequence[T]) -> Iterator[Sequence[T]]:
    """``items`` in consecutive slices of at most :data:`COUNT_BATCH`."""
    for start in range(0, len(items), COUNT_BATCH):
        yield items[start : start + COUNT_BATCH]


def count_tokens(tokenizer: Tokenizer, pieces: Sequence[str]) -> list[int]:
    """Token counts as the model sees each piece: special tokens included."""
    counts: list[int] = []
    for batch in in_batches(pieces):
        counts.extend(len(e.ids) for e in tokenizer.encode_batch(batch, add_special_tokens=True))
    return counts


def special_token_count(tokenizer: Tokenizer) -> int:
    """What the post-processor adds to a single sequence: [CLS] + [SEP] for BERT, <s> + </s>
    for XLM-R (bge-m3). Measured rather than read from the config so any model works."""
    with_special = len(tokenizer.encode("", add_special_tokens=True).ids)
    without = len(tokenizer.encode("", add_special_tokens=False).ids)
    return max(0, with_special - without)


def token_bound(text: str) -> int:
    """A cautious count of the tokens an unknown model makes of ``text``, special tokens
    included: characters weighted by script (module docstring, with how far it holds)."""
    classes = text.encode("utf-8", "surrogatepass").translate(_BYTE_CLASSES)
    w = _WEIGHTS  # class 0 weighs nothing
    weighted = (
        w[1] * classes.count(1)
        + w[2] * classes.count(2)
        + w[3] * classes.count(3)
        + w[4] * classes.count(4)
    )
    return UNKNOWN_SPECIAL_TOKENS + math.ceil(weighted)


def largest_token_bound(characters: int) -> int:
    """The largest :func:`token_bound` of any text of ``characters`` characters."""
    return UNKNOWN_SPECIAL_TOKENS + math.ceil(max(_WEIGHTS) * characters)


def character_size(piece: str, chars_per_token: float | None) -> int:
    """A character chunk's size: its characters, or, under a token limit of
    ``chars_per_token`` characters a token, its :func:`token_bound` in characters when that is
    larger."""
    if chars_per_token is None:
        return len(piece)
    return max(len(piece), math.ceil(token_bound(piece) * chars_per_token))


def overlap_reach(
    text: str, start: int, end: int, overlap: int, chars_per_token: float | None
) -> int:
    """An offset ``o`` in ``[start, end]``, as early as found, whose ``text[o:end]`` has a
    :func:`character_size` of at most ``overlap``; ``end`` when none has."""
    lo = max(start, end - overlap)
    if chars_per_token is None:
        return lo
    # Each step keeps what fits at the density measured so far: a few steps, not a search.
    while lo < end and (size := character_size(text[lo:end], chars_per_token)) > overlap:
        lo = max(lo + 1, end - (end - lo) * overlap // size)
    return lo
