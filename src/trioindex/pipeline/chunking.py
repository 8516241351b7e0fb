"""Chunking: extracted text in, ordered chunk drafts with offsets, token counts and hashes out.

Owns the pure second half of the parse step. Splitting is delegated to
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

Two bounds keep any text cheap and every chunk meaningful:

* **segments**: the splitter's cost grows with the square of a stretch that has no boundary
  above the word (a 2 MB word took 23 s, 8 MB 490 s; unpunctuated CJK is worse), so the text
  is first cut into segments of at most :data:`SEGMENT_CHUNKS` chunks' worth of characters, at
  the best boundary in the segment's second half — a blank line, a line break, a sentence end,
  whitespace, or (only if there is none) a hard cut that keeps grapheme clusters whole. Each
  segment is split on its own, so the cost is linear in the text; chunks never span a cut.
* **characters**, also for token-aware chunks: an unknown "word" is one ``[UNK]`` token
  however long it is, so token-aware chunks are capped at :data:`CHARS_PER_TOKEN` characters
  per token of the budget, and longer ones are split again by characters.

Offsets are Python string indexes into the text given to :meth:`Chunker.chunk`:
``text[start:end] == chunk.text``. semantic-text-splitter 0.33 reports character offsets (not
UTF-8 byte offsets); each one is verified anyway, so a library change cannot silently corrupt
offsets. Chunks are trimmed of surrounding whitespace; neighbours may share up to
``policy.overlap`` units of text. The output is deterministic for a given text and policy.
"""

from __future__ import annotations

import hashlib
import logging
import re
import unicodedata
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
from semantic_text_splitter import TextSplitter
from tokenizers import Tokenizer

from trioindex.errors import ConfigError, ContentInvalid

logger = logging.getLogger(__name__)

__all__ = [
    "CHARS_PER_TOKEN",
    "SEGMENT_CHUNKS",
    "ChunkDraft",
    "Chunker",
    "ChunkingPolicy",
    "estimate_tokens",
    "segments",
]

# Exact re-counting is batched so a 25 MB document never holds every Encoding at once.
_COUNT_BATCH = 256
# A segment holds at most this many chunks' worth of characters (and at least
# _MIN_SEGMENT): small enough that the splitter's quadratic cost per segment stays a few ms,
# large enough that the chunks packed next to a cut are rarely shorter than they could be.
SEGMENT_CHUNKS = 8
_MIN_SEGMENT = 4096
# Token-aware chunks hold at most this many characters per token of the budget (real text
# averages 2-5): 2048 characters at 256 tokens.
CHARS_PER_TOKEN = 8
# Boundaries to cut a segment at, best first: blank line, line break, sentence end, space.
_SEGMENT_BOUNDARIES = (
    re.compile(r"\n[^\S\n]*\n\s*"),
    re.compile(r"\n\s*"),
    re.compile(r"[.!?。！？…][\"')\]」』”’]*\s+|[。！？]"),
    re.compile(r"\s+"),
)
# How far a hard cut may step back to avoid splitting a grapheme cluster.
_MAX_CLUSTER = 32


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
    is a small cache of re-split splitters. Picklable, so the parse step can hand it to a
    worker process: it travels as its policy and tokenizer (the ``tokenizer.json`` path when it
    came from :meth:`for_model_dir`), and a process rebuilds each distinct chunker only once.
    """

    def __init__(
        self, policy: ChunkingPolicy, tokenizer: Tokenizer | None = None, *, _source: str = ""
    ) -> None:
        self.policy = policy
        self._tokenizer: Tokenizer | None = None
        self._tokenizer_json: str | None = None
        self._tokenizer_path = _source  # the tokenizer.json it was loaded from, if any
        self._smaller: dict[int, TextSplitter] = {}  # re-split budgets, see _resplit
        if tokenizer is None:
            self._capacity = policy.max_size
            self._overlap = policy.overlap
            self._max_chars = policy.max_size
            self._splitter = TextSplitter(policy.max_size, overlap=policy.overlap, trim=True)
            self._segment = max(_MIN_SEGMENT, SEGMENT_CHUNKS * self._max_chars)
            return
        # Work on a copy: padding would make every text count as the padded length and
        # truncation would hide overlong chunks; the caller's tokenizer stays as it was.
        self._tokenizer_json = tokenizer.to_str()
        own = Tokenizer.from_str(self._tokenizer_json)
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
        self._max_chars = CHARS_PER_TOKEN * policy.max_size
        self._char_splitter = TextSplitter(self._max_chars, trim=True)
        self._segment = max(_MIN_SEGMENT, SEGMENT_CHUNKS * self._max_chars)

    @classmethod
    def for_model_dir(cls, policy: ChunkingPolicy, model_dir: Path) -> Chunker:
        """A token-aware chunker using ``model_dir/tokenizer.json``."""
        path = Path(model_dir) / "tokenizer.json"
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception for missing/bad files
            raise ConfigError(f"cannot load the model tokenizer from {path}") from exc
        return cls(policy, tokenizer, _source=str(path.resolve()))

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # A tokenizer.json can be 17 MB (bge-m3): send its path when there is one.
        if self._tokenizer_path:
            return _rebuild_chunker, (self.policy, "path", self._tokenizer_path)
        if self._tokenizer_json is not None:
            return _rebuild_chunker, (self.policy, "json", self._tokenizer_json)
        return _rebuild_chunker, (self.policy, "", "")

    @property
    def token_aware(self) -> bool:
        return self._tokenizer is not None

    def chunk(self, text: str) -> list[ChunkDraft]:
        """Chunks of ``text`` in order, indexes 0..n-1; ``[]`` only when ``text`` is blank."""
        if not text.strip():
            return []
        spans = [
            span
            for lo, hi in segments(text, self._segment)
            for span in self._split(self._splitter, text, lo, hi)
        ]
        if self._tokenizer is None:
            counted = [(start, piece, estimate_tokens(piece)) for start, piece in spans]
        else:
            spans = self._cap_characters(text, spans)
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

    def _cap_characters(self, text: str, spans: list[tuple[int, str]]) -> list[tuple[int, str]]:
        """Split again, by characters, every token-aware span over the character cap."""
        if all(len(piece) <= self._max_chars for _, piece in spans):
            return spans
        capped: list[tuple[int, str]] = []
        for start, piece in spans:
            if len(piece) <= self._max_chars:
                capped.append((start, piece))
            else:
                capped.extend(self._split(self._char_splitter, text, start, start + len(piece)))
        return capped

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


# -- segments -----------------------------------------------------------------------------------

# Each boundary as "the last one before endpos": a greedy prefix backtracks from the end in C.
_LAST_BOUNDARY = tuple(re.compile(r"(?s:.*)(?:" + b.pattern + ")") for b in _SEGMENT_BOUNDARIES)


def segments(text: str, limit: int) -> Iterator[tuple[int, int]]:
    """``(lo, hi)`` spans covering ``text`` in order, each at most ``limit`` characters.

    A cut falls in the second half of the allowed span, at the last of the best boundary kind
    found there (module docstring); costs one pass over the text.
    """
    if limit < 2:
        raise ValueError("segment limit must be >= 2")
    lo, end = 0, len(text)
    while end - lo > limit:
        cut = _best_cut(text, lo + limit // 2, lo + limit)
        yield lo, cut
        lo = cut
    yield lo, end


def _best_cut(text: str, lo: int, hi: int) -> int:
    """A cut position in ``(lo, hi]``: after the last best boundary, else a hard cut."""
    for boundary in _LAST_BOUNDARY:
        found = boundary.match(text, lo, hi)
        if found is not None and found.end() > lo:
            return found.end()
    cut = hi
    while cut > lo + 1 and hi - cut < _MAX_CLUSTER and _inside_cluster(text, cut):
        cut -= 1
    return cut if not _inside_cluster(text, cut) else hi


def _inside_cluster(text: str, at: int) -> bool:
    """Whether a cut before ``text[at]`` would split a grapheme cluster (close enough)."""
    char, before = ord(text[at]), text[at - 1]
    return (
        before == "\u200d"  # zero-width joiner: the emoji sequence goes on
        or unicodedata.category(text[at]) in ("Mn", "Mc", "Me")  # combining marks
        or 0x1160 <= char <= 0x11FF  # Hangul jamo vowels and finals of a decomposed syllable
        or 0xD7B0 <= char <= 0xD7FF
        or char == 0x200D
        or 0xFE00 <= char <= 0xFE0F  # variation selectors
        or 0x1F3FB <= char <= 0x1F3FF  # skin-tone modifiers
        or 0xE0020 <= char <= 0xE007F  # tag characters (subdivision flags)
        or 0xE0100 <= char <= 0xE01EF
    )


# -- pickling -----------------------------------------------------------------------------------

# Chunkers rebuilt in this process from a pickle, by what they were built from: a parse worker
# process builds each distinct one once, however many documents it parses.
_REBUILT: dict[tuple[ChunkingPolicy, str, str], Chunker] = {}
_REBUILT_MAX = 4


def _rebuild_chunker(policy: ChunkingPolicy, kind: str, source: str) -> Chunker:
    key = (policy, kind, source if kind != "json" else _content_sha256(source))
    chunker = _REBUILT.get(key)
    if chunker is not None:
        return chunker
    if kind == "path":
        chunker = Chunker.for_model_dir(policy, Path(source).parent)
    elif kind == "json":
        chunker = Chunker(policy, Tokenizer.from_str(source))
    else:
        chunker = Chunker(policy)
    if len(_REBUILT) >= _REBUILT_MAX:
        _REBUILT.pop(next(iter(_REBUILT)))
    _REBUILT[key] = chunker
    return chunker
