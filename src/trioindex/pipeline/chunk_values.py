"""What the chunker (:mod:`trioindex.pipeline.chunking`) takes and gives: its
:class:`ChunkingPolicy` (size, overlap and the embedding server's input limit, checked when it
is made), the :class:`ChunkDraft` it makes of each chunk (with the hash of its text), and
:func:`estimate_tokens`, the token count of a chunk cut by characters."""

from __future__ import annotations

import hashlib

import attrs


@attrs.frozen
class ChunkDraft:
    """One chunk before it is stored: ``text == source[start:end]``."""

    index: int
    text: str = attrs.field(repr=False)
    start: int
    end: int
    token_count: int
    content_sha256: str


def _positive(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value <= 0:
        raise ValueError(f"{attribute.name} must be > 0, got {value}")


def _overlap_below_max(
    instance: ChunkingPolicy, attribute: attrs.Attribute[int], value: int
) -> None:
    if not 0 <= value < instance.max_size:
        raise ValueError(f"overlap must be >= 0 and < max_size ({instance.max_size}), got {value}")


def _positive_or_none(
    instance: object, attribute: attrs.Attribute[int | None], value: int | None
) -> None:
    if value is not None and value <= 0:
        raise ValueError(f"{attribute.name} must be > 0 or None, got {value}")


@attrs.frozen
class ChunkingPolicy:
    """Chunk size and overlap, in tokens when a tokenizer is used, else in characters.

    ``max_input_tokens`` is the embedding model's input limit (special tokens included) when
    an embedding server reports one: character chunks are kept under it by their token bound
    (:mod:`trioindex.pipeline.chunking`). A token-aware chunker counts exactly, and its
    ``max_size`` is already clamped to the model's limit, so it does not use it.
    """

    max_size: int = attrs.field(validator=_positive)
    overlap: int = attrs.field(default=0, validator=_overlap_below_max)
    max_input_tokens: int | None = attrs.field(default=None, validator=_positive_or_none)


def estimate_tokens(text: str) -> int:
    """Token estimate used without a tokenizer: ceil(UTF-8 bytes / 4).

    About right for English with BPE/WordPiece vocabularies (~4 bytes per token) and for
    Korean with multilingual ones (3 bytes per syllable, ~1 token per 1-2 syllables).
    """
    return -(-len(text.encode("utf-8")) // 4)


def content_sha256(text: str) -> str:
    """The hex SHA-256 of ``text`` in UTF-8."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
