"""The document key rule (ingest/discover.py ``argument_key``): keys relative to the current
folder, folders outside it keyed from themselves, ``--as``, and collisions refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.processes import base_env, query
from trioindex.ingest.discover import KeyCollision, argument_key, discover, keyed_by_itself


@pytest.fixture
def two(tmp_path: Path) -> Path:
    """Two folders holding files of the same names."""
    for name in ("a", "b"):
        (tmp_path / name / "sub").mkdir(parents=True)
        (tmp_path / name / "README.md").write_text(f"readme of {name}")
        (tmp_path / name / "sub" / "x.txt").write_text(f"x of {name}")
    return tmp_path


def keys(paths: list[Path], **options: object) -> list[str]:
    return [f.document_key for f in discover(paths, **options).files]  # type: ignore[arg-type]


def test_folders_with_the_same_file_names_get_different_keys(two: Path) -> None:
    assert keys([two / "a"], cwd=two) == ["a/README.md", "a/sub/x.txt"]
    assert keys([two / "b"], cwd=two) == ["b/README.md", "b/sub/x.txt"]
    assert keys([two], cwd=two) == ["a/README.md", "a/sub/x.txt", "b/README.md", "b/sub/x.txt"]
    assert keys([two / "b" / "sub" / "x.txt"], cwd=two) == ["b/sub/x.txt"]
    assert keys([two / "a" / ".." / "b"], cwd=two) == ["b/README.md", "b/sub/x.txt"]  # lexical
    assert keys([two / "a"], cwd=two / "a") == ["README.md", "sub/x.txt"]  # `ingest .`


def test_a_folder_outside_the_current_one_is_keyed_from_itself_and_said_so(two: Path) -> None:
    assert keys([two / "a"], cwd=two / "b") == ["README.md", "sub/x.txt"]
    assert keys([two / "a" / "README.md"], cwd=two / "b") == ["README.md"]
    assert keyed_by_itself([two / "a", two / "b" / "sub"], cwd=two / "b") == [two / "a"]
    assert keyed_by_itself([two / "a"], cwd=two) == []


def test_as_sets_the_key_or_the_prefix(two: Path) -> None:
    assert keys([two / "a"], cwd=two, key_as="/docs/") == ["docs/README.md", "docs/sub/x.txt"]
    assert keys([two / "a" / "README.md"], key_as="intro.md") == ["intro.md"]
    with pytest.raises(ValueError, match="non-empty"):
        argument_key(two / "a", key_as=" / ")


def test_two_files_with_one_key_are_refused_and_one_file_twice_is_kept_once(two: Path) -> None:
    with pytest.raises(KeyCollision, match=r"would both be document 'docs/README\.md'"):
        discover([two / "a", two / "b"], cwd=two, key_as="docs")
    assert keys([two / "a", two / "a" / "README.md"], cwd=two) == ["a/README.md", "a/sub/x.txt"]


@pytest.mark.slow
def test_ingesting_a_then_b_makes_two_documents_not_two_versions(
    two: Path, database_url: str
) -> None:
    env = base_env(TRIOINDEX_DATABASE_URL=database_url, TRIOINDEX_HOME=str(two / "home"))

    def ingest(*args: str, cwd: Path = two) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "trioindex.cli", "ingest", *args],
            cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip

    first, second = ingest("a/", "--json"), ingest("b/", "--json")
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    shown = [json.loads(line) for line in (first.stdout + second.stdout).splitlines()]
    assert [(e["document_key"], e["status"], e["version_no"]) for e in shown] == [
        ("a/README.md", "created", 1),
        ("a/sub/x.txt", "created", 1),
        ("b/README.md", "created", 1),
        ("b/sub/x.txt", "created", 1),
    ]
    rows = query(database_url, "SELECT external_key FROM documents ORDER BY 1")
    assert [r["external_key"] for r in rows] == [e["document_key"] for e in shown]

    refused = ingest("a/", "b/", "--as", "docs")
    assert refused.returncode == 1 and "would both be document 'docs/README.md'" in refused.stderr
    assert len(query(database_url, "SELECT 1 FROM documents")) == 4  # nothing ingested

    # a folder ingested before keeps its recorded keys from anywhere; a new one outside the
    # current folder is keyed from itself
    again = ingest("../a", cwd=two / "b")
    assert again.returncode == 0 and "0 added, 0 changed, 2 unchanged" in again.stdout
    (two / "c").mkdir()
    (two / "c" / "README.md").write_text("c")
    outside = ingest("../c", cwd=two / "b")
    assert outside.returncode == 0 and "is outside the current folder" in outside.stderr
    assert "created   README.md  (version 1)" in outside.stdout
