"""``ingest --sync`` on real PostgreSQL, real files and the folder store: which documents a sync
deletes (gone files under the folder's key prefix), which it keeps, and when it refuses."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from trioindex.db.models import ensure_model
from trioindex.db.pool import Database
from trioindex.ingest import DeletedDocument, IngestEntry, SyncRefused, ingest_paths
from trioindex.storage import AsyncObjectStore, FolderStore


@pytest.fixture
def store(tmp_path: Path) -> AsyncObjectStore:
    folder = FolderStore(tmp_path / "blobs")
    folder.ensure_ready()
    return AsyncObjectStore(folder, trio.CapacityLimiter(4))


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The current folder: keys are paths relative to it."""
    root = tmp_path / "work"
    root.mkdir()
    monkeypatch.chdir(root)
    return root


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


async def _ingest(
    db: Database, store: AsyncObjectStore, *paths: Path, **options: object
) -> list[IngestEntry]:
    model = await db.run(ensure_model, "m", 4)
    with trio.fail_after(30):
        return await ingest_paths(
            list(paths), db=db, store=store, model_id=model.id, max_attempts=3, **options
        )


def _keys(db: Database) -> list[str]:
    with db.connection() as conn:
        rows = conn.execute("SELECT external_key FROM documents ORDER BY 1").fetchall()
    return [row["external_key"] for row in rows]


def _blobs(tmp_path: Path) -> int:
    blobs = (tmp_path / "blobs").rglob("*")
    return sum(1 for p in blobs if p.is_file() and not p.name.startswith("."))


async def test_sync_deletes_only_documents_under_the_folder_prefix_whose_files_are_gone(
    db: Database, store: AsyncObjectStore, work: Path, tmp_path: Path
) -> None:
    _write(work / "docs" / "a.txt", "alpha")
    _write(work / "docs" / "sub" / "b.md", "beta")
    _write(work / "docs" / "sub" / "c.txt", "gamma")
    _write(work / "docs-old" / "d.txt", "delta")  # shares the "docs" text, not the "docs/" prefix
    _write(work / "other" / "e.txt", "epsilon")
    await _ingest(db, store, work / "docs", work / "docs-old", work / "other")
    assert _blobs(tmp_path) == 5

    (work / "docs" / "sub" / "b.md").unlink()
    (work / "docs" / "sub" / "c.txt").unlink()
    _write(work / "docs" / "a.txt", "alpha, edited")
    _write(work / "docs" / "new.txt", "new")
    plain = await _ingest(db, store, work / "docs")
    assert not [e for e in plain if isinstance(e, DeletedDocument)]  # without sync: nothing
    assert len(_keys(db)) == 6

    synced = await _ingest(db, store, work / "docs", sync=True)
    assert [(e.document_key, e.status, e.change) for e in synced] == [
        ("docs/a.txt", "unchanged", "unchanged"),
        ("docs/new.txt", "unchanged", "unchanged"),
        ("docs/sub/b.md", "deleted", "deleted"),
        ("docs/sub/c.txt", "deleted", "deleted"),
    ]
    assert _keys(db) == ["docs-old/d.txt", "docs/a.txt", "docs/new.txt", "other/e.txt"]
    assert _blobs(tmp_path) == 5 + 2 - 2  # + the edit and the new file - the two deleted
    again = await _ingest(db, store, work / "docs", sync=True)
    assert {e.status for e in again} == {"unchanged"}


async def test_ingest_reports_added_and_changed(
    db: Database, store: AsyncObjectStore, work: Path
) -> None:
    _write(work / "docs" / "a.txt", "alpha")
    first = await _ingest(db, store, work / "docs", sync=True)
    _write(work / "docs" / "a.txt", "alpha, edited")
    _write(work / "docs" / "b.txt", "beta")
    second = await _ingest(db, store, work / "docs", sync=True)
    assert [(e.document_key, e.change) for e in first + second] == [
        ("docs/a.txt", "added"),
        ("docs/a.txt", "changed"),
        ("docs/b.txt", "added"),
    ]


async def test_sync_keeps_what_the_walk_found_but_did_not_ingest(
    db: Database, store: AsyncObjectStore, work: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    _write(outside / "x.txt", "outside file")
    _write(outside / "sub" / "y.txt", "outside folder")
    _write(work / "docs" / "a.txt", "alpha")
    (work / "docs" / "link.txt").symlink_to(outside / "x.txt")
    (work / "docs" / "linked").symlink_to(outside / "sub")
    await _ingest(db, store, work / "docs", follow_symlinks=True)
    assert _keys(db) == ["docs/a.txt", "docs/link.txt", "docs/linked/y.txt"]

    # without --follow-symlinks both links are skipped: their files exist, so they stay
    synced = await _ingest(db, store, work / "docs", sync=True)
    assert {(e.document_key, e.status) for e in synced} == {
        ("docs/a.txt", "unchanged"),
        ("docs/link.txt", "skipped"),
        ("docs/linked", "skipped"),
    }
    assert _keys(db) == ["docs/a.txt", "docs/link.txt", "docs/linked/y.txt"]


async def test_sync_deletes_nothing_when_part_of_the_walk_has_no_key(
    db: Database, store: AsyncObjectStore, work: Path
) -> None:
    _write(work / "docs" / "a.txt", "alpha")
    _write(work / "docs" / "b.txt", "beta")
    await _ingest(db, store, work / "docs")
    (work / "docs" / "b.txt").unlink()
    fd = os.open(os.fsencode(work / "docs") + b"/bad\xff.txt", os.O_WRONLY | os.O_CREAT)
    os.close(fd)

    synced = await _ingest(db, store, work / "docs", sync=True)
    assert [(e.document_key, e.status) for e in synced] == [
        ("docs/a.txt", "unchanged"),
        (None, "error"),
        (None, "skipped"),
    ]
    assert "--sync deleted nothing" in synced[-1].reason
    assert _keys(db) == ["docs/a.txt", "docs/b.txt"]


async def test_sync_of_a_folder_outside_the_current_one_needs_a_prefix(
    db: Database, store: AsyncObjectStore, work: Path, tmp_path: Path
) -> None:
    _write(work / "mine.txt", "keyed from the current folder")
    await _ingest(db, store, work / "mine.txt")
    _write(tmp_path / "elsewhere" / "a.txt", "alpha")
    with pytest.raises(SyncRefused, match="--as"):
        await _ingest(db, store, tmp_path / "elsewhere", sync=True)
    assert _keys(db) == ["mine.txt"]  # nothing ingested, nothing deleted

    synced = await _ingest(db, store, tmp_path / "elsewhere", sync=True, key_as="ext")
    assert [(e.document_key, e.status) for e in synced] == [("ext/a.txt", "created")]
    assert _keys(db) == ["ext/a.txt", "mine.txt"]


async def test_sync_of_the_current_folder_covers_every_key(
    db: Database, store: AsyncObjectStore, work: Path
) -> None:
    _write(work / "a.txt", "alpha")
    _write(work / "sub" / "b.txt", "beta")
    await _ingest(db, store, Path("."))
    (work / "sub" / "b.txt").unlink()
    synced = await _ingest(db, store, Path("."), sync=True)
    assert [(e.document_key, e.status) for e in synced] == [
        ("a.txt", "unchanged"),
        ("sub/b.txt", "deleted"),
    ]
    assert _keys(db) == ["a.txt"]


async def test_sync_keeps_a_document_whose_file_the_walk_leaves_out(
    db: Database, store: AsyncObjectStore, work: Path
) -> None:
    """A dot-file ingested by name is not walked by a folder ingest, yet its file exists: the
    sync must not call it gone (it used to delete it)."""
    _write(work / "docs" / ".notes.md", "hidden but here")
    _write(work / "docs" / "a.txt", "alpha")
    await _ingest(db, store, work / "docs" / ".notes.md")
    entries = await _ingest(db, store, work / "docs", sync=True)
    assert not [e for e in entries if isinstance(e, DeletedDocument)]
    assert _keys(db) == ["docs/.notes.md", "docs/a.txt"]
    (work / "docs" / ".notes.md").unlink()  # now it is gone: the next sync deletes it
    entries = await _ingest(db, store, work / "docs", sync=True)
    assert [e.document_key for e in entries if isinstance(e, DeletedDocument)] == ["docs/.notes.md"]


async def test_sync_keeps_a_document_another_ingest_added_while_it_ran(
    db: Database, store: AsyncObjectStore, work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forced order: right after the sync's walk, another writer registers docs/new.md (an
    application's own enqueue: no file under docs/). The sync must keep it: it is newer than
    the walk (it used to be deleted as 'gone')."""
    import trioindex.ingest as ingest_module
    from testkit.jobs import enqueue_text

    _write(work / "docs" / "a.txt", "alpha")
    await _ingest(db, store, work / "docs")
    walk = ingest_module.discover

    def walk_then_someone_ingests(*args: object, **kwargs: object) -> object:
        found = walk(*args, **kwargs)  # type: ignore[arg-type]
        with db.connection() as conn:
            model = conn.execute("SELECT id FROM embedding_models").fetchone()
            assert model is not None
            enqueue_text(conn, model["id"], "docs/new.md", b"new", max_attempts=3)
        return found

    monkeypatch.setattr(ingest_module, "discover", walk_then_someone_ingests)
    entries = await _ingest(db, store, work / "docs", sync=True)
    assert not [e for e in entries if isinstance(e, DeletedDocument)]
    assert _keys(db) == ["docs/a.txt", "docs/new.md"]
