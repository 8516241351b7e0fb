"""What operators read: `jobs list` pages with a footer and aligned columns, `jobs show` by a
short id, `--json` with the attempts, `documents list` with each model's state, and the small
refusals (an empty query, a missing path, a closed pipe).

Real subprocesses: a fresh database on the tests' PostgreSQL, the folder store, the fake TEI
server and one `worker --drain` that indexes the corpus once for the module.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import attrs
import psycopg
import pytest

from testkit.embed_server import FakeEmbedServer
from testkit.processes import FAST_WORKER, base_env, cli
from trioindex.db.pool import with_dbname

pytestmark = pytest.mark.slow

GOOD = 20  # enough jobs that two ids share their first hex digit


@attrs.frozen
class Drained:
    env: dict[str, str]
    database_url: str
    tmp: Path


@pytest.fixture(scope="module")
def drained(
    pg_server_url: str, template_database: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Drained]:
    name = f"trioindex_ops_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_database}"')
    url = with_dbname(pg_server_url, name)
    tmp = tmp_path_factory.mktemp("operators")
    docs = tmp / "docs"
    (docs / "sub").mkdir(parents=True)
    for n in range(GOOD):
        folder = docs / "sub" if n % 2 else docs
        (folder / f"note-{n:02}.txt").write_text(f"Note {n} about leases and queues.\n")
    (docs / "empty.txt").write_text("   \n")  # fails: DOCUMENT_CONTENT_INVALID
    with FakeEmbedServer() as server:
        env = base_env(
            TRIOINDEX_DATABASE_URL=url,
            TRIOINDEX_EMBEDDING_API="tei",
            TRIOINDEX_EMBEDDING_URL=server.url,
            TRIOINDEX_EMBEDDING_MODEL="BAAI/bge-m3",
            TRIOINDEX_EMBEDDING_DIMENSION="1024",
            TRIOINDEX_HOME=str(tmp / "home"),
            **FAST_WORKER,
        )
        ingested = subprocess.run(
            [sys.executable, "-m", "trioindex.cli", "ingest", "docs"],
            cwd=tmp,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert ingested.returncode == 0, ingested.stderr
        worked = cli(env, "worker", "--drain", timeout=300)
        assert worked.returncode == 0, worked.stderr[-2000:]
        yield Drained(env, url, tmp)
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_jobs_list_says_how_many_it_left_out_and_aligns_the_document_column(
    drained: Drained,
) -> None:
    listed = cli(drained.env, "jobs", "list", "--limit", "5")
    assert listed.returncode == 0, listed.stderr
    _header, *rows, footer = listed.stdout.splitlines()
    assert len(rows) == 5
    assert footer == f"5 of {GOOD + 1} jobs (--limit shows more)"
    # the FAILURE column starts at the same place on every line, after the longest document
    failed = cli(drained.env, "jobs", "list").stdout.splitlines()
    start = failed[0].index("FAILURE")
    failure_row = next(line for line in failed if "DOCUMENT_CONTENT_INVALID" in line)
    assert failure_row.index("DOCUMENT_CONTENT_INVALID") == start
    assert not failed[-1].endswith("(--limit shows more)")  # all shown: no footer
    # a FAILED job shows no progress: it is not "10% done"
    assert re.search(r" FAILED +-  ", failure_row), failure_row


def test_jobs_list_json_carries_each_jobs_attempts(drained: Drained) -> None:
    jobs = json.loads(cli(drained.env, "jobs", "list", "--json").stdout)
    assert len(jobs) == GOOD + 1
    for job in jobs:
        assert job["attempt_count"] >= 1
        assert [a["attempt_no"] for a in job["attempts"]] == list(
            range(1, job["attempt_count"] + 1)
        ), job
    (failed,) = [j for j in jobs if j["status"] == "FAILED"]
    assert failed["attempts"][-1]["failure_type"] == "DOCUMENT_CONTENT_INVALID"


def test_jobs_show_takes_a_unique_start_of_an_id_and_refuses_an_ambiguous_one(
    drained: Drained,
) -> None:
    ids = [j["id"] for j in json.loads(cli(drained.env, "jobs", "list", "--json").stdout)]
    short = ids[0][:8]
    shown = cli(drained.env, "jobs", "show", short)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"job {ids[0]}: ")
    assert json.loads(cli(drained.env, "jobs", "show", short, "--json").stdout)["id"] == ids[0]
    # 21 ids, 16 hex digits: some first digit starts two of them
    shared = next(d for d in "0123456789abcdef" if sum(i.startswith(d) for i in ids) > 1)
    for args, code, said in (
        ([shared], 1, f"more than one job id starts with {shared}; give more of it"),
        (["fffffffff"], 1, "no job with an id that starts with fffffffff"),
        (["not-hex"], 2, "not a job id or the start of one"),
    ):
        result = cli(drained.env, "jobs", "show", *args)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode == code and len(lines) == 1, result.stderr
        assert said in lines[0], lines


def test_documents_list_shows_each_models_state_of_the_newest_version(drained: Drained) -> None:
    listed = cli(drained.env, "documents", "list")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert len(lines) == GOOD + 1
    assert re.fullmatch(r"docs/empty\.txt +v1 +BAAI/bge-m3: FAILED DOCUMENT_CONTENT_INVALID,"
                        r" serves nothing", lines[0]), lines[0]  # fmt: skip
    assert re.fullmatch(r"docs/note-00\.txt +v1 +BAAI/bge-m3: SUCCEEDED", lines[1]), lines[1]
    under = cli(drained.env, "documents", "list", "--prefix", "docs/sub/", "--limit", "3")
    *rows, footer = under.stdout.splitlines()
    assert [r.split()[0] for r in rows] == ["docs/sub/note-01.txt", "docs/sub/note-03.txt",
                                            "docs/sub/note-05.txt"]  # fmt: skip
    assert footer == f"3 of {GOOD // 2} documents (--limit shows more)"
    docs = json.loads(cli(drained.env, "documents", "list", "--json").stdout)
    (newest,) = docs[1]["versions"]
    assert docs[1]["key"] == "docs/note-00.txt" and newest["version_no"] == 1
    assert [
        {k: m[k] for k in ("model", "job_status", "failure_type", "chunk_count",
                           "served_version_no")}
        for m in newest["models"]
    ] == [
        {
            "model": "BAAI/bge-m3",
            "job_status": "SUCCEEDED",
            "failure_type": None,
            "chunk_count": 1,
            "served_version_no": 1,
        }
    ]  # fmt: skip
    nothing = cli(drained.env, "documents", "list", "--prefix", "elsewhere/")
    assert nothing.stdout.strip() == "no documents under elsewhere/"


def test_an_empty_query_is_refused_in_one_line(drained: Drained) -> None:
    for text in ("", "   "):
        result = cli(drained.env, "search", text)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode == 2 and len(lines) == 1, result.stderr
        assert "the query is empty" in lines[0] and result.stdout == ""


def test_a_missing_path_for_ingest_is_the_only_line_and_nothing_is_opened(
    drained: Drained,
) -> None:
    env = {**drained.env, "TRIOINDEX_HOME": str(drained.tmp / "never-made")}
    result = cli(env, "ingest", str(drained.tmp / "docs"), str(drained.tmp / "nope"))
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1 and lines == [
        f"trioindex: no such file or folder: {drained.tmp / 'nope'}"
    ], result.stderr
    assert not (drained.tmp / "never-made").exists()


@pytest.mark.parametrize(
    "args", [["status"], ["jobs", "list"], ["documents", "list"], ["--help"]], ids=" ".join
)
def test_a_reader_that_went_away_is_not_an_error(drained: Drained, args: list[str]) -> None:
    """`trioindex status | head -1`: here the reader has gone before the first line."""
    read, write = os.pipe()
    os.close(read)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "trioindex.cli", *args],
            env=drained.env,
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr
