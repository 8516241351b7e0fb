"""A scan that OCR reads with low confidence is indexed and marked: the version's
``ocr_low_confidence_pages``, an ``OCR_LOW_CONFIDENCE`` event, and the field and filter of
the documents listing and of search. Real PostgreSQL, a real folder store, the worker's own steps; the scans are
the Korean fixture rendered by PDFium (tests/pipeline/test_formats_ocr.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from testkit.embed_server import FakeEmbedServer
from testkit.processes import FAST_WORKER, base_env, cli
from tests import helpers
from tests.pipeline.test_formats_ocr import needs_tesseract, scanned_pages
from tests.pipeline.test_parse_step import TEXT, _claim, _parsed, _steps, store  # noqa: F401
from trioindex.config import default_settings, load_settings
from trioindex.db.operations.document_views import list_documents, show_document
from trioindex.db.pool import Database
from trioindex.db.search import DEFAULT_HNSW, Filters, nearest_chunks
from trioindex.db.steps import ChunkCommit, store_chunks_many
from trioindex.errors import ConfigError
from trioindex.pipeline.formats.ocr import DEFAULT_OCR
from trioindex.search.results import document_hits, ranked_chunks
from trioindex.storage import AsyncObjectStore
from trioindex.values import Claim, CompleteResult


def _marks(db: Database, claim: Claim) -> tuple[Any, list[dict[str, Any]]]:
    """The version's marked pages and the OCR_LOW_CONFIDENCE events' details."""
    with db.connection() as conn:
        row = conn.execute(
            "SELECT ocr_low_confidence_pages FROM document_versions WHERE id = %s",
            (claim.document_version_id,),
        ).fetchone()
        events = conn.execute(
            """SELECT detail FROM indexing_events
               WHERE document_version_id = %s AND event_type = 'OCR_LOW_CONFIDENCE'""",
            (claim.document_version_id,),
        ).fetchall()
    assert row is not None
    return row["ocr_low_confidence_pages"], [dict(e["detail"]) for e in events]


def _listed(db: Database, low_confidence: bool | None) -> list[str]:
    with db.connection() as conn:
        page = list_documents(conn, low_confidence=low_confidence)
    return [d.key for d in page.documents]


@needs_tesseract
async def test_a_low_confidence_scan_is_indexed_served_and_marked(
    db: Database,
    store: AsyncObjectStore,  # noqa: F811
) -> None:
    scan = _claim(db, store, scanned_pages()[1], "scan.png")
    text = _claim(db, store, TEXT, "notes.txt")
    # a threshold no page reaches: every page read is of low confidence
    steps = attrs.evolve(_steps(db, store), ocr_low_confidence=100.0)
    with trio.fail_after(120):
        *_, scanned = await helpers.run_claim(steps, scan)
        *_, plain = await helpers.run_claim(steps, text)
    assert scanned == plain == CompleteResult(became_current=True)
    assert _marks(db, scan) == ([1], [{"pages": [1]}])
    assert _marks(db, text) == (None, [])
    with db.connection() as conn:
        assert helpers.serves(conn, scan)  # searchable all the same
        # the mark is an event (an operator reviews it); the steps are on the attempt
        assert helpers.events(conn, scan.job_id)[-2:] == ["OCR_LOW_CONFIDENCE", "JOB_SUCCEEDED"]
        assert helpers.steps(conn, scan.job_id) == list(helpers.ATTEMPT_STEPS)
        (version,) = show_document(conn, "scan.png").versions
        assert version.low_confidence_pages == (1,) and version.low_confidence
        (version,) = show_document(conn, "notes.txt").versions
        assert version.low_confidence_pages == () and not version.low_confidence
    assert _listed(db, True) == ["scan.png"]
    assert _listed(db, False) == ["notes.txt"]
    assert _listed(db, None) == ["notes.txt", "scan.png"]
    assert _found(db, True) == {"scan.png": (1,)}
    assert _found(db, False) == {"notes.txt": ()}
    assert _found(db, None) == {"scan.png": (1,), "notes.txt": ()}


def _found(db: Database, low_confidence: bool | None) -> dict[str, tuple[int, ...]]:
    """The documents a search returns under the filter, with their hits' marked pages."""
    with db.connection() as conn:
        rows = nearest_chunks(
            conn,
            helpers.model(conn),
            [1.0, 0.0, 0.0, 0.0],
            100,
            filters=Filters(low_confidence=low_confidence),
            hnsw=DEFAULT_HNSW,
        )
    hits = document_hits(ranked_chunks(rows), top_k=10, chunks_per_document=1)
    return {hit.document_key: hit.low_confidence_pages for hit in hits}


@needs_tesseract
async def test_a_clear_scan_at_the_default_threshold_is_not_marked(
    db: Database,
    store: AsyncObjectStore,  # noqa: F811
) -> None:
    scan = _claim(db, store, scanned_pages()[0], "scan.png")
    with trio.fail_after(120):
        await helpers.run_claim(_steps(db, store), scan)
    assert _marks(db, scan) == (None, [])


def test_the_chunk_commit_marks_the_version_once_with_its_pages(
    db: Database,
    store: AsyncObjectStore,  # noqa: F811
) -> None:
    claim = _claim(db, store, TEXT)
    snapshot = claim.parse
    assert snapshot is not None
    commit = ChunkCommit(claim, snapshot, _parsed(snapshot), low_confidence_pages=(2, 5))
    with db.connection() as conn:
        store_chunks_many(conn, [commit])
        # a repeated commit finds the set stored and writes nothing: no second event
        store_chunks_many(conn, [commit])
    assert _marks(db, claim) == ([2, 5], [{"pages": [2, 5]}])


def test_indexing_parsing_ocr_low_confidence_is_a_bounded_setting() -> None:
    assert default_settings().parsing.ocr_low_confidence == DEFAULT_OCR.low_confidence == 60
    environ = {"TRIOINDEX_PARSING_OCR_LOW_CONFIDENCE": "75"}
    assert load_settings(environ=environ).parsing.ocr_low_confidence == 75
    with pytest.raises(ConfigError, match="ocr-low-confidence"):
        load_settings(environ={"TRIOINDEX_PARSING_OCR_LOW_CONFIDENCE": "101"})


@needs_tesseract
@pytest.mark.slow
def test_the_setting_reaches_a_worker_and_documents_list_shows_the_mark(
    database_url: str, tmp_path: Path
) -> None:
    """``TRIOINDEX_PARSING_OCR_LOW_CONFIDENCE`` -> ``worker --drain`` -> ``documents list``."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "scan.png").write_bytes(scanned_pages()[1])
    with FakeEmbedServer() as server:
        env = base_env(
            TRIOINDEX_DATABASE_URL=database_url,
            TRIOINDEX_STORAGE_URL=(tmp_path / "blobs").as_uri(),
            TRIOINDEX_EMBEDDING_API="tei",
            TRIOINDEX_EMBEDDING_URL=server.url,
            TRIOINDEX_EMBEDDING_MODEL="BAAI/bge-m3",
            TRIOINDEX_EMBEDDING_DIMENSION="1024",
            TRIOINDEX_HOME=str(tmp_path / "home"),
            TRIOINDEX_PARSING_OCR_LOW_CONFIDENCE="100",
            **FAST_WORKER,
        )
        assert cli(env, "ingest", str(docs)).returncode == 0
        worked = cli(env, "worker", "--drain", timeout=300)
        assert worked.returncode == 0, worked.stderr[-2000:]
    listed = cli(env, "documents", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    (document,) = json.loads(listed.stdout)
    (version,) = document["versions"]
    assert version["low_confidence_pages"] == [1]
    assert version["models"][0]["job_status"] == "SUCCEEDED"
