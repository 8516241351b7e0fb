"""A small file's format is judged once per parse: the parse step asks first (where to parse
it), and the extraction it runs is given that answer instead of reading the bytes again."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from trioindex.db.steps import ChunkCommit
from trioindex.pipeline import parse_step
from trioindex.pipeline.chunk_values import ChunkingPolicy
from trioindex.pipeline.chunking import Chunker
from trioindex.pipeline.formats import DocumentFormat, detect, extract, extract_text
from trioindex.pipeline.parse_process import ParseRequest, parse_document
from trioindex.values import Claim, ParseSnapshot

CHUNKER = Chunker(ChunkingPolicy(max_size=200, overlap=20))
TEXT = "\n\n".join(f"Paragraph {i}: a worker claims a job and parses it." for i in range(20))
DATA = TEXT.encode()


def _counted(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """Every call of the real ``detect_format``, from the parse step and from the extraction."""
    calls: list[tuple[Any, ...]] = []
    real: Callable[..., DocumentFormat] = detect.detect_format

    def counting(*args: Any) -> DocumentFormat:
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(parse_step, "detect_format", counting)
    monkeypatch.setattr(extract, "detect_format", counting)
    return calls


def _request(detected: DocumentFormat | None, name: str = "notes.md") -> ParseRequest:
    return ParseRequest(
        data=DATA,
        sha256=hashlib.sha256(DATA).hexdigest(),
        name=name,
        content_type=None,
        max_bytes=1_000_000,
        detected=detected,
    )


def test_a_parse_given_the_format_does_not_judge_the_bytes_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _counted(monkeypatch)
    given = parse_document(_request(DocumentFormat.MARKDOWN), CHUNKER)
    assert calls == []
    assert given.format is DocumentFormat.MARKDOWN
    judged = parse_document(_request(None), CHUNKER)
    assert len(calls) == 1
    assert judged.format is DocumentFormat.MARKDOWN
    assert [c.text for c in given.chunks] == [c.text for c in judged.chunks]


def test_the_extraction_reads_the_bytes_as_the_format_it_is_given() -> None:
    # the same bytes under a .txt name are plain text; given MARKDOWN, they are read as such
    as_text = extract_text(DATA, "notes.txt", max_bytes=1_000_000)
    as_given = extract_text(
        DATA, "notes.txt", max_bytes=1_000_000, detected=DocumentFormat.MARKDOWN
    )
    assert as_text.format is DocumentFormat.TEXT
    assert as_given.format is DocumentFormat.MARKDOWN


class _Bytes:
    async def get(self, key: str, *, max_bytes: int) -> bytes:
        return DATA


def _claim(name: str, size: int) -> Claim:
    version = uuid.uuid4()
    return Claim(
        job_id=uuid.uuid4(),
        worker_id=uuid.uuid4(),
        claim_token=uuid.uuid4(),
        document_version_id=version,
        embedding_model_id=uuid.uuid4(),
        attempt_id=uuid.uuid4(),
        attempt_no=1,
        lease_expires_at=datetime.now(UTC),
        chunks_ready=False,
        parse=ParseSnapshot(
            version_id=version,
            document_id=uuid.uuid4(),
            storage_key="k",
            original_name=name,
            content_type=None,
            byte_size=size,
            sha256=hashlib.sha256(DATA).hexdigest(),
        ),
    )


async def test_the_parse_step_judges_a_small_files_format_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _counted(monkeypatch)
    committed: list[ChunkCommit] = []

    async def commit(chunks: ChunkCommit) -> int:
        committed.append(chunks)
        return len(chunks.chunks)

    stored = await parse_step.parse_and_store(
        _claim("notes.md", len(DATA)),
        commit=commit,
        store=_Bytes(),
        chunker=CHUNKER,
        max_bytes=1_000_000,
    )
    assert len(calls) == 1
    expected = CHUNKER.chunk(extract_text(DATA, "notes.md", max_bytes=1_000_000).text)
    assert stored == len(expected)
    assert [c.text for c in committed[0].chunks] == [c.text for c in expected]
