"""Recorded ingest folders (db/folders.py, migration 0014) on a real PostgreSQL: the root a
folder below a recorded one inherits, what a sync may delete, and two syncs releasing one
document at once (several real connections, the order forced by a row lock seen waiting in
pg_stat_activity, not by sleeps)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from uuid import uuid4

from testkit.jobs import enqueue_text
from testkit.processes import wait_for
from tests import helpers
from trioindex.db.folders import (
    IngestFolder,
    claim_folders,
    folder_roots,
    hold_documents,
    release_shared,
    sync_candidates,
)
from trioindex.db.pool import Database


def test_a_folder_below_a_recorded_one_inherits_its_root_unless_as_is_given(db: Database) -> None:
    with db.connection() as conn:
        claim_folders(conn, [(b"/data/papers", "")])
        claim_folders(conn, [(b"/data/kept", "kept")])
        asked = [
            (b"/data/papers/2024/q1", "q1"),  # below papers (root ""): "2024/q1"
            (b"/data/papers-old", "papers-old"),  # shares the text, not the folder
            (b"/data/kept/sub", "x"),
            (b"/data/papers/\xff", "bad"),  # a name that is no key: the root given
            (b"/data/papers", "papers"),  # its own record
        ]
        assert folder_roots(conn, asked, override=False) == [
            "2024/q1",
            "papers-old",
            "kept/sub",
            "bad",
            "",
        ]
        assert folder_roots(conn, asked[:1], override=True) == ["q1"]


def test_related_folders_are_those_keyed_alike() -> None:
    top = IngestFolder(uuid4(), b"/d", "docs")
    assert top.key_of(b"/d/a/b") == "docs/a/b" and top.key_of(b"/dx") is None
    assert top.agrees_with(IngestFolder(uuid4(), b"/d/a", "docs/a"))
    assert not top.agrees_with(IngestFolder(uuid4(), b"/d/a", "a"))


def test_a_sync_may_delete_what_its_folder_holds_and_under_a_root_what_no_folder_holds(
    db: Database,
) -> None:
    with db.connection() as conn:
        model = helpers.model(conn)
        docs, other = claim_folders(conn, [(b"/w/docs", "docs"), (b"/elsewhere", "docs")])
        held = enqueue_text(conn, model.id, "docs/held.txt", b"1")
        enqueue_text(conn, model.id, "docs/by-name.txt", b"2")  # no folder holds it
        theirs = enqueue_text(conn, model.id, "docs/theirs.txt", b"3")
        enqueue_text(conn, model.id, "top.txt", b"4")
        hold_documents(conn, [docs.id, other.id], [held.document_id, theirs.document_id])
        keys, related = sync_candidates(conn, docs)
        assert keys == ["docs/by-name.txt", "docs/held.txt"] and related == [docs.id]
        (root,) = claim_folders(conn, [(b"/r", "")])
        hold_documents(conn, [root.id], [held.document_id])
        # under the empty root, only what the folder holds
        assert sync_candidates(conn, root)[0] == ["docs/held.txt"]


def test_two_syncs_releasing_one_document_at_once_leave_it_to_the_last_holder(
    db: Database,
) -> None:
    with db.connection() as conn:
        model = helpers.model(conn)
        one, two = claim_folders(conn, [(b"/one", ""), (b"/two", "")])
        shared = enqueue_text(conn, model.id, "shared.txt", b"both")
        hold_documents(conn, [one.id, two.id], [shared.document_id] * 2)

    def lock_waiters() -> int:
        with db.connection() as conn:
            row = conn.execute(
                "SELECT count(*) AS n FROM pg_stat_activity"
                " WHERE wait_event_type = 'Lock' AND datname = current_database()"
            ).fetchone()
        return int(row["n"]) if row else 0

    with ThreadPoolExecutor(2) as pool, db.connection() as holder, holder.transaction():
        holder.execute("SELECT 1 FROM documents WHERE external_key = 'shared.txt' FOR UPDATE")
        releases = [
            pool.submit(db.call, release_shared, [folder.id], ["shared.txt"])
            for folder in (one, two)
        ]
        wait_for(lambda: lock_waiters() == 2, 30, "both releases to wait for the document")
    # the first let go (the other folder still held it); the second found itself the last
    assert sorted(len(r.result(timeout=30)) for r in releases) == [0, 1]
    with db.connection() as conn:
        rows = conn.execute("SELECT count(*) AS n FROM ingest_folder_documents").fetchone()
    assert rows is not None and rows["n"] == 1
