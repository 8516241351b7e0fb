"""The SQL contract applications call in their own transactions, on real PostgreSQL:
``trioindex_enqueue_document(s)``, ``trioindex_delete_document(s)`` and the
``trioindex_document_states`` view — from psycopg, from a role that may only call them, and
from Java through JDBC (docs/examples/Enqueue.java, compiled and run here)."""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import socket
import socketserver
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests import helpers
from trioindex.db import jobs as lifecycle
from trioindex.db.pool import Database

REPO = Path(__file__).resolve().parents[2]
JDBC_JARS = ("/usr/share/java/postgresql.jar", "/usr/share/java/postgresql-jdbc4.jar")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _enqueue(conn: psycopg.Connection[Any], key: str, data: bytes) -> tuple[str, uuid.UUID]:
    row = conn.execute(
        "SELECT status, job_id FROM trioindex_enqueue_document(%s, %s, %s, %s, 'text/plain')",
        (key, f"app/{_sha(data)}", _sha(data), len(data)),
    ).fetchone()
    assert row is not None
    return row[0], row[1]


@pytest.fixture
def app_db(db: Database, database_url: str) -> str:
    """A database with a serving model and the application's own table."""
    with db.connection() as conn:
        helpers.model(conn)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE app_uploads (document_key text PRIMARY KEY)")
    return database_url


def test_enqueue_commits_and_rolls_back_with_the_applications_own_rows(app_db: str) -> None:
    with psycopg.connect(app_db, autocommit=True) as listener:
        listener.execute("LISTEN trioindex_jobs")
        with psycopg.connect(app_db) as app:
            app.execute("INSERT INTO app_uploads VALUES ('kept.txt')")
            assert _enqueue(app, "kept.txt", b"kept")[0] == "created"
            app.commit()
            app.execute("INSERT INTO app_uploads VALUES ('dropped.txt')")
            assert _enqueue(app, "dropped.txt", b"dropped")[0] == "created"
            app.rollback()
            # the same bytes again: no new version, no job, no wake-up
            assert _enqueue(app, "kept.txt", b"kept")[0] == "unchanged"
            app.commit()
        woken = list(listener.notifies(timeout=1.0))
        keys = listener.execute("SELECT external_key FROM documents").fetchall()
        jobs = listener.execute("SELECT count(*) FROM embedding_jobs").fetchone()
        own = listener.execute("SELECT document_key FROM app_uploads").fetchall()
    assert [n.channel for n in woken] == ["trioindex_jobs"]  # the commit, once
    assert keys == own == [("kept.txt",)]
    assert jobs == (1,)


def test_a_committed_document_is_claimed_indexed_and_shown_in_the_states_view(
    db: Database, app_db: str
) -> None:
    with psycopg.connect(app_db) as app:
        _, job_id = _enqueue(app, "a.txt", b"alpha")
        app.commit()
    with db.connection() as conn:
        worker = helpers.worker(conn)
        (claim,) = lifecycle.claim_jobs(conn, worker, 5, 300)
        assert claim.job_id == job_id
        helpers.stage_embedded(conn, claim)
        lifecycle.complete_job(conn, claim)
        states = conn.execute("SELECT * FROM trioindex_document_states").fetchall()
    assert [(s["document_key"], s["job_status"], s["served"]) for s in states] == [
        ("a.txt", "SUCCEEDED", True)
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("", "k", "a" * 64, 1), "key must be 1 to 1024"),
        (("k", "", "a" * 64, 1), "storage key must be"),
        (("k", "s", "A" * 64, 1), "sha256 must be 64 lower-case hex"),
        (("k", "s", "a" * 64, -1), "byte_size must be 0 or more"),
    ],
)
def test_bad_input_is_refused_naming_the_field_and_writes_nothing(
    app_db: str, args: tuple[object, ...], message: str
) -> None:
    with psycopg.connect(app_db) as app:
        with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
            app.execute("SELECT * FROM trioindex_enqueue_document(%s, %s, %s, %s)", args)
        app.rollback()
        assert app.execute("SELECT count(*) FROM documents").fetchone() == (0,)


def test_without_a_serving_model_enqueue_says_what_to_do(database_url: str) -> None:
    with (
        psycopg.connect(database_url) as app,
        pytest.raises(psycopg.errors.InvalidParameterValue, match="start a worker"),
    ):
        _enqueue(app, "k", b"x")


def test_delete_from_sql_removes_the_document_and_reports_unnamed_blobs(app_db: str) -> None:
    with psycopg.connect(app_db, autocommit=True) as app:
        _enqueue(app, "a.txt", b"same")
        _enqueue(app, "b.txt", b"same")
        row = app.execute("SELECT * FROM trioindex_delete_documents(ARRAY['a.txt', 'zz'])")
        assert row.fetchone() == (["a.txt"], ["zz"], 1, [])  # b.txt still names the blob
        assert app.execute("SELECT trioindex_delete_document('b.txt')").fetchone() == (True,)
        assert app.execute("SELECT trioindex_delete_document('b.txt')").fetchone() == (False,)
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="empty prefix"):
            app.execute("SELECT * FROM trioindex_delete_documents(NULL, '')")


def test_a_role_that_may_only_call_the_functions_enqueues_and_reads_status_only(
    app_db: str,
) -> None:
    role = f"app_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(app_db, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'app-secret'")
        admin.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {role}")
        admin.execute(
            f"""GRANT EXECUTE ON FUNCTION trioindex_enqueue_document(text, text, text, bigint,
                    text, text, integer, integer) TO {role};
                GRANT SELECT ON trioindex_document_states TO {role}"""
        )
        dsn = psycopg.conninfo.conninfo_to_dict(app_db)
    dsn.update(user=role, password="app-secret")
    try:
        with psycopg.connect(**dsn, autocommit=True) as app:  # type: ignore[arg-type]
            assert _enqueue(app, "r.txt", b"restricted")[0] == "created"
            states = app.execute("SELECT document_key, job_status FROM trioindex_document_states")
            assert states.fetchall() == [("r.txt", "PENDING")]
            for statement in (
                "SELECT * FROM documents",
                "INSERT INTO documents (external_key) VALUES ('x')",
                "UPDATE embedding_jobs SET priority = 9",
                "SELECT trioindex_delete_document('r.txt')",
            ):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    app.execute(statement)
    finally:
        with psycopg.connect(app_db, autocommit=True) as admin:
            admin.execute(f"DROP OWNED BY {role}")
            admin.execute(f"DROP ROLE {role}")


@contextlib.contextmanager
def _tcp_to_socket(url: str) -> Iterator[int]:
    """A loopback TCP port that forwards to the server of ``url`` when that server listens on
    a Unix socket only (the embedded one): JDBC speaks TCP. Yields the port."""
    d = psycopg.conninfo.conninfo_to_dict(url)
    host, port = str(d.get("host", "")), int(d.get("port", 5432))
    if not host.startswith("/"):
        yield port
        return
    path = f"{host}/.s.PGSQL.{port}"

    class Pipe(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            with socket.socket(socket.AF_UNIX) as server:
                server.connect(path)

                def pump(source: socket.socket, sink: socket.socket) -> None:
                    with contextlib.suppress(OSError):
                        while data := source.recv(65536):
                            sink.sendall(data)
                    with contextlib.suppress(OSError):
                        sink.shutdown(socket.SHUT_WR)

                back = threading.Thread(target=pump, args=(server, self.request), daemon=True)
                back.start()
                pump(self.request, server)
                back.join(timeout=30)

    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), Pipe) as bridge:
        bridge.daemon_threads = True
        threading.Thread(target=bridge.serve_forever, daemon=True).start()
        try:
            yield bridge.server_address[1]
        finally:
            bridge.shutdown()


def _jdbc_url(url: str, port: int) -> str:
    d = psycopg.conninfo.conninfo_to_dict(url)
    return (
        f"jdbc:postgresql://127.0.0.1:{port}/{d['dbname']}"
        f"?user={d['user']}&password={d.get('password', '')}"
    )


def test_the_jdbc_example_enqueues_from_java_in_its_own_transaction(
    app_db: str, tmp_path: Path
) -> None:
    jar = next((j for j in JDBC_JARS if Path(j).exists()), None)
    if shutil.which("javac") is None or jar is None:
        pytest.skip(
            "needs a JDK (javac) and the PostgreSQL JDBC driver (Debian: "
            "libpostgresql-jdbc-java; `just setup` installs it when run as root)"
        )
    source = REPO / "docs" / "examples" / "Enqueue.java"
    shutil.copy(source, tmp_path / "Enqueue.java")
    subprocess.run(["javac", "-cp", jar, "Enqueue.java"], cwd=tmp_path, check=True, timeout=180)

    def java(port: int, *args: str) -> str:
        run = subprocess.run(
            ["java", "-cp", f"{jar}:.", "Enqueue", _jdbc_url(app_db, port), *args],
            cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        return run.stdout.strip()

    data = b"from the JVM"
    with _tcp_to_socket(app_db) as port:
        assert java(port, "jvm.txt", "app/j", _sha(data), str(len(data))).startswith("created ")
        assert java(port, "gone.txt", "app/g", _sha(b"x"), "1", "rollback").startswith("created")
    with psycopg.connect(app_db) as conn:
        keys = conn.execute("SELECT external_key FROM documents ORDER BY 1").fetchall()
        own = conn.execute("SELECT document_key FROM app_uploads ORDER BY 1").fetchall()
    assert keys == own == [("jvm.txt",)]


def test_a_key_given_twice_in_one_call_becomes_two_versions_in_that_order(app_db: str) -> None:
    data = [b"a1", b"b1", b"a2", b"a2"]
    keys = ["a", "b", "a", "a"]
    with psycopg.connect(app_db) as app:
        rows = app.execute(
            """SELECT ord, document_key, status, version_no
               FROM trioindex_enqueue_documents(%s, %s, %s, %s) ORDER BY ord""",
            (keys, [f"s/{_sha(d)}" for d in data], [_sha(d) for d in data], [2] * 4),
        ).fetchall()
    assert rows == [
        (1, "a", "created", 1),
        (2, "b", "created", 1),
        (3, "a", "created", 2),
        (4, "a", "unchanged", 2),
    ]
