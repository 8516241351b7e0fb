"""The command line's start-up: what each command imports, ``--version``, ``-h`` and the help.

Which modules a command loaded is read from the interpreter itself (``python -X importtime``
lists every module imported, on stderr), running the real CLI in a subprocess against a real
PostgreSQL and, for ``search``, the tests' TEI server.
"""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from testkit.embed_server import FakeEmbedServer
from testkit.processes import base_env, cli

# What a command that neither indexes nor embeds in-process must not load: torch and the model
# stack (seconds each), the S3 client, the parsers and the parse-process pool; and pydantic
# (0.2 s), which typer 0.29 imports to coerce any option value (pyproject pins typer < 0.29).
HEAVY = {
    "pydantic",
    "torch",
    "sentence_transformers",
    "transformers",
    "minio",
    "pypdf",
    "docx",
    "bs4",
    "lxml",
    "trio_parallel",
    "semantic_text_splitter",
}
# ... and `status` / `jobs` / `--help` need no vectors and no HTTP client either.
NOT_FOR_ADMIN = HEAVY | {"numpy", "httpx"}


def imported(env: dict[str, str], *args: str) -> set[str]:
    """Top-level names of every module the CLI imported for ``args`` (it must succeed)."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "trioindex.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    names = re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s+([\w.]+)", result.stderr, re.M)
    assert names, "no -X importtime output"
    return {name.split(".")[0] for name in names}


@pytest.fixture
def env(database_url: str, tmp_path: Path) -> dict[str, str]:
    return base_env(TRIOINDEX_DATABASE_URL=database_url, TRIOINDEX_HOME=str(tmp_path / "home"))


@pytest.mark.parametrize(
    "args", [["status"], ["jobs", "list"], ["--help"], ["ingest", "--help"]], ids=" ".join
)
def test_admin_commands_and_help_import_nothing_heavy(env: dict[str, str], args: list[str]) -> None:
    loaded = imported(env, *args)
    assert "psycopg" in loaded or "--help" in args  # the check sees real imports
    assert not loaded & NOT_FOR_ADMIN, sorted(loaded & NOT_FOR_ADMIN)


@pytest.mark.parametrize("args", [["--version"], ["--help"], ["jobs", "--help"]], ids=" ".join)
def test_version_and_help_load_neither_the_database_driver_nor_trio_nor_rich(
    env: dict[str, str], args: list[str]
) -> None:
    """They answer before any command runs: nothing a command needs is loaded (about 0.2 s
    of CPU here, against 0.45 s when the command modules imported psycopg and Trio)."""
    unwanted = imported(env, *args) & (NOT_FOR_ADMIN | {"psycopg", "psycopg_pool", "trio", "rich"})
    assert not unwanted, sorted(unwanted)


def test_search_with_a_server_model_imports_nothing_from_torch(
    env: dict[str, str], embed_server: FakeEmbedServer
) -> None:
    tei = {
        **env,
        "TRIOINDEX_EMBEDDING_API": "tei",
        "TRIOINDEX_EMBEDDING_URL": embed_server.url,
        "TRIOINDEX_EMBEDDING_MODEL": "BAAI/bge-m3",
        "TRIOINDEX_EMBEDDING_DIMENSION": "1024",
    }
    loaded = imported(tei, "search", "how do workers share a queue")
    assert "httpx" in loaded  # it did talk to the server
    assert not loaded & HEAVY, sorted(loaded & HEAVY)


def test_version_and_short_help(env: dict[str, str]) -> None:
    shown = cli(env, "--version")
    assert shown.returncode == 0 and shown.stdout.strip() == f"trioindex {version('trioindex')}"
    for args in (["-h"], ["jobs", "-h"], ["jobs", "list", "-h"], ["ingest", "-h"]):
        result = cli(env, *args)
        assert result.returncode == 0 and "Usage: " in result.stdout, args


@pytest.mark.parametrize("command", ["worker", "ingest", "search", "status", "jobs retry"])
def test_help_shows_no_value_type_for_flags(env: dict[str, str], command: str) -> None:
    result = cli({**env, "COLUMNS": "120"}, *command.split(), "--help")
    assert result.returncode == 0, result.stderr
    assert "--json" in result.stdout and "<bool>" not in result.stdout


# --- hints where people get stuck ---------------------------------------------------------------


def test_ingest_wait_with_no_live_worker_says_how_to_start_one(
    env: dict[str, str], tmp_path: Path
) -> None:
    (tmp_path / "doc.txt").write_text("a document nobody will index")
    waiting = subprocess.Popen(
        [sys.executable, "-m", "trioindex.cli", "ingest", str(tmp_path / "doc.txt"), "--wait"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert waiting.stderr is not None
        said = ""
        for line in waiting.stderr:  # ends when the hint shows (or the command exits)
            said += line
            if "no live worker" in line:
                break
        assert "no live worker is registered" in said and "trioindex worker" in said, said
        assert waiting.poll() is None  # it goes on waiting
    finally:
        waiting.kill()  # our own child
        waiting.wait()


def test_jobs_list_has_column_headers(env: dict[str, str], tmp_path: Path) -> None:
    empty = cli(env, "jobs", "list")
    assert empty.returncode == 0 and empty.stdout.strip() == "no jobs"
    (tmp_path / "doc.txt").write_text("a document")
    assert cli(env, "ingest", str(tmp_path / "doc.txt")).returncode == 0
    header, row = cli(env, "jobs", "list").stdout.splitlines()
    assert header.split() == [
        "JOB",
        "STATUS",
        "DONE",
        "ATTEMPTS",
        "DOCUMENT",
        "(VERSION)",
        "FAILURE",
    ]
    assert "PENDING" in row and "doc.txt (v1)" in row
