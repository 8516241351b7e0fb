"""The home does not move with the working directory: commands run from different folders
outside any project share the user's data folder, and the one that creates it says where.

Real subprocesses on the embedded PostgreSQL and the folder store, with ``XDG_DATA_HOME`` in a
folder of the test's own (0711: as root the server's user must pass through it).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.processes import base_env
from trioindex.db.pool import stop_embedded

pytestmark = pytest.mark.slow


@pytest.fixture
def place() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="trioindex-home-test-"))
    folder.chmod(0o711)
    yield folder
    for pgdata in folder.rglob("pgdata"):
        stop_embedded(pgdata.parent)
    shutil.rmtree(folder, ignore_errors=True)


def run(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trioindex.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_commands_from_other_folders_share_one_home_and_its_creation_is_said_once(
    place: Path,
) -> None:
    env = base_env(XDG_DATA_HOME=str(place / "data"), TRIOINDEX_EMBEDDING_API="local")
    home = place / "data" / "trioindex"
    first, second = place / "first", place / "second"
    for folder in (first, second):
        folder.mkdir()
    (first / "notes.txt").write_text("The queue lives in PostgreSQL.\n")

    ingested = run(first, env, "ingest", "notes.txt")
    assert ingested.returncode == 0, ingested.stderr
    created = [
        line for line in ingested.stderr.splitlines() if "created the trioindex home" in line
    ]
    assert created == [
        f"trioindex: created the trioindex home {home} (database and stored files;"
        " `home` or TRIOINDEX_HOME chooses another)"
    ]
    assert (home / "pgdata").is_dir() and not (first / ".trioindex").exists()

    listed = run(second, env, "jobs", "list")
    assert listed.returncode == 0, listed.stderr
    assert "notes.txt" in listed.stdout
    assert "created" not in listed.stderr and not (second / ".trioindex").exists()


def test_a_project_home_is_used_from_its_sub_folders(place: Path) -> None:
    env = base_env(XDG_DATA_HOME=str(place / "data"), TRIOINDEX_EMBEDDING_API="local")
    project = place / "project"
    (project / ".trioindex").mkdir(parents=True)
    (project / "a" / "b").mkdir(parents=True)
    (project / "a" / "b" / "x.md").write_text("# x\n\nA document.\n")

    ingested = run(project / "a" / "b", env, "ingest", "x.md")
    assert ingested.returncode == 0, ingested.stderr
    assert "created the trioindex home" not in ingested.stderr  # it was there already
    assert (project / ".trioindex" / "pgdata").is_dir()
    assert not (place / "data").exists()
    listed = run(project, env, "jobs", "list")
    assert "x.md" in listed.stdout, listed.stderr
