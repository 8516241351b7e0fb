"""What `ingest` prints: the notes before anything is uploaded, one line per file that changed
(`--verbose`: every file), the counts, progress lines while `--wait` runs without a terminal,
and each failure with its reason.

Real subprocesses (stdout and stderr merged, in the order written) on a fresh database, the
folder store, the fake TEI server and a running worker.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.embed_server import FakeEmbedServer
from testkit.processes import FAST_WORKER, base_env, spawn

pytestmark = pytest.mark.slow


@pytest.fixture
def env(database_url: str, embed_server: FakeEmbedServer, tmp_path: Path) -> dict[str, str]:
    return base_env(
        TRIOINDEX_DATABASE_URL=database_url,
        TRIOINDEX_EMBEDDING_API="tei",
        TRIOINDEX_EMBEDDING_URL=embed_server.url,
        TRIOINDEX_EMBEDDING_MODEL="BAAI/bge-m3",
        TRIOINDEX_EMBEDDING_DIMENSION="1024",
        TRIOINDEX_HOME=str(tmp_path / "home"),
        **FAST_WORKER,
    )


@pytest.fixture
def worker(env: dict[str, str], tmp_path: Path) -> Iterator[None]:
    proc = spawn(env, "worker", log=tmp_path / "worker.log")
    try:
        yield
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        finally:
            proc.kill()


def ingest(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trioindex.cli", "ingest", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=180,
        check=False,
    )


def test_ingest_wait_says_each_change_once_notes_first_and_failures_with_their_reason(
    env: dict[str, str], worker: None, tmp_path: Path
) -> None:
    docs = tmp_path / "papers"
    docs.mkdir()
    for n in range(3):
        (docs / f"paper-{n}.txt").write_text(f"Paper {n}: workers renew their leases.\n")
    (docs / "empty.txt").write_text("  \n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    first = ingest(env, elsewhere, str(docs), "--wait")
    assert first.returncode == 1, first.stdout  # empty.txt fails
    lines = first.stdout.splitlines()
    note = next(i for i, line in enumerate(lines) if line.startswith("note: "))
    assert "is outside the current folder" in lines[note]
    for key in ("paper-0.txt", "paper-1.txt", "paper-2.txt", "empty.txt"):
        said = [i for i, line in enumerate(lines) if key in line and not line.startswith("FAILED")]
        assert len(said) == 1, (key, first.stdout)  # once, not at upload and again after
        assert said[0] > note
    assert "4 added, 0 changed, 0 unchanged" in lines
    assert any(line.startswith("indexing: ") for line in lines)  # no terminal: plain lines
    assert "indexed: 3 succeeded, 1 failed" in lines
    (failure,) = [line for line in lines if line.startswith("FAILED ")]
    kind, _, reason = failure.removeprefix("FAILED empty.txt: ").partition(": ")
    assert kind == "DOCUMENT_CONTENT_INVALID" and reason, failure

    # again, with one file changed: only that file is listed, unless --verbose
    (docs / "paper-1.txt").write_text("Paper 1, second edition.\n")
    second = ingest(env, elsewhere, str(docs))
    listed = [line for line in second.stdout.splitlines() if "paper-" in line]
    assert listed == ["created   paper-1.txt  (version 2)"], second.stdout
    assert "0 added, 1 changed, 3 unchanged" in second.stdout.splitlines()
    verbose = ingest(env, elsewhere, str(docs), "--verbose")
    assert sum("unchanged " in line for line in verbose.stdout.splitlines()) == 4, verbose.stdout


def test_files_that_are_not_documents_are_skipped_one_line_each_and_counted(
    env: dict[str, str], tmp_path: Path
) -> None:
    docs = tmp_path / "mixed"
    docs.mkdir()
    (docs / "notes.md").write_text("# Notes\n\nOn leases.\n")
    (docs / "draft.md").write_text("# Draft\n")
    (docs / "tool").write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(200))
    (docs / "noise.bin").write_bytes(bytes(range(256)) * 4)

    result = ingest(env, tmp_path, "mixed", "--exclude", "draft.*")
    assert result.returncode == 0, result.stdout
    lines = result.stdout.splitlines()
    skipped = [line for line in lines if line.startswith("skipped ")]
    assert skipped == [
        "skipped   mixed/noise.bin  not a document trioindex indexes"
        " (unsupported format: binary content)",
        "skipped   mixed/tool  not a document trioindex indexes (unsupported format: executable)",
    ]
    assert "1 added, 0 changed, 0 unchanged, 2 skipped" in lines
    assert not any("draft.md" in line for line in lines)  # left out by --exclude, silently
    jobs = subprocess.run(
        [sys.executable, "-m", "trioindex.cli", "jobs", "list"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert [line.split()[-1] for line in jobs.stdout.splitlines()[1:]] == ["(v1)"], jobs.stdout
    assert "mixed/notes.md" in jobs.stdout
