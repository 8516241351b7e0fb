"""The Python API (trioindex.Index, trioindex.connect) on a real PostgreSQL + pgvector and an HTTP
(TEI) embedding server, and the README's examples run as written against a running worker.

The fake server's vectors carry no meaning (a hash of the text), so a query that is a stored
chunk's own text finds that chunk with cosine 1; full-text ranking is real.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import trioindex
from testkit.documents import write_corpus
from testkit.embed_server import FakeEmbedServer, fake_vector
from testkit.processes import FAST_WORKER, REPO_ROOT, base_env, spawn
from testkit.search_corpus import IndexedDocument, store_indexed
from trioindex.config import Settings, load_settings
from trioindex.db.models import ensure_model
from trioindex.db.pool import Database
from trioindex.errors import ConfigError
from trioindex.search.ranking import HYBRID_K, HYBRID_TEXT_WEIGHT

MODEL, DIM = "BAAI/bge-m3", 1024

QUEUE = [
    "Workers claim jobs from PostgreSQL with FOR UPDATE SKIP LOCKED.",
    "Each claimed job runs in its own nursery beside its lease renewal.",
    "A worker that dies loses nothing: its lease expires and another worker takes the job.",
]
LEASE = ["The lease is renewed on absolute deadlines.", "Renewal stops last."]
KOREAN = ["작업자는 큐에서 작업을 가져옵니다.", "임대는 주기적으로 갱신됩니다."]


@pytest.fixture
def env(database_url: str, embed_server: FakeEmbedServer, tmp_path: Path) -> dict[str, str]:
    return base_env(
        TRIOINDEX_DATABASE_URL=database_url,
        TRIOINDEX_EMBEDDING_API="tei",
        TRIOINDEX_EMBEDDING_URL=embed_server.url,
        TRIOINDEX_EMBEDDING_MODEL=MODEL,
        TRIOINDEX_EMBEDDING_DIMENSION=str(DIM),
        TRIOINDEX_HOME=str(tmp_path / "home"),
        **FAST_WORKER,
    )


@pytest.fixture
def settings(env: dict[str, str], tmp_path: Path) -> Settings:
    return load_settings(environ=env, cwd=tmp_path)


@pytest.fixture
def stored(db: Database) -> None:
    """Three documents indexed with the fake server's vectors for their chunks."""
    docs = [
        IndexedDocument(
            "docs/queue.md", QUEUE, [fake_vector(t, DIM) for t in QUEUE], "text/markdown"
        ),
        IndexedDocument("docs/lease.txt", LEASE, [fake_vector(t, DIM) for t in LEASE]),
        IndexedDocument("ko/korean.txt", KOREAN, [fake_vector(t, DIM) for t in KOREAN]),
    ]
    with db.connection() as conn:
        store_indexed(conn, ensure_model(conn, MODEL, DIM), docs)


async def test_search_returns_documents_with_their_best_chunks(
    settings: Settings, stored: None
) -> None:
    async with trioindex.Index.open(settings) as index:
        [hit, *others] = await index.search(QUEUE[1], mode="vector")
        assert (hit.rank, hit.document_key, hit.version_no) == (1, "docs/queue.md", 1)
        assert hit.content_type == "text/markdown"
        assert hit.score == pytest.approx(1.0, abs=1e-5)
        assert hit.chunks[0].chunk_index == 1
        assert [c.chunk_index for c in hit.chunks[1:]] in ([0, 2], [2, 0])
        assert [o.rank for o in others] == [2, 3]
        assert {o.document_key for o in others} == {"docs/lease.txt", "ko/korean.txt"}
        # one document per hit, however many of its chunks rank high
        chunks = await index.search_chunks(QUEUE[1], mode="vector", top_k=7)
        assert [c.rank for c in chunks] == list(range(1, 8))
        assert sum(c.document_key == "docs/queue.md" for c in chunks) == 3


async def test_modes_and_filters(settings: Settings, stored: None) -> None:
    async with trioindex.Index.open(settings) as index:
        # full-text: "lease renewal" matches both documents that talk about leases, the one
        # with both words (stemmed: renewed, renewal) first
        hits = await index.search("lease renewal", mode="text")
        assert [h.document_key for h in hits] == ["docs/lease.txt", "docs/queue.md"]
        assert [c.chunk_index for c in hits[0].chunks] == [0, 1]
        # hybrid: the chunk that is the query wins both rankings
        [best, *_] = await index.search(LEASE[0], mode="hybrid")
        assert (best.document_key, best.chunks[0].chunk_index) == ("docs/lease.txt", 0)
        # first in both: 1 / (k + 1) from the vector ranking, the text weight's share from text
        assert best.score == pytest.approx((1 + HYBRID_TEXT_WEIGHT) / (HYBRID_K + 1))
        # Korean words match with another particle
        [ko] = await index.search("임대가 갱신", mode="text")
        assert (ko.document_key, ko.chunks[0].chunk_index) == ("ko/korean.txt", 1)
        # filters
        assert [
            h.document_key for h in await index.search("lease", mode="text", key_prefix="docs/l")
        ] == ["docs/lease.txt"]
        found = await index.search(QUEUE[0], mode="vector", content_types=["text/plain"])
        assert {h.document_key for h in found} == {"docs/lease.txt", "ko/korean.txt"}


async def test_search_many_embeds_the_queries_together(
    settings: Settings, stored: None, embed_server: FakeEmbedServer
) -> None:
    queries = QUEUE + LEASE + KOREAN
    async with trioindex.Index.open(settings) as index:
        embed_server.reset_stats()
        answers = await index.search_many(queries, mode="vector", top_k=1)
        assert embed_server.stats().embed_requests == 1
        assert embed_server.stats().inputs == len(queries)
    assert [hits[0].chunks[0].text for hits in answers] == queries


async def test_a_text_search_never_opens_the_embedder(
    settings: Settings, stored: None, embed_server: FakeEmbedServer
) -> None:
    embed_server.reset_stats()
    async with trioindex.Index.open(settings) as index:
        assert await index.search("skip locked", mode="text")
    assert embed_server.stats().requests == 0


async def test_delete_takes_documents_out_of_search(settings: Settings, stored: None) -> None:
    async with trioindex.Index.open(settings) as index:
        report = await index.delete(["docs/lease.txt", "nope.txt"])
        assert (report.deleted, report.missing) == (("docs/lease.txt",), ("nope.txt",))
        hits = await index.search("lease renewal", mode="text")
        assert [h.document_key for h in hits] == ["docs/queue.md"]
        await index.delete(prefix="docs/")
        hits = await index.search("lease renewal", mode="hybrid")
        assert [h.document_key for h in hits] == ["ko/korean.txt"]  # by vector only


def test_connect_serves_synchronous_code_from_one_loop(settings: Settings, stored: None) -> None:
    with trioindex.connect(settings) as index:
        first = index.search(LEASE[1], mode="vector", top_k=1)
        second = index.search_chunks("nursery", mode="text")
        assert index.model.name == MODEL
    assert [h.document_key for h in first] == ["docs/lease.txt"]
    assert [(c.document_key, c.chunk_index) for c in second] == [("docs/queue.md", 1)]
    with pytest.raises(RuntimeError, match="not open"):
        index.search("anything")


def test_connect_raises_what_opening_raised(settings: Settings, db: Database) -> None:
    with db.connection() as conn:
        ensure_model(conn, "custom/model", 8)
    broken = settings.with_overrides(embedding={"model": "custom/model", "dimension": 16})
    with pytest.raises(ConfigError, match="registered with dimension 8"):
        trioindex.connect(broken)


# -- the README's examples ------------------------------------------------------------------------


def readme_python_blocks() -> list[str]:
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("### Search from Python") :]
    section = section[: section.index("\n## ")]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


@pytest.mark.slow
def test_the_readme_examples_run_as_written(env: dict[str, str], tmp_path: Path) -> None:
    blocks = readme_python_blocks()
    assert len(blocks) == 2
    work = tmp_path / "work"
    write_corpus(work / "docs", sentences=3)
    worker = spawn(env, "worker", log=tmp_path / "worker.log")
    try:
        outputs = []
        for block in blocks:
            run = subprocess.run(
                [sys.executable, "-c", block],
                cwd=work, env=env, capture_output=True, text=True, timeout=180, check=False,
            )  # fmt: skip
            assert run.returncode == 0, run.stderr[-3000:]
            outputs.append(run.stdout)
    finally:
        worker.send_signal(signal.SIGINT)
        worker.wait(timeout=30)
    sync_out, trio_out = outputs
    files = len(list((work / "docs").iterdir()))
    assert sync_out.startswith(f"{files} files, 0 failed\n")
    assert re.search(r"^\d\.\d{4} \S+ v1$", sync_out, flags=re.M)
    assert re.search(r"^    #\d+ ", sync_out, flags=re.M)
    lists = trio_out.splitlines()
    assert len(lists) == 3 and all(line.startswith("[") for line in lists)
    assert "lease" in lists[0]
