"""Hostile command-line input: one line naming what is wrong, before anything is written.

The real CLI in subprocesses on a fresh database, a folder store and the tests' TEI server. Bytes
that are not UTF-8 are passed in argv as bytes (Python hands them to the program as lone
surrogates), in ``--queries`` lines and in ``trioindex.toml``; out-of-range priorities and model
names are refused at parse time. A database URL in libpq's ``key=value`` form is accepted, and
its password is in no output, log line or error.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from testkit.embed_server import FakeEmbedServer
from testkit.processes import base_env, free_port, query

pytestmark = pytest.mark.slow

FILE = "{file}"  # replaced by a real file to ingest
UNDECODABLE = b'{"id": 1, "text": "ok"}\n{"id": 2, "text": "lease\xff"}\n'


@pytest.fixture
def env(database_url: str, embed_server: FakeEmbedServer, tmp_path: Path) -> dict[str, str]:
    return base_env(
        TRIOINDEX_DATABASE_URL=database_url,
        TRIOINDEX_STORAGE_URL=(tmp_path / "blobs").as_uri(),
        TRIOINDEX_EMBEDDING_API="tei",
        TRIOINDEX_EMBEDDING_URL=embed_server.url,
        TRIOINDEX_EMBEDDING_MODEL="BAAI/bge-m3",
        TRIOINDEX_EMBEDDING_DIMENSION="1024",
        TRIOINDEX_HOME=str(tmp_path / "home"),
    )


def trioindex(
    env: dict[str, str], *args: str | bytes, cwd: Path | None = None, stdin: bytes = b""
) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of the CLI; arguments may be bytes, output is decoded with
    backslash escapes for whatever is not UTF-8."""
    result = subprocess.run(
        [sys.executable, "-m", "trioindex.cli", *args],
        env=env,
        cwd=cwd,
        input=stdin,
        capture_output=True,
        timeout=120,
        check=False,
    )
    out, err = (s.decode("utf-8", "backslashreplace") for s in (result.stdout, result.stderr))
    return result.returncode, out, err


def refused(result: tuple[int, str, str], *expected: str) -> str:
    """The one stderr line of a usage error (exit code 2) that names each of ``expected``."""
    code, out, err = result
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err[-3000:]
    assert out == ""
    for text in expected:
        assert text in lines[0]
    return lines[0]


def written(database_url: str, blobs: Path) -> tuple[int, ...]:
    """Rows in the tables a command could write, and files in the folder store."""
    (counts,) = query(
        database_url,
        "SELECT (SELECT count(*) FROM documents) AS d, (SELECT count(*) FROM document_versions)"
        " AS v, (SELECT count(*) FROM embedding_jobs) AS j,"
        " (SELECT count(*) FROM embedding_models) AS m",
    )
    files = [p for p in blobs.rglob("*") if p.is_file()] if blobs.exists() else []
    return (*counts.values(), len(files))


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["search", b"lease\xff"], ["'text'", "must be UTF-8 text"]),
        (["delete", b"x\xff"], ["'keys'", "must be UTF-8 text"]),
        (["delete", "--prefix", b"x\xff"], ["'--prefix'", "must be UTF-8 text"]),
        (["ingest", FILE, "--as", b"k\xff"], ["'--as'", "must be UTF-8 text"]),
        (["search", "q", "--prefix", b"p\xff"], ["'--prefix'"]),
        (["search", "q", "--content-type", b"t\xff"], ["'--content-type'"]),
        (["models", "activate", b"m\xff", "--dimension", "8"], ["'name'", "UTF-8"]),
        (
            ["ingest", FILE, "--priority", "99999999999"],
            ["'--priority'", "-2147483648<=x<=2147483647"],
        ),
        (
            ["models", "activate", "new", "--dimension", "8", "--priority", "-2147483649"],
            ["'--priority'", "-2147483648<=x<=2147483647"],
        ),
        (["models", "activate", "", "--dimension", "8"], ["'name'", "1 to 200 characters"]),
        (["models", "activate", "m" * 201, "--dimension", "8"], ["'name'", "1 to 200"]),
        (["models", "remove", ""], ["'name'", "1 to 200 characters"]),
        (["search", "q", "--top-k", "0"], ["'--top-k'", "1<=x<=1000", "search -h"]),
        (["jobs", "show", "nope"], ["'job_id'", "not a job id or the start of one"]),
    ],
    ids=lambda value: " ".join(map(str, value)) if isinstance(value, list) else "",
)
def test_a_bad_argument_is_one_line_and_nothing_is_written(
    env: dict[str, str],
    database_url: str,
    tmp_path: Path,
    args: Sequence[str | bytes],
    names: list[str],
) -> None:
    document = tmp_path / "docs" / "lease.txt"
    document.parent.mkdir()
    document.write_text("a lease is renewed before it expires")
    before = written(database_url, tmp_path / "blobs")
    argv = [str(document) if arg == FILE else arg for arg in args]
    refused(trioindex(env, *argv), *names)
    assert written(database_url, tmp_path / "blobs") == before


@pytest.mark.parametrize(
    ("lines", "answers", "source"),
    [
        (UNDECODABLE, [(1, None), (2, "the query must be UTF-8 text")], "file"),
        (UNDECODABLE, [(1, None), (2, "the query must be UTF-8 text")], "stdin"),
        (b'{"id": 1, "text": "lease\\udcff"}\n', [(1, "the query must be UTF-8 text")], "file"),
        (b'{"id": "\\ud800", "text": "ok"}\n', [("\ud800", None)], "file"),  # echoed, escaped
        (b'{"id": 1, "text": "a\\u0000b"}\n', [(1, "must not contain a NUL character")], "file"),
    ],
    ids=["undecodable bytes", "undecodable bytes on stdin", "escaped surrogate", "id", "NUL"],
)
def test_a_bad_query_line_is_refused_on_its_own(
    env: dict[str, str],
    tmp_path: Path,
    lines: bytes,
    answers: list[tuple[object, str | None]],
    source: str,
) -> None:
    path = tmp_path / "queries.jsonl"
    path.write_bytes(lines)
    if source == "file":
        code, out, err = trioindex(env, "search", "--queries", str(path))
    else:
        code, out, err = trioindex(env, "search", "--queries", "-", stdin=lines)
    printed = [json.loads(line) for line in out.splitlines()]
    assert [p["id"] for p in printed] == [query_id for query_id, _ in answers]
    for line, (_, error) in zip(printed, answers, strict=True):
        assert ("results" in line) if error is None else (line["error"]["message"].endswith(error))
    bad = sum(error is not None for _, error in answers)
    assert code == (1 if bad else 0), err
    assert err.strip() == (
        f"trioindex: {bad} of {len(answers)} queries refused (see their errors)" if bad else ""
    )


def test_a_configuration_file_that_is_not_utf8_is_one_line(
    env: dict[str, str], tmp_path: Path
) -> None:
    (tmp_path / "trioindex.toml").write_bytes(b'[log]\nformat = "te\xffxt"\n')
    line = refused(trioindex(env, "status", cwd=tmp_path))
    assert line.endswith("trioindex.toml: not UTF-8 text (line 2); TOML files must be UTF-8")


def test_an_api_key_no_http_header_can_carry_is_one_line(env: dict[str, str]) -> None:
    result = trioindex({**env, "TRIOINDEX_EMBEDDING_API_KEY": "clé-secrète"}, "search", "lease")
    line = refused(result, "embedding.api-key: must be printable ASCII", "got <hidden>")
    assert "secr" not in line


# --- a database URL in libpq's key=value form ------------------------------------------------


def key_value(url: str, **changes: str) -> tuple[str, str]:
    """``url`` as a key=value string (with ``changes``) and its password."""
    options = {**conninfo_to_dict(url), **changes}
    password = str(options.get("password") or "")
    if not password:
        pytest.skip("the test server's URL has no password to look for")
    return make_conninfo("", **options), password


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_key_value_database_url_works_and_its_password_is_never_shown(
    env: dict[str, str], database_url: str, log_format: str
) -> None:
    conninfo, password = key_value(database_url)
    assert "://" not in conninfo
    env = {**env, "TRIOINDEX_DATABASE_URL": conninfo, "TRIOINDEX_LOG_FORMAT": log_format}
    outputs = []
    for args in (["migrate"], ["status"], ["jobs", "list"], ["models", "list"]):
        code, out, err = trioindex(env, *args)
        assert code == 0, err[-3000:]
        outputs.append(out + err)
    assert "database: PostgreSQL at" in outputs[0]  # migrate logs at INFO
    assert "schema is up to date" in outputs[0]
    for output in outputs:
        assert password not in output


def test_a_key_value_database_url_that_cannot_connect_is_one_line(
    env: dict[str, str], database_url: str
) -> None:
    wrong, password = key_value(database_url, password="Wr0ng-S3cret!")
    closed, _ = key_value(database_url, host="127.0.0.1", port=str(free_port()))
    for conninfo in (wrong, closed):
        code, out, err = trioindex({**env, "TRIOINDEX_DATABASE_URL": conninfo}, "status")
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 1 and len(lines) == 1, err[-3000:]
        assert lines[0].startswith("trioindex: cannot connect to PostgreSQL at")
        for secret in (password, "Wr0ng-S3cret!"):
            assert secret not in out + err
