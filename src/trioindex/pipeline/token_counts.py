"""Counting a model's tokens for the chunker (:mod:`trioindex.pipeline.chunking`), in bounded
batches.

A ``tokenizers.Encoding`` holds its tokens' strings, offsets and masks (~40 KiB for a
256-token chunk): encoding a document's thousands of chunks in one ``encode_batch`` call held
hundreds of MiB (323 MiB above the baseline for a 5 MB text, docs/test-results/memory.md).
Every count here, and every pass of the chunker that encodes pieces, goes
:data:`COUNT_BATCH` pieces at a time (:func:`in_batches`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar

from tokenizers import Tokenizer

__all__ = ["COUNT_BATCH", "count_tokens", "in_batches", "special_token_count"]

COUNT_BATCH = 256

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
