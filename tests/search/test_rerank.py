"""The re-ranker against testkit's fake TEI ``/rerank`` server: the top N re-ordered by its
scores and the rest after them, and every failure (no answer in time, an error status, an
answer that is not one score per text) leaving the fused order, with one log line that holds
neither the query nor a chunk's text."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator

import pytest
import trio

from testkit.rerank_server import FakeRerankServer, fake_score
from trioindex.search import RankedChunk
from trioindex.search.rerank import Reranker

QUERY = "secret lease renewal"
TEXTS = ["nothing here", "renewal only", "lease renewal secret", "the lease", "lease renewal"]


def chunks() -> list[RankedChunk]:
    doc = uuid.uuid4()
    return [
        RankedChunk(uuid.uuid4(), 1.0 / (60 + i), f"d{i}", doc, 1, None, i, text)
        for i, text in enumerate(TEXTS)
    ]


@pytest.fixture
def server() -> Iterator[FakeRerankServer]:
    with FakeRerankServer() as fake:
        yield fake


async def test_the_top_n_are_reordered_by_the_rerankers_scores(server: FakeRerankServer) -> None:
    fused = chunks()
    reranker = Reranker(server.url, top_n=4, timeout=60.0)
    try:
        ranked = await reranker.rerank(QUERY, fused)
    finally:
        await reranker.aclose()
    assert server.requests == [4]  # the top 4 only
    assert [c.document_key for c in ranked] == ["d2", "d1", "d3", "d0", "d4"]
    assert ranked[0].score == pytest.approx(fake_score(QUERY, TEXTS[2]))
    # the one past the top N keeps its place and scores no higher than the last re-ranked
    assert ranked[4].score <= ranked[3].score and reranker.fallbacks == 0


@pytest.mark.parametrize(
    ("mode", "why"),
    [
        ("hang", "no answer in 2s"),
        ("status_503", "HTTP 503"),
        ("status_413", "HTTP 413"),
        ("malformed", "not one score per text"),
        ("short", "not one score per text"),
    ],
)
async def test_a_failing_reranker_leaves_the_fused_order(
    server: FakeRerankServer, mode: str, why: str, request: pytest.FixtureRequest,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    if mode == "hang":  # the timeout passes on the virtual clock, at once
        request.getfixturevalue("autojump_clock")
    server.set_mode(mode)
    fused = chunks()
    # a real answer comes well within 60 s; the hanging server is timed out at 2 s
    reranker = Reranker(server.url, top_n=10, timeout=2.0 if mode == "hang" else 60.0)
    try:
        with trio.fail_after(120):
            ranked = await reranker.rerank(QUERY, fused)
    finally:
        server.set_mode("normal")
        await reranker.aclose()
    assert ranked == fused and reranker.fallbacks == 1
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "fused order kept" in line and why in line
    assert "lease" not in line and "secret" not in line and "nothing" not in line


async def test_nothing_to_reorder_sends_nothing(server: FakeRerankServer) -> None:
    reranker = Reranker(server.url)
    try:
        assert await reranker.rerank(QUERY, []) == []
        one = chunks()[:1]
        assert await reranker.rerank(QUERY, one) == one
    finally:
        await reranker.aclose()
    assert server.requests == []
    with pytest.raises(ValueError, match="top_n"):
        Reranker(server.url, top_n=0)
