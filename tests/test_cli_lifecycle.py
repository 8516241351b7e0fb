"""`trioindex delete`, `trioindex models` and `ingest --sync` as people run them: subprocesses
on a fresh database with a folder store (no worker: these commands work on what is stored). A
folder ingested from elsewhere syncs from any current folder and by any name of it (relative,
absolute, through a link), and two folders keyed into one namespace never delete each other's
documents."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.processes import base_env, cli, query

pytestmark = pytest.mark.slow


@pytest.fixture
def env(database_url: str, tmp_path: Path) -> dict[str, str]:
    return base_env(
        TRIOINDEX_DATABASE_URL=database_url,
        TRIOINDEX_STORAGE_URL=(tmp_path / "blobs").as_uri(),
        TRIOINDEX_EMBEDDING_API="tei",
        TRIOINDEX_EMBEDDING_URL="http://127.0.0.1:9",  # never called by these commands
        TRIOINDEX_EMBEDDING_MODEL="old-model",
        TRIOINDEX_EMBEDDING_DIMENSION="4",
        TRIOINDEX_HOME=str(tmp_path / "home"),
    )


def test_delete_removes_documents_and_unused_blobs_and_reports_missing_keys(
    env: dict[str, str], database_url: str, tmp_path: Path
) -> None:
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "a.txt").write_text("alpha")
    (docs / "sub" / "b.txt").write_text("beta")
    (docs / "sub" / "c.txt").write_text("alpha")  # same bytes as a.txt: one shared blob
    assert cli(env, "ingest", str(docs)).returncode == 0
    blobs = tmp_path / "blobs"
    stored = {p.name for p in blobs.rglob("*") if p.is_file() and not p.name.startswith(".")}
    assert len(stored) == 2

    done = cli(env, "delete", "a.txt", "--prefix", "sub/", "nope.txt", "--json")
    assert done.returncode == 1, done.stderr  # a key that does not exist
    report = json.loads(done.stdout)
    assert report["deleted"] == ["a.txt", "sub/b.txt", "sub/c.txt"]
    assert report["missing"] == ["nope.txt"]
    assert report["blobs_removed"] == 2
    assert not [p for p in blobs.rglob("*") if p.is_file() and not p.name.startswith(".")]
    assert query(database_url, "SELECT count(*) AS n FROM documents") == [{"n": 0}]

    refused = cli(env, "delete", "--prefix", "")
    assert refused.returncode == 2 and "prefix" in refused.stderr


def test_models_activate_list_and_remove(env: dict[str, str], tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("alpha")
    assert cli(env, "ingest", str(docs)).returncode == 0

    new = cli(env, "models", "activate", "new-model")
    assert new.returncode == 2 and "--dimension" in new.stderr
    started = cli(env, "models", "activate", "new-model", "--dimension", "8", "--json")
    assert started.returncode == 0, started.stderr
    assert json.loads(started.stdout)["switched"] is False

    listed = json.loads(cli(env, "models", "list", "--json").stdout)
    by_name = {m["name"]: m for m in listed}
    assert by_name["old-model"]["serving"] and by_name["new-model"]["activating"]
    # no worker ran: the version still being indexed gets a job for the new model too
    assert by_name["new-model"]["pending_jobs"] == 1
    # no model indexed the one document yet: it counts, uncovered
    assert (by_name["new-model"]["covered"], by_name["new-model"]["documents"]) == (0, 1)
    human = cli(env, "models", "list").stdout
    assert "old-model  4 dims  serving" in human and "switching to" in human
    status = cli(env, "status")
    assert status.returncode == 0, status.stderr
    assert "model:   old-model serves search" in status.stdout
    assert "switch:  to new-model: 0/1 documents covered, 1 job(s) open" in status.stdout
    switch = json.loads(cli(env, "status", "--json").stdout)["switch"]
    assert (switch["name"], switch["covered"], switch["pending_jobs"]) == ("new-model", 0, 1)

    refused = cli(env, "models", "remove", "old-model")
    assert refused.returncode == 1 and "serves search" in refused.stderr
    removed = cli(env, "models", "remove", "new-model")
    assert removed.returncode == 0, removed.stderr
    assert [m["name"] for m in json.loads(cli(env, "models", "list", "--json").stdout)] == [
        "old-model"
    ]


def test_ingest_sync_deletes_documents_whose_files_are_gone(
    env: dict[str, str], database_url: str, tmp_path: Path
) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    for name in ("a.txt", "b.txt", "c.txt"):
        (docs / name).write_text(f"the text of {name}")
    first = cli(env, "ingest", str(docs), "--as", "docs", "--sync")
    assert first.returncode == 0, first.stderr
    assert "3 added, 0 changed, 0 unchanged, 0 deleted" in first.stdout

    (docs / "b.txt").unlink()
    (docs / "c.txt").write_text("c, edited")
    (docs / "d.txt").write_text("a new file")
    plain = cli(env, "ingest", str(docs), "--as", "docs")
    assert plain.returncode == 0, plain.stderr
    assert "1 added, 1 changed, 1 unchanged" in plain.stdout and "deleted" not in plain.stdout
    assert len(query(database_url, "SELECT 1 FROM documents")) == 4

    synced = cli(env, "ingest", str(docs), "--as", "docs", "--sync", "--json")
    assert synced.returncode == 0, synced.stderr
    lines = [json.loads(line) for line in synced.stdout.splitlines()]
    assert [(e["document_key"], e["change"]) for e in lines] == [
        ("docs/a.txt", "unchanged"),
        ("docs/c.txt", "unchanged"),
        ("docs/d.txt", "unchanged"),
        ("docs/b.txt", "deleted"),
    ]
    rows = query(database_url, "SELECT external_key FROM documents ORDER BY 1")
    assert [r["external_key"] for r in rows] == ["docs/a.txt", "docs/c.txt", "docs/d.txt"]

    (docs / "c.txt").unlink()
    human = cli(env, "ingest", str(docs), "--sync")  # no --as: the root recorded with it
    assert human.returncode == 0, human.stderr
    assert "0 added, 0 changed, 2 unchanged, 1 deleted" in human.stdout
    rows = query(database_url, "SELECT external_key FROM documents ORDER BY 1")
    assert [r["external_key"] for r in rows] == ["docs/a.txt", "docs/d.txt"]


# --- ingest --sync from another folder: the recorded key root ----------------------------------


def ingest_in(env: dict[str, str], cwd: Path, *args: str) -> list[tuple[str, str]]:
    """``ingest ARGS --json`` run in ``cwd``: (key, change) of each line; it must succeed."""
    done = subprocess.run(
        [sys.executable, "-m", "trioindex.cli", "ingest", *args, "--json"],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return [(e["document_key"], e["change"]) for e in map(json.loads, done.stdout.splitlines())]


def stored_keys(database_url: str) -> list[str]:
    rows = query(database_url, "SELECT external_key FROM documents ORDER BY 1")
    return [row["external_key"] for row in rows]


def test_a_folder_ingested_from_elsewhere_syncs_from_any_folder_by_any_name(
    env: dict[str, str], database_url: str, tmp_path: Path
) -> None:
    papers, elsewhere = tmp_path / "papers", tmp_path / "elsewhere"
    papers.mkdir()
    elsewhere.mkdir()
    for name in ("a.txt", "b.txt", "c.txt"):
        (papers / name).write_text(f"the text of {name}")
    (tmp_path / "papers-link").symlink_to(papers)

    assert ingest_in(env, elsewhere, str(papers)) == [
        ("a.txt", "added"),
        ("b.txt", "added"),
        ("c.txt", "added"),
    ]
    (papers / "b.txt").unlink()
    # the same command with --sync, from the same folder
    assert ingest_in(env, elsewhere, str(papers), "--sync") == [
        ("a.txt", "unchanged"),
        ("c.txt", "unchanged"),
        ("b.txt", "deleted"),
    ]
    # by its relative name from its parent (which would key it "papers/..."): same keys
    (papers / "c.txt").unlink()
    assert ingest_in(env, tmp_path, "papers", "--sync") == [
        ("a.txt", "unchanged"),
        ("c.txt", "deleted"),
    ]
    # through a link, and as "." from inside it
    (papers / "d.txt").write_text("new")
    assert ingest_in(env, tmp_path, "papers-link", "--sync") == [
        ("a.txt", "unchanged"),
        ("d.txt", "added"),
    ]
    assert ingest_in(env, papers, ".", "--sync") == [("a.txt", "unchanged"), ("d.txt", "unchanged")]
    assert stored_keys(database_url) == ["a.txt", "d.txt"]


def test_two_folders_keyed_into_one_namespace_keep_each_others_documents(
    env: dict[str, str], database_url: str, tmp_path: Path
) -> None:
    one, two, elsewhere = tmp_path / "one", tmp_path / "two", tmp_path / "elsewhere"
    for folder in (one, two, elsewhere):
        folder.mkdir()
    (one / "mine.txt").write_text("one's")
    (one / "shared.txt").write_text("both")
    (two / "shared.txt").write_text("both")
    ingest_in(env, elsewhere, str(one))
    ingest_in(env, elsewhere, str(two))

    # mine.txt has no file under two: it is one's, and two's sync leaves it
    assert ingest_in(env, elsewhere, str(two), "--sync") == [("shared.txt", "unchanged")]
    (one / "shared.txt").unlink()
    assert ingest_in(env, elsewhere, str(one), "--sync") == [("mine.txt", "unchanged")]
    assert stored_keys(database_url) == ["mine.txt", "shared.txt"]  # two still has shared.txt
    (two / "shared.txt").unlink()
    assert ingest_in(env, elsewhere, str(two), "--sync") == [("shared.txt", "deleted")]
    assert stored_keys(database_url) == ["mine.txt"]
