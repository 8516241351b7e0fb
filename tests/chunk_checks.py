"""What every chunking must satisfy, shared by tests/pipeline/test_chunking.py and the property tests."""

from __future__ import annotations

import hashlib
import itertools

from trioindex.pipeline.chunk_values import ChunkDraft, ChunkingPolicy, estimate_tokens

# Unicode White_Space, what the splitter trims (Python's isspace adds \x1c-\x1f).
WHITE_SPACE = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680"
    + "".join(map(chr, range(0x2000, 0x200B)))
    + ("\u2028\u2029\u202f\u205f\u3000")
)


def assert_chunk_invariants(chunks: list[ChunkDraft], source: str, policy: ChunkingPolicy) -> None:
    """What every chunking must satisfy, whatever the text."""
    assert [c.index for c in chunks] == list(range(len(chunks)))
    assert (chunks == []) == (source.strip() == "")
    for chunk in chunks:
        assert chunk.text == source[chunk.start : chunk.end]
        assert chunk.text == chunk.text.strip(WHITE_SPACE), "chunks are trimmed"
        assert chunk.text.strip(), "no blank chunk"
        assert chunk.content_sha256 == hashlib.sha256(chunk.text.encode("utf-8")).hexdigest()
        assert chunk.token_count > 0
    for before, after in itertools.pairwise(chunks):
        assert before.start < after.start
        assert before.end < after.end
    # Nothing but whitespace is ever left out.
    covered = bytearray(len(source))
    for chunk in chunks:
        covered[chunk.start : chunk.end] = b"\x01" * (chunk.end - chunk.start)
    assert all(covered[i] or ch.isspace() for i, ch in enumerate(source))


def assert_character_limits(chunks: list[ChunkDraft], policy: ChunkingPolicy) -> None:
    for chunk in chunks:
        assert len(chunk.text) <= policy.max_size
        assert chunk.token_count == estimate_tokens(chunk.text)
    for before, after in itertools.pairwise(chunks):
        assert max(0, before.end - after.start) <= policy.overlap
