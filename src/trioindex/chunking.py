"""Chunking: extracted text in, ordered chunk drafts with offsets, token counts and hashes out.

Owns the pure second half of the parse step (ARCHITECTURE §4.5). Splitting is delegated to
``semantic-text-splitter`` (Rust, Unicode-aware): it cuts at the largest semantic unit that
fits — runs of newlines (paragraphs) first, then sentences, words, grapheme clusters and only
then single characters — so Korean syllables stay whole and ``다.`` / ``?`` / ``!`` end
sentences. Two measures:

* **tokens**, when the embedding model's ``tokenizers.Tokenizer`` is given: no chunk, counted
  as the model counts it (special tokens such as ``[CLS]``/``[SEP]`` included), exceeds
  ``policy.max_size``. The splitter counts without special tokens, so it is given
  ``max_size - special`` and every chunk is re-counted exactly afterwards; a chunk that still
  does not fit is split again with a smaller budget.
* **characters** (Python ``str`` code points) otherwise; ``token_count`` is then the documented
  estimate :func:`estimate_tokens` (UTF-8 bytes / 4, rounded up).

Offsets are Python string indexes into the text given to :meth:`Chunker.chunk`:
``text[start:end] == chunk.text``. semantic-text-splitter 0.33 reports character offsets (not
UTF-8 byte offsets); each one is verified anyway, so a library change cannot silently corrupt
offsets. Chunks are trimmed of surrounding whitespace; neighbours may share up to
``policy.overlap`` units of text. The output is deterministic for a given text and policy.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from pathlib import Path

import attrs
from semantic_text_splitter import TextSplitter
from tokenizers import Tokenizer

from trioindex.errors import ConfigError, ContentInvalid

logger = logging.getLogger(__name__)

__all__ = ["ChunkDraft", "Chunker", "ChunkingPolicy", "estimate_tokens"]

# Exact re-counting is batched so a 25 MB document never holds every Encoding at once.
_COUNT_BATCH = 256


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


@attrs.frozen
class ChunkingPolicy:
    """Chunk size and overlap, in tokens when a tokenizer is used, else in characters."""

    max_size: int = attrs.field(validator=_positive)
    overlap: int = attrs.field(default=0, validator=_overlap_below_max)


def estimate_tokens(text: str) -> int:
    """Token estimate used without a tokenizer: ceil(UTF-8 bytes / 4).

    About right for English with BPE/WordPiece vocabularies (~4 bytes per token) and for
    Korean with multilingual ones (3 bytes per syllable, ~1 token per 1-2 syllables).
    """
    return -(-len(text.encode("utf-8")) // 4)


def _content_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _special_token_count(tokenizer: Tokenizer) -> int:
    # What the post-processor adds to a single sequence: [CLS] + [SEP] for BERT, <s> + </s>
    # for XLM-R (bge-m3). Measured rather than read from the config so any model works.
    with_special = len(tokenizer.encode("", add_special_tokens=True).ids)
    without = len(tokenizer.encode("", add_special_tokens=False).ids)
    return max(0, with_special - without)


class Chunker:
    """Splits text into :class:`ChunkDraft` values under a :class:`ChunkingPolicy`.

    Safe to share between worker threads: after construction the only state that changes
    is a small cache of re-split splitters.
    """

    def __init__(self, policy: ChunkingPolicy, tokenizer: Tokenizer | None = None) -> None:
        self.policy = policy
        self._tokenizer: Tokenizer | None = None
        self._smaller: dict[int, TextSplitter] = {}  # re-split budgets, see _resplit
        if tokenizer is None:
            self._capacity = policy.max_size
            self._overlap = policy.overlap
            self._splitter = TextSplitter(policy.max_size, overlap=policy.overlap, trim=True)
            return
        # Work on a copy: padding would make every text count as the padded length and
        # truncation would hide overlong chunks; the caller's tokenizer stays as it was.
        own = Tokenizer.from_str(tokenizer.to_str())
        own.no_padding()
        own.no_truncation()
        special = _special_token_count(own)
        capacity = policy.max_size - special
        if capacity < 1:
            raise ValueError(
                f"max_size {policy.max_size} leaves no room next to {special} special tokens"
            )
        self._tokenizer = own
        self._capacity = capacity
        # The splitter refuses overlap >= capacity; the budget shrank by the special tokens.
        self._overlap = min(policy.overlap, capacity - 1)
        self._splitter = TextSplitter.from_huggingface_tokenizer(
            own, capacity, overlap=self._overlap, trim=True
        )

    @classmethod
    def for_model_dir(cls, policy: ChunkingPolicy, model_dir: Path) -> Chunker:
        """A token-aware chunker using ``model_dir/tokenizer.json``."""
        path = Path(model_dir) / "tokenizer.json"
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception for missing/bad files
            raise ConfigError(f"cannot load the model tokenizer from {path}") from exc
        return cls(policy, tokenizer)

    @property
    def token_aware(self) -> bool:
        return self._tokenizer is not None

    def chunk(self, text: str) -> list[ChunkDraft]:
        """Chunks of ``text`` in order, indexes 0..n-1; ``[]`` only when ``text`` is blank."""
        if not text.strip():
            return []
        spans = self._split(self._splitter, text, 0, len(text))
        if self._tokenizer is None:
            counted = [(start, piece, estimate_tokens(piece)) for start, piece in spans]
        else:
            counted = self._fit_tokens(self._tokenizer, text, spans)
        del spans
        drafts: list[ChunkDraft] = []
        for start, piece, count in counted:
            # The splitter trims Unicode White_Space; Python also counts the C0 separators
            # \x1c-\x1f as space. A chunk of nothing but those carries no content.
            if not piece.strip():
                continue
            drafts.append(
                ChunkDraft(
                    index=len(drafts),
                    text=piece,
                    start=start,
                    end=start + len(piece),
                    token_count=count,
                    content_sha256=_content_sha256(piece),
                )
            )
        return drafts

    @staticmethod
    def _split(splitter: TextSplitter, text: str, lo: int, hi: int) -> list[tuple[int, str]]:
        """``(start, piece)`` for each cut of ``text[lo:hi]``, ``start`` an offset into ``text``."""
        segment = text if (lo, hi) == (0, len(text)) else text[lo:hi]
        spans: list[tuple[int, str]] = []
        search_from = 0
        for reported, piece in splitter.chunk_indices(segment):
            offset = reported
            if not segment.startswith(piece, offset):
                # Not a character offset (a splitter version reporting bytes?): find the piece
                # after the previous chunk's start; chunks come in text order.
                offset = segment.find(piece, search_from)
                if offset < 0:
                    raise RuntimeError("text splitter returned a chunk not found in the text")
            spans.append((lo + offset, piece))
            search_from = offset + 1
        return spans

    def _fit_tokens(
        self, tokenizer: Tokenizer, text: str, spans: Sequence[tuple[int, str]]
    ) -> list[tuple[int, str, int]]:
        """Exact model token counts; re-split any span the model would see as too long."""
        limit = self.policy.max_size
        result: list[tuple[int, str, int]] = []
        for batch_start in range(0, len(spans), _COUNT_BATCH):
            batch = spans[batch_start : batch_start + _COUNT_BATCH]
            counts = _count_tokens(tokenizer, [piece for _, piece in batch])
            for (start, piece), count in zip(batch, counts, strict=True):
                if count <= limit:
                    result.append((start, piece, count))
                else:
                    result.extend(self._resplit(tokenizer, text, start, piece, count))
        return result

    def _resplit(
        self, tokenizer: Tokenizer, text: str, start: int, piece: str, count: int
    ) -> list[tuple[int, str, int]]:
        limit = self.policy.max_size
        capacity = self._capacity
        logger.debug("chunk of %d tokens over the limit of %d: re-splitting", count, limit)
        while True:
            splitter = self._smaller.get(capacity)
            if splitter is None:
                # Building a splitter copies the tokenizer: keep the few ever needed.
                splitter = TextSplitter.from_huggingface_tokenizer(tokenizer, capacity, trim=True)
                self._smaller[capacity] = splitter
            pieces = self._split(splitter, text, start, start + len(piece))
            counts = _count_tokens(tokenizer, [p for _, p in pieces])
            worst = max(counts, default=0)
            if worst <= limit:
                return [(s, p, c) for (s, p), c in zip(pieces, counts, strict=True)]
            capacity -= max(1, worst - limit)
            if capacity < 1:
                raise ContentInvalid(
                    "text cannot be split to fit the embedding model's input limit"
                )


def _count_tokens(tokenizer: Tokenizer, pieces: list[str]) -> list[int]:
    """Token counts as the model sees each piece: special tokens included."""
    return [len(e.ids) for e in tokenizer.encode_batch(pieces, add_special_tokens=True)]
