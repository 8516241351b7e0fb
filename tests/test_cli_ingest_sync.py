"""`ingest DIR --sync` through the real CLI on embedded PostgreSQL: a folder ingested from
elsewhere (keyed from itself) syncs from any current folder and by any name of it (relative,
absolute, through a link), and two folders keyed into one namespace never delete each other's
documents."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.processes import base_env, query

pytestmark = pytest.mark.slow


@pytest.fixture
def env(database_url: str, tmp_path: Path) -> dict[str, str]:
    return base_env(
        TRIOINDEX_DATABASE_URL=database_url,
        TRIOINDEX_STORAGE_URL=(tmp_path / "blobs").as_uri(),
        TRIOINDEX_EMBEDDING_API="tei",
        TRIOINDEX_EMBEDDING_URL="http://127.0.0.1:9",  # never called: nothing is searched
        TRIOINDEX_EMBEDDING_MODEL="m",
        TRIOINDEX_EMBEDDING_DIMENSION="4",
        TRIOINDEX_HOME=str(tmp_path / "home"),
    )


def ingest(env: dict[str, str], cwd: Path, *args: str) -> list[tuple[str, str]]:
    """``ingest ARGS --json`` run in ``cwd``: (key, change) of each line; it must succeed."""
    done = subprocess.run(
        [sys.executable, "-m", "trioindex.cli", "ingest", *args, "--json"],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return [(e["document_key"], e["change"]) for e in map(json.loads, done.stdout.splitlines())]


def keys(database_url: str) -> list[str]:
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

    assert ingest(env, elsewhere, str(papers)) == [
        ("a.txt", "added"),
        ("b.txt", "added"),
        ("c.txt", "added"),
    ]
    (papers / "b.txt").unlink()
    # the same command with --sync, from the same folder
    assert ingest(env, elsewhere, str(papers), "--sync") == [
        ("a.txt", "unchanged"),
        ("c.txt", "unchanged"),
        ("b.txt", "deleted"),
    ]
    # by its relative name from its parent (which would key it "papers/..."): same keys
    (papers / "c.txt").unlink()
    assert ingest(env, tmp_path, "papers", "--sync") == [
        ("a.txt", "unchanged"),
        ("c.txt", "deleted"),
    ]
    # through a link, and as "." from inside it
    (papers / "d.txt").write_text("new")
    assert ingest(env, tmp_path, "papers-link", "--sync") == [
        ("a.txt", "unchanged"),
        ("d.txt", "added"),
    ]
    assert ingest(env, papers, ".", "--sync") == [("a.txt", "unchanged"), ("d.txt", "unchanged")]
    assert keys(database_url) == ["a.txt", "d.txt"]


def test_two_folders_keyed_into_one_namespace_keep_each_others_documents(
    env: dict[str, str], database_url: str, tmp_path: Path
) -> None:
    one, two, elsewhere = tmp_path / "one", tmp_path / "two", tmp_path / "elsewhere"
    for folder in (one, two, elsewhere):
        folder.mkdir()
    (one / "mine.txt").write_text("one's")
    (one / "shared.txt").write_text("both")
    (two / "shared.txt").write_text("both")
    ingest(env, elsewhere, str(one))
    ingest(env, elsewhere, str(two))

    # mine.txt has no file under two: it is one's, and two's sync leaves it
    assert ingest(env, elsewhere, str(two), "--sync") == [("shared.txt", "unchanged")]
    (one / "shared.txt").unlink()
    assert ingest(env, elsewhere, str(one), "--sync") == [("mine.txt", "unchanged")]
    assert keys(database_url) == ["mine.txt", "shared.txt"]  # two still has shared.txt
    (two / "shared.txt").unlink()
    assert ingest(env, elsewhere, str(two), "--sync") == [("shared.txt", "deleted")]
    assert keys(database_url) == ["mine.txt"]
