"""`jobs list` and `jobs show` count a job's attempts against the budget the user set
(`worker.max-attempts`), also after `jobs retry` gave it a fresh one: the attempts of earlier
rounds are shown apart ("in all"), never added to the budget.

Real subprocesses: a fresh database on the tests' PostgreSQL, the folder store, the fake TEI
server, and `worker --drain` runs that fail one empty document, before and after the retry.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from testkit.embed_server import FakeEmbedServer
from testkit.processes import FAST_WORKER, base_env, cli
from trioindex.db.pool import with_dbname

pytestmark = pytest.mark.slow

BUDGET = 3


@pytest.fixture
def env(pg_server_url: str, template_database: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    name = f"trioindex_attempts_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_database}"')
    with FakeEmbedServer() as server:
        yield base_env(
            TRIOINDEX_DATABASE_URL=with_dbname(pg_server_url, name),
            TRIOINDEX_EMBEDDING_API="tei",
            TRIOINDEX_EMBEDDING_URL=server.url,
            TRIOINDEX_EMBEDDING_MODEL="BAAI/bge-m3",
            TRIOINDEX_EMBEDDING_DIMENSION="1024",
            TRIOINDEX_HOME=str(tmp_path / "home"),
            TRIOINDEX_WORKER_MAX_ATTEMPTS=str(BUDGET),
            **FAST_WORKER,
        )
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def attempts_shown(env: dict[str, str]) -> tuple[str, str, dict[str, object]]:
    """The ATTEMPTS cell of `jobs list`, the attempts line of `jobs show`, and its JSON."""
    _header, row = cli(env, "jobs", "list").stdout.splitlines()
    job_id, _status, _done, cell, *_ = row.split()
    shown = cli(env, "jobs", "show", job_id).stdout
    (line,) = [part for part in shown.splitlines() if ", attempts " in part]
    return (
        cell,
        line.split(", attempts ")[1],
        json.loads(cli(env, "jobs", "show", job_id, "--json").stdout),
    )


def test_a_retried_job_counts_its_attempts_against_the_users_budget(
    env: dict[str, str], tmp_path: Path
) -> None:
    (tmp_path / "empty.txt").write_text("   \n")  # fails at once: DOCUMENT_CONTENT_INVALID
    assert cli(env, "ingest", str(tmp_path / "empty.txt")).returncode == 0
    assert cli(env, "worker", "--drain", timeout=120).returncode == 0
    cell, line, job = attempts_shown(env)
    assert (cell, line) == (f"1/{BUDGET}", f"1/{BUDGET}")
    assert (job["attempts_spent"], job["attempt_budget"]) == (1, BUDGET)

    assert cli(env, "jobs", "retry", "--all-failed").returncode == 0
    cell, line, job = attempts_shown(env)
    assert (cell, line) == (f"0/{BUDGET}", f"0/{BUDGET} (1 in all)")

    assert cli(env, "worker", "--drain", timeout=120).returncode == 0
    cell, line, job = attempts_shown(env)
    assert (cell, line) == (f"1/{BUDGET}", f"1/{BUDGET} (2 in all)")
    assert (job["attempts_spent"], job["attempt_budget"], job["attempt_count"]) == (1, BUDGET, 2)
    assert re.search(r"attempt 2: FAILED", cli(env, "jobs", "show", str(job["id"])).stdout)


def test_jobs_show_prints_the_steps_a_real_job_ran_with_their_counts(
    env: dict[str, str], tmp_path: Path
) -> None:
    text = "Workers claim jobs and index documents. " * 40
    (tmp_path / "notes.txt").write_text(text)
    assert cli(env, "ingest", str(tmp_path / "notes.txt")).returncode == 0
    assert cli(env, "worker", "--drain", timeout=120).returncode == 0
    _header, row = cli(env, "jobs", "list").stdout.splitlines()
    job_id = row.split()[0]
    job = json.loads(cli(env, "jobs", "show", job_id, "--json").stdout)
    (attempt,) = job["attempts"]
    chunks = attempt["chunks"]
    assert job["status"] == "SUCCEEDED" and chunks == job["chunk_count"] >= 1
    assert (attempt["characters"], attempt["replaced_sequences"]) == (len(text.rstrip()), None)
    assert (attempt["embeddings"], attempt["embedding_slices"]) == (chunks, 1)
    shown = cli(env, "jobs", "show", job_id).stdout
    assert re.search(r"^    parse started \+\d+\.\d\ds$", shown, re.M)
    assert re.search(
        rf"^    chunks stored \+\d+\.\d\ds: {chunks} chunks, {attempt['characters']} characters$",
        shown,
        re.M,
    )
    assert re.search(r"^    embedding started \+\d+\.\d\ds$", shown, re.M)
    assert re.search(
        rf"^    embeddings stored \+\d+\.\d\ds: {chunks} vectors in 1 slice\(s\)$", shown, re.M
    )
