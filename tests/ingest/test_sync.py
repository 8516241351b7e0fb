"""``ingest --sync`` on real PostgreSQL, real files and the folder store: which documents a sync
deletes (gone files the folder holds, under its recorded key root), and which it keeps: another
folder's, a renamed folder's, what the walk could not see."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from trioindex.db.models import ensure_model
from trioindex.db.pool import Database
from trioindex.ingest import DeletedDocument, IngestEntry, ingest_paths
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


def _deleted(entries: list[IngestEntry]) -> list[str]:
    return [e.document_key for e in entries if isinstance(e, DeletedDocument)]


async def test_a_folder_outside_the_current_one_syncs_from_anywhere_by_any_name(
    db: Database,
    store: AsyncObjectStore,
    work: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _write(work / "mine.txt", "keyed from the current folder")
    await _ingest(db, store, work / "mine.txt")
    papers = tmp_path / "papers"
    _write(papers / "a.txt", "alpha")
    _write(papers / "b.txt", "beta")
    first = await _ingest(db, store, papers)  # outside the current folder: keyed from itself
    assert [(e.document_key, e.status) for e in first] == [
        ("a.txt", "created"),
        ("b.txt", "created"),
    ]
    (papers / "b.txt").unlink()
    synced = await _ingest(db, store, papers, sync=True)
    assert _deleted(synced) == ["b.txt"]
    assert _keys(db) == ["a.txt", "mine.txt"]  # mine.txt is not the folder's: kept

    # from the folder's parent (where its relative name would key it "papers/..."), through a
    # link to it, and from inside it: the recorded root, the same keys, no re-keying
    (tmp_path / "link").symlink_to(papers)
    _write(papers / "c.txt", "gamma")
    monkeypatch.chdir(tmp_path)
    again = await _ingest(db, store, Path("papers"), sync=True)
    assert [(e.document_key, e.status) for e in again] == [
        ("a.txt", "unchanged"),
        ("c.txt", "created"),
    ]
    (papers / "c.txt").unlink()
    linked = await _ingest(db, store, Path("link"), sync=True)
    assert _deleted(linked) == ["c.txt"]
    monkeypatch.chdir(papers)
    inside = await _ingest(db, store, Path("."), sync=True)
    assert [(e.document_key, e.status) for e in inside] == [("a.txt", "unchanged")]
    assert _keys(db) == ["a.txt", "mine.txt"]


async def test_two_folders_keyed_into_one_namespace_never_delete_each_others_documents(
    db: Database, store: AsyncObjectStore, work: Path, tmp_path: Path
) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    _write(one / "only-one.txt", "1")
    _write(one / "shared.txt", "shared")
    _write(two / "only-two.txt", "2")
    _write(two / "shared.txt", "shared")
    await _ingest(db, store, one)
    await _ingest(db, store, two)
    assert _keys(db) == ["only-one.txt", "only-two.txt", "shared.txt"]

    # two's sync sees only-one.txt missing under two: not two's, kept
    assert _deleted(await _ingest(db, store, two, sync=True)) == []
    # shared.txt gone from one: two still has it, so one only lets go of it
    (one / "shared.txt").unlink()
    assert _deleted(await _ingest(db, store, one, sync=True)) == []
    assert _keys(db) == ["only-one.txt", "only-two.txt", "shared.txt"]
    # and gone from two as well: two was its last holder
    (two / "shared.txt").unlink()
    assert _deleted(await _ingest(db, store, two, sync=True)) == ["shared.txt"]
    (one / "only-one.txt").unlink()
    assert _deleted(await _ingest(db, store, one, sync=True)) == ["only-one.txt"]
    assert _keys(db) == ["only-two.txt"]


async def test_a_renamed_folder_is_a_new_folder_and_deletes_none_of_the_old_names_documents(
    db: Database, store: AsyncObjectStore, work: Path, tmp_path: Path
) -> None:
    _write(tmp_path / "old" / "a.txt", "alpha")
    _write(tmp_path / "old" / "b.txt", "beta")
    await _ingest(db, store, tmp_path / "old")
    (tmp_path / "old").rename(tmp_path / "new")
    (tmp_path / "new" / "b.txt").unlink()
    synced = await _ingest(db, store, tmp_path / "new", sync=True)
    # b.txt was found only by the old name's ingest: kept (delete it by key)
    assert [(e.document_key, e.status) for e in synced] == [("a.txt", "unchanged")]
    assert _keys(db) == ["a.txt", "b.txt"]
    (tmp_path / "new" / "a.txt").unlink()
    # a.txt is held by the old name too, whose folder is gone: the new name only lets go
    assert _deleted(await _ingest(db, store, tmp_path / "new", sync=True)) == []


async def test_a_folder_keyed_with_as_keeps_its_root_and_its_subfolders_inherit_it(
    db: Database, store: AsyncObjectStore, work: Path, tmp_path: Path
) -> None:
    _write(tmp_path / "ext" / "sub" / "a.txt", "alpha")
    _write(tmp_path / "ext" / "sub" / "b.txt", "beta")
    synced = await _ingest(db, store, tmp_path / "ext", sync=True, key_as="ext")
    assert [e.document_key for e in synced] == ["ext/sub/a.txt", "ext/sub/b.txt"]
    (tmp_path / "ext" / "sub" / "b.txt").unlink()
    # the subfolder alone, without --as: keyed under the root its recorded parent gives it
    sub = await _ingest(db, store, tmp_path / "ext" / "sub", sync=True)
    assert [(e.document_key, e.status) for e in sub] == [
        ("ext/sub/a.txt", "unchanged"),
        ("ext/sub/b.txt", "deleted"),
    ]
    # --as again re-keys (and is recorded): the old keys are not the new root's
    moved = await _ingest(db, store, tmp_path / "ext", sync=True, key_as="renamed")
    assert [(e.document_key, e.status) for e in moved] == [("renamed/sub/a.txt", "created")]
    plain = await _ingest(db, store, tmp_path / "ext")
    assert [e.document_key for e in plain] == ["renamed/sub/a.txt"]
    assert _keys(db) == ["ext/sub/a.txt", "renamed/sub/a.txt"]


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


async def test_a_folder_whose_name_is_no_key_is_reported_not_recorded(
    db: Database, store: AsyncObjectStore, work: Path
) -> None:
    bad = Path(os.fsdecode(os.fsencode(work) + b"/bad\xff"))
    _write(bad / "a.txt", "alpha")
    entries = await _ingest(db, store, bad, sync=True)
    assert [(e.document_key, e.status) for e in entries] == [(None, "error")]
    with db.connection() as conn:
        assert conn.execute("SELECT 1 FROM ingest_folders").fetchall() == []
