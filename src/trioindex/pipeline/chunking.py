"""Chunking: extracted text in, ordered chunk drafts with offsets, token counts and hashes out.

Owns the pure second half of the parse step: :class:`Chunker`, which cuts the text and runs
the passes below. Beside it, each with one owner: :mod:`~trioindex.pipeline.chunk_values` (the
policy it takes, the drafts it gives), :mod:`~trioindex.pipeline.text_cuts` (where text may be
cut), :mod:`~trioindex.pipeline.token_counts` (a model's token counts, and bounds without one)
and :mod:`~trioindex.pipeline.chunk_passes` (the fragment and overlap passes).

Splitting is delegated to ``semantic-text-splitter`` (Rust, Unicode-aware): it cuts at the
largest semantic unit that fits — runs of newlines (paragraphs) first, then sentences, words,
grapheme clusters and only then single characters — so Korean syllables stay whole and ``다.`` /
``?`` / ``!`` end sentences. Two measures:

* **tokens**, when the embedding model's ``tokenizers.Tokenizer`` is given: no chunk, counted
  as the model counts it (special tokens such as ``[CLS]``/``[SEP]`` included), exceeds
  ``policy.max_size``. The splitter counts without special tokens, so it is given
  ``max_size - special`` and every chunk is re-counted exactly afterwards; a chunk that still
  does not fit is split again with a smaller budget.
* **characters** (Python ``str`` code points) otherwise; ``token_count`` is then the documented
  estimate :func:`~trioindex.pipeline.chunk_values.estimate_tokens` (UTF-8 bytes / 4, rounded
  up). When the embedding server's input limit is known (``policy.max_input_tokens``), a piece
  also weighs its cautious token count :func:`~trioindex.pipeline.token_counts.token_bound` in
  characters (``max_size / max_input_tokens`` characters per token), and its size is the larger
  of the two: Latin text is cut by characters as before, while a Hangul or CJK piece, whose
  characters are 1-3 tokens each, is cut again (by characters, at its own density) until its
  bound fits the limit.

Two bounds keep any text cheap and every chunk meaningful:

* **segments**: the text is first cut into segments of at most :data:`SEGMENT_CHUNKS` chunks'
  worth of characters, each split on its own, so the cost is linear in the text (why and where
  the cuts fall: :mod:`trioindex.pipeline.text_cuts`); only the passes below may reach across.
* **characters**, also for token-aware chunks: an unknown "word" is one ``[UNK]`` token
  however long it is, so token-aware chunks are capped at :data:`CHARS_PER_TOKEN` characters
  per token of the budget, and longer ones are split again by characters.

Three passes keep every chunk useful for retrieval (tiny chunks rank badly, and a title cut
off from its text takes its words out of the text's vector):

* **headings stay with their text**: a block of at most
  :data:`~trioindex.pipeline.text_cuts.HEADING_LINES` short lines (at most :data:`HEADING_CHARS`
  characters, a quarter of the chunk size for small ones, and not ending a sentence) that starts
  the text or follows a blank line, and is followed by a line of body text, is given to the
  splitter joined to that text by spaces (a same-length copy of the text, so offsets hold): the
  title becomes the start of the first sentence of its section, and the first chunk of the
  section starts with it;
* **no fragments**: a chunk under :data:`~trioindex.pipeline.chunk_passes.FRAGMENT_FRACTION` of
  the size limit is merged with its smaller neighbour when the two fit in one chunk, else the
  two are cut again at the sentence (else word) boundary that balances them best;
* **overlap at word boundaries**: chunks are first cut without overlap (at the size limit
  minus the overlap), then each one after the first is extended backwards into its
  predecessor by at most ``policy.overlap`` units, starting at a sentence start when one
  lies in reach, else at a word start — whole words of context rather than a fragment, and
  an overlap that exists even when sentences are longer than the overlap (the splitter's own
  overlap works at its current level only and was empty for such text). The overlap is at
  most half of the room for text.

Offsets are Python string indexes into the text given to :meth:`Chunker.chunk`:
``text[start:end] == chunk.text``. semantic-text-splitter 0.33 reports character offsets (not
UTF-8 byte offsets); each one is verified anyway, so a library change cannot silently corrupt
offsets. Chunks are trimmed of surrounding whitespace; neighbours may share up to
``policy.overlap`` units of text. The output is deterministic for a given text and policy.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from semantic_text_splitter import TextSplitter
from tokenizers import Tokenizer

from trioindex.errors import ConfigError, ContentInvalid
from trioindex.pipeline.chunk_passes import ChunkMeasure, merge_fragments, with_overlap
from trioindex.pipeline.chunk_values import (
    ChunkDraft,
    ChunkingPolicy,
    content_sha256,
    estimate_tokens,
)
from trioindex.pipeline.text_cuts import glue_headings, segments
from trioindex.pipeline.token_counts import (
    character_size,
    count_tokens,
    largest_token_bound,
    special_token_count,
)

logger = logging.getLogger(__name__)


# A segment holds at most this many chunks' worth of characters (and at least
# _MIN_SEGMENT): small enough that the splitter's quadratic cost per segment stays a few ms,
# large enough that the chunks packed next to a cut are rarely shorter than they could be.
SEGMENT_CHUNKS = 8
_MIN_SEGMENT = 4096
# Token-aware chunks hold at most this many characters per token of the budget (real text
# averages 2-5): 2048 characters at 256 tokens.
CHARS_PER_TOKEN = 8
# A heading: at most HEADING_LINES lines (text_cuts) of at most this many characters (and a
# quarter of the chunk's character size), none ending a sentence.
HEADING_CHARS = 150
# What the splitter trims from a chunk's ends (Unicode White_Space): Python's whitespace but
# the separators \x1c-\x1f, which the splitter keeps.
_SPLITTER_SPACE = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
    "\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)


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
        # Characters per token of the server's input limit, when it can bind a character chunk.
        self._chars_per_token: float | None = None
        if tokenizer is None:
            limit = policy.max_input_tokens
            if limit is not None and largest_token_bound(policy.max_size) > limit:
                self._chars_per_token = policy.max_size / limit
            self._capacity = policy.max_size
            self._overlap = min(policy.overlap, policy.max_size // 2)
            self._max_chars = policy.max_size
            self._special = 0
            self._splitter = TextSplitter(policy.max_size - self._overlap, trim=True)
            self._segment = max(_MIN_SEGMENT, SEGMENT_CHUNKS * self._max_chars)
            self._heading_chars = min(HEADING_CHARS, self._max_chars // 4)
            return
        # Work on a copy: padding would make every text count as the padded length and
        # truncation would hide overlong chunks; the caller's tokenizer stays as it was.
        self._tokenizer_json = tokenizer.to_str()
        own = Tokenizer.from_str(self._tokenizer_json)
        own.no_padding()
        own.no_truncation()
        special = special_token_count(own)
        capacity = policy.max_size - special
        if capacity < 1:
            raise ValueError(
                f"max_size {policy.max_size} leaves no room next to {special} special tokens"
            )
        self._tokenizer = own
        self._capacity = capacity
        self._special = special
        # The overlap is added after splitting, so the splitter leaves room for it; at most
        # half of the room for text (the budget shrank by the special tokens).
        self._overlap = min(policy.overlap, capacity // 2)
        self._splitter = TextSplitter.from_huggingface_tokenizer(
            own, capacity - self._overlap, trim=True
        )
        self._max_chars = CHARS_PER_TOKEN * policy.max_size
        self._char_splitter = TextSplitter(self._max_chars, trim=True)
        self._segment = max(_MIN_SEGMENT, SEGMENT_CHUNKS * self._max_chars)
        self._heading_chars = min(HEADING_CHARS, self._max_chars // 4)

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
        whole = self._chunk_whole(text)
        return whole if whole is not None else self._chunk_in_full(text)

    def _chunk_whole(self, text: str) -> list[ChunkDraft] | None:
        """The one chunk of a character chunker's non-blank ``text`` that fits whole in the
        splitter's room (its size, token bound included), exactly as :meth:`_chunk_in_full`
        makes it; None when the text may need cutting, or for a token-aware chunker.

        The full path gives such a text one segment and one piece, the text trimmed as the
        splitter trims (:data:`_SPLITTER_SPACE`), which fits the room, so no pass changes it;
        a small document skips the splitter, the heading and the fragment passes.
        """
        if self._tokenizer is not None or len(text) > self._segment:
            return None
        piece = text.strip(_SPLITTER_SPACE)
        if character_size(piece, self._chars_per_token) > self._max_chars - self._overlap:
            return None
        start = len(text) - len(text.lstrip(_SPLITTER_SPACE))
        return [
            ChunkDraft(
                index=0,
                text=piece,
                start=start,
                end=start + len(piece),
                token_count=estimate_tokens(piece),
                content_sha256=content_sha256(piece),
            )
        ]

    def _chunk_in_full(self, text: str) -> list[ChunkDraft]:
        """Chunks of non-blank ``text``: segments, splitter, fitting and the passes."""
        shadow = glue_headings(text, self._heading_chars)
        spans = [
            span
            for lo, hi in segments(shadow, self._segment)
            for span in self._split(self._splitter, text, lo, hi, shadow)
        ]
        del shadow
        if self._tokenizer is None:
            spans = self._fit_token_bound(text, spans)
            counted = [
                (start, piece, character_size(piece, self._chars_per_token))
                for start, piece in spans
            ]
        else:
            spans = self._cap_characters(text, spans)
            counted = self._fit_tokens(self._tokenizer, text, spans)
        del spans
        measure = ChunkMeasure(
            self.policy.max_size, self._max_chars, self._tokenizer, self._chars_per_token
        )
        counted = merge_fragments(text, counted, measure)
        counted = with_overlap(text, counted, measure, self._overlap)
        if self._tokenizer is None:
            counted = [(start, piece, estimate_tokens(piece)) for start, piece, _ in counted]
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
                    content_sha256=content_sha256(piece),
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

    def _fit_token_bound(self, text: str, spans: list[tuple[int, str]]) -> list[tuple[int, str]]:
        """Split again, by characters, every character span whose size (token bound included)
        is over the room the splitter had; each piece at its own density, until it fits."""
        if self._chars_per_token is None:
            return spans
        room = self._max_chars - self._overlap
        fitted: list[tuple[int, str]] = []
        for span in spans:
            todo = [span]
            while todo:
                start, piece = todo.pop()
                size = character_size(piece, self._chars_per_token)
                if size <= room or len(piece) < 2:
                    fitted.append((start, piece))
                    continue
                capacity = max(1, min(len(piece) - 1, len(piece) * room // size))
                pieces = self._split(
                    TextSplitter(capacity, trim=True), text, start, start + len(piece)
                )
                if len(pieces) < 2:  # one grapheme cluster longer than the capacity
                    fitted.append((start, piece))
                    continue
                todo.extend(reversed(pieces))
        return fitted

    @staticmethod
    def _split(
        splitter: TextSplitter, text: str, lo: int, hi: int, shadow: str | None = None
    ) -> list[tuple[int, str]]:
        """``(start, piece)`` for each cut of ``text[lo:hi]``, ``start`` an offset into ``text``.

        ``shadow`` (same length as ``text``, whitespace changed only) is what the splitter sees
        instead (see :func:`glue_headings`); the pieces are cut from ``text``.
        """
        seen = text if shadow is None else shadow
        segment = seen if (lo, hi) == (0, len(seen)) else seen[lo:hi]
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
            at = lo + offset
            spans.append((at, piece if shadow is None else text[at : at + len(piece)]))
            search_from = offset + 1
        return spans

    def _fit_tokens(
        self, tokenizer: Tokenizer, text: str, spans: Sequence[tuple[int, str]]
    ) -> list[tuple[int, str, int]]:
        """Exact model token counts; re-split any span the model would see as too long."""
        limit = self.policy.max_size
        result: list[tuple[int, str, int]] = []
        counts = count_tokens(tokenizer, [piece for _, piece in spans])
        for (start, piece), count in zip(spans, counts, strict=True):
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
            counts = count_tokens(tokenizer, [p for _, p in pieces])
            worst = max(counts, default=0)
            if worst <= limit:
                return [(s, p, c) for (s, p), c in zip(pieces, counts, strict=True)]
            capacity -= max(1, worst - limit)
            if capacity < 1:
                raise ContentInvalid(
                    "text cannot be split to fit the embedding model's input limit"
                )


# -- pickling -----------------------------------------------------------------------------------

# Chunkers rebuilt in this process from a pickle, by what they were built from: a parse worker
# process builds each distinct one once, however many documents it parses.
_REBUILT: dict[tuple[ChunkingPolicy, str, str], Chunker] = {}
_REBUILT_MAX = 4


def _rebuild_chunker(policy: ChunkingPolicy, kind: str, source: str) -> Chunker:
    key = (policy, kind, source if kind != "json" else content_sha256(source))
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
