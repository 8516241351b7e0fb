"""``ingest s3://bucket/prefix`` against a real S3 server (moto, or MinIO under Docker) and real
PostgreSQL: objects an application stored itself are registered in place — never uploaded
again — read once to hash, skipped without a read when unchanged, and indexed by the worker's
own steps straight from the application's object."""

from __future__ import annotations

import hashlib
import io
from typing import Any

import pytest
import trio

from tests import helpers
from tests.fixtures.s3 import S3Server
from trioindex.db import jobs as lifecycle
from trioindex.db.pool import Database
from trioindex.errors import TrioindexError
from trioindex.ingest import DeletedDocument, IngestResult, SkippedFile
from trioindex.ingest.bucket import BucketLocation, bucket_location, ingest_bucket
from trioindex.storage import AsyncObjectStore, open_store
from trioindex.storage.s3 import S3Store


def _bucket(s3_url: str) -> str:
    return s3_url.split("/")[3].split("?", maxsplit=1)[0]


@pytest.fixture
def store(s3_url: str) -> AsyncObjectStore:
    return AsyncObjectStore(open_store(s3_url), trio.CapacityLimiter(4))


def _put(server: S3Server, bucket: str, key: str, data: bytes) -> None:
    server.client().put_object(bucket, key, io.BytesIO(data), len(data))  # no sha256 metadata


async def _ingest(db: Database, store: AsyncObjectStore, where: str, **options: Any) -> list[Any]:
    with db.connection() as conn:
        model = helpers.model(conn)
    location = bucket_location(where)
    assert location is not None
    with trio.fail_after(60):
        return await ingest_bucket(
            location, db=db, store=store, model_id=model.id, max_attempts=3,
            max_bytes=options.pop("max_bytes", 1 << 20), **options,
        )  # fmt: skip


def test_arguments_name_a_bucket_and_a_prefix() -> None:
    assert bucket_location("s3://b/docs/2026/") == BucketLocation("b", "docs/2026/")
    from pathlib import Path

    assert bucket_location(Path("s3://b/x y")) == BucketLocation("b", "x y")  # as typer hands it
    assert bucket_location("docs/s3://x") is None


async def test_objects_are_registered_in_place_and_unchanged_ones_are_not_read(
    db: Database, store: AsyncObjectStore, s3_server: S3Server, s3_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    bucket = _bucket(s3_url)
    files = {
        "docs/a.txt": b"alpha text",
        "docs/sub/b c.md": "# 베타 문서".encode(),
        "top.txt": b"x",
    }
    for key, data in files.items():
        _put(s3_server, bucket, key, data)
    first = await _ingest(db, store, f"s3://{bucket}/docs/")
    assert [(e.document_key, e.status) for e in first] == [
        ("docs/a.txt", "created"),
        ("docs/sub/b c.md", "created"),
    ]
    with db.connection() as conn:
        rows = conn.execute(
            """SELECT d.external_key, v.storage_key, v.sha256, v.byte_size FROM documents d
               JOIN document_versions v ON v.document_id = d.id ORDER BY 1"""
        ).fetchall()
    assert [(r["external_key"], r["storage_key"], r["sha256"], r["byte_size"]) for r in rows] == [
        (k, k, hashlib.sha256(files[k]).hexdigest(), len(files[k]))
        for k in ("docs/a.txt", "docs/sub/b c.md")
    ]
    # nothing was uploaded: the bucket holds the application's three objects only
    assert sorted(
        o.object_name for o in s3_server.client().list_objects(bucket, recursive=True)
    ) == (sorted(files))
    reads = []
    digest = S3Store.digest
    monkeypatch.setattr(
        S3Store, "digest", lambda self, key, **kw: reads.append(key) or digest(self, key, **kw)
    )
    again = await _ingest(db, store, f"s3://{bucket}/docs/")
    assert {e.status for e in again} == {"unchanged"} and reads == []
    _put(s3_server, bucket, "docs/a.txt", b"alpha, edited")
    third = await _ingest(db, store, f"s3://{bucket}/docs/")
    assert [(e.document_key, e.status, e.version_no) for e in third] == [
        ("docs/a.txt", "created", 2),
        ("docs/sub/b c.md", "unchanged", 1),
    ]
    assert reads == ["docs/a.txt"]


async def test_a_registered_object_is_indexed_by_the_workers_steps(
    db: Database, store: AsyncObjectStore, s3_server: S3Server, s3_url: str
) -> None:
    bucket = _bucket(s3_url)
    _put(s3_server, bucket, "in/place.txt", b"Workers read the application's own object.")
    (entry,) = await _ingest(db, store, f"s3://{bucket}/in/")
    with db.connection() as conn:
        (claim,) = lifecycle.claim_jobs(conn, helpers.worker(conn), 1, 300)
    steps = helpers.pipeline_steps(db, store, helpers.FakeEmbedder())
    await helpers.run_claim(steps, claim)
    with db.connection() as conn:
        assert helpers.job_row(conn, claim.job_id)["status"] == "SUCCEEDED"
        assert helpers.serves(conn, claim)
    assert isinstance(entry, IngestResult) and entry.job_id == claim.job_id


async def test_an_object_too_large_is_an_error_for_it_alone(
    db: Database, store: AsyncObjectStore, s3_server: S3Server, s3_url: str
) -> None:
    bucket = _bucket(s3_url)
    _put(s3_server, bucket, "p/big.txt", b"x" * 5000)
    _put(s3_server, bucket, "p/small.txt", b"small")
    entries = await _ingest(db, store, f"s3://{bucket}/p/", max_bytes=1000)
    assert [(e.document_key, e.status) for e in entries] == [
        ("p/big.txt", "error"),
        ("p/small.txt", "created"),
    ]
    (big,) = [e for e in entries if isinstance(e, SkippedFile)]
    assert "\n" not in big.reason and "1000" in big.reason


async def test_sync_deletes_documents_whose_object_is_gone_and_keeps_the_objects(
    db: Database, store: AsyncObjectStore, s3_server: S3Server, s3_url: str
) -> None:
    bucket = _bucket(s3_url)
    for key in ("s/a.txt", "s/b.txt"):
        _put(s3_server, bucket, key, key.encode())
    await _ingest(db, store, f"s3://{bucket}/s/")
    s3_server.client().remove_object(bucket, "s/b.txt")
    entries = await _ingest(db, store, f"s3://{bucket}/s/", sync=True)
    assert [e.document_key for e in entries if isinstance(e, DeletedDocument)] == ["s/b.txt"]
    with db.connection() as conn:
        keys = [r["external_key"] for r in conn.execute("SELECT external_key FROM documents")]
    assert keys == ["s/a.txt"]
    assert [o.object_name for o in s3_server.client().list_objects(bucket, recursive=True)] == [
        "s/a.txt"
    ]


async def test_another_bucket_than_the_workers_is_refused_before_anything_is_written(
    db: Database, store: AsyncObjectStore
) -> None:
    with pytest.raises(TrioindexError, match="the workers read bucket"):
        await _ingest(db, store, "s3://some-other-bucket/x/")
    with db.connection() as conn:
        assert conn.execute("SELECT count(*) AS n FROM documents").fetchone() == {"n": 0}


def test_the_cli_registers_a_bucket_prefix(
    database_url: str, s3_server: S3Server, s3_url: str, tmp_path: Any
) -> None:
    import json
    import subprocess
    import sys

    from testkit.processes import base_env

    bucket = _bucket(s3_url)
    _put(s3_server, bucket, "cli/a.txt", b"from the command line")
    env = base_env(
        TRIOINDEX_DATABASE_URL=database_url,
        TRIOINDEX_STORAGE_URL=s3_url,
        TRIOINDEX_EMBEDDING_API="tei",
        TRIOINDEX_EMBEDDING_URL="http://127.0.0.1:9",  # ingest never calls it
        TRIOINDEX_EMBEDDING_MODEL="m",
        TRIOINDEX_EMBEDDING_DIMENSION="4",
        TRIOINDEX_HOME=str(tmp_path / "home"),
    )
    run = subprocess.run(
        [sys.executable, "-m", "trioindex.cli", "ingest", f"s3://{bucket}/cli/", "--json"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    (line,) = [json.loads(x) for x in run.stdout.splitlines() if x.startswith("{")]
    assert (line["document_key"], line["status"]) == ("cli/a.txt", "created")
    assert "s3cr3t" not in run.stdout + run.stderr


async def test_deleting_a_registered_document_never_removes_the_applications_object(
    db: Database, store: AsyncObjectStore, s3_server: S3Server, s3_url: str
) -> None:
    from trioindex.removal import delete_documents

    bucket = _bucket(s3_url)
    _put(s3_server, bucket, "own/keep.txt", b"the application's bytes")
    await _ingest(db, store, f"s3://{bucket}/own/")
    report = await delete_documents(db, store, ["own/keep.txt"])
    assert report.deleted == ("own/keep.txt",) and report.blobs_removed == 0
    objects = [o.object_name for o in s3_server.client().list_objects(bucket, recursive=True)]
    assert objects == ["own/keep.txt"]
