"""Files that are not documents are skipped at ingest by the parser's own format detection, and
``include`` / ``exclude`` globs choose the files: on real PostgreSQL and the folder store."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from trioindex.db.models import ensure_model
from trioindex.db.pool import Database
from trioindex.ingest import IngestResult, SkippedFile, discover, ingest_paths
from trioindex.ingest.indexable import UNSUPPORTED
from trioindex.pipeline.formats import detect_format
from trioindex.storage import AsyncObjectStore, FolderStore

# bytes no document format reads, whatever formats are added: a program, a database, noise
NOT_DOCUMENTS = {
    "tool": b"\x7fELF\x02\x01\x01\x00" + bytes(200),
    "cache.sqlite": b"SQLite format 3\x00" + bytes(200),
    "noise.bin": bytes(range(256)) * 4,
}


@pytest.fixture
def store(tmp_path: Path) -> AsyncObjectStore:
    blobs = FolderStore(tmp_path / "blobs")
    blobs.ensure_ready()
    return AsyncObjectStore(blobs, trio.CapacityLimiter(4))


def _folder(root: Path) -> Path:
    docs = root / "docs"
    (docs / "drafts").mkdir(parents=True)
    (docs / "a.md").write_text("# A\n\nA document.\n")
    (docs / "b.txt").write_text("Another document.\n")
    (docs / "drafts" / "c.md").write_text("# C\n\nA draft.\n")
    (docs / "broken.pdf").write_text("not a PDF at all")  # a corrupt document: its job says so
    (docs / "empty.txt").write_text("")  # likewise
    for name, data in NOT_DOCUMENTS.items():
        (docs / name).write_bytes(data)
    return docs


async def test_files_of_a_format_not_indexed_are_skipped_before_upload_and_get_no_job(
    db: Database, store: AsyncObjectStore, tmp_path: Path
) -> None:
    docs = _folder(tmp_path)
    model = await db.run(ensure_model, "m", 4)
    entries = await ingest_paths(
        [docs], db=db, store=store, model_id=model.id, max_attempts=3, max_document_bytes=10**6
    )
    skipped = {e.document_key: e.reason for e in entries if isinstance(e, SkippedFile)}
    assert set(skipped) == set(NOT_DOCUMENTS)
    for key, reason in skipped.items():
        # the reason is the detection's own, as the parse step would have failed the job
        try:
            detect_format(NOT_DOCUMENTS[key], key)
        except Exception as exc:
            assert reason == f"not a document trioindex indexes ({exc})", reason
        assert reason.startswith(f"not a document trioindex indexes ({UNSUPPORTED}")
    queued = sorted(e.document_key for e in entries if isinstance(e, IngestResult))
    assert queued == ["a.md", "b.txt", "broken.pdf", "drafts/c.md", "empty.txt"]
    uploaded = [p for p in (tmp_path / "blobs").rglob("*") if not p.name.startswith(".")]
    uploaded = [p for p in uploaded if p.is_file()]
    assert len(uploaded) == len(queued)  # nothing of the skipped files was uploaded
    # without the limit (the check is asked for), nothing is left out
    again = await ingest_paths([docs], db=db, store=store, model_id=model.id, max_attempts=3)
    assert sorted(e.document_key for e in again if isinstance(e, IngestResult)) == sorted(
        queued + list(NOT_DOCUMENTS)
    )


def test_include_and_exclude_choose_files_by_name_or_by_path_below_the_folder(
    tmp_path: Path,
) -> None:
    docs = _folder(tmp_path)

    def keys(**globs: tuple[str, ...]) -> list[str]:
        return [f.document_key for f in discover([docs], **globs).files]

    assert keys(include=("*.md",)) == ["a.md", "drafts/c.md"]
    assert keys(include=("*.md",), exclude=("drafts/*",)) == ["a.md"]
    assert keys(exclude=("*.md", "*.txt", "*.pdf", "noise.*")) == ["cache.sqlite", "tool"]
    # a file named directly: matched by its name
    assert [f.document_key for f in discover([docs / "a.md"], exclude=("*.md",)).files] == []
