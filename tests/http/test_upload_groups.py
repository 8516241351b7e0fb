"""Uploads stored and enqueued in groups (http/enqueuer.py): the group function on real
PostgreSQL and a real folder store, its bounds on Trio's virtual clock, and many concurrent
uploads against ``trioindex serve`` as a process (the ``service`` fixture: real PostgreSQL,
a real S3 server)."""

from __future__ import annotations

import hashlib
import io
import random
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio
import trio.testing

from tests import helpers
from tests.fixtures.s3 import S3Server
from tests.http.conftest import Running
from trioindex.db.pool import Connection, Database, connect
from trioindex.http.enqueuer import (
    MAX_GROUP,
    MAX_GROUP_BYTES,
    Body,
    Enqueued,
    Upload,
    store_and_enqueue,
    upload_enqueuer,
)
from trioindex.ingest.files import storage_key_for
from trioindex.ingest.results import FileChanged
from trioindex.storage.folder import FolderStore


def body(key: str, data: bytes, *, sha256: str | None = None) -> Body:
    digest = sha256 or hashlib.sha256(data).hexdigest()
    return Body(key, key.rsplit("/", 1)[-1], digest, len(data), None, io.BytesIO(data))


@attrs.define
class SyncCounting(FolderStore):
    """A folder store that counts its ``deferred_sync`` blocks and the puts made in them."""

    blocks: int = 0
    puts_in_blocks: int = 0

    def put(self, key: str, data: Any, **options: Any) -> Any:
        if getattr(self._deferred, "pending", None) is not None:
            self.puts_in_blocks += 1
        return super().put(key, data, **options)

    def deferred_sync(self) -> Any:
        self.blocks += 1
        return super().deferred_sync()


def versions_and_jobs(conn: Connection, key: str) -> tuple[int, int]:
    row = conn.execute(
        """SELECT count(DISTINCT v.id) AS versions, count(j.id) AS jobs
           FROM documents d JOIN document_versions v ON v.document_id = d.id
           LEFT JOIN embedding_jobs j ON j.document_version_id = v.id
           WHERE d.external_key = %s""",
        (key,),
    ).fetchone()
    assert row is not None
    return row["versions"], row["jobs"]


def test_a_group_stores_every_body_in_one_sync_block_and_a_refused_body_fails_alone(
    db: Database, tmp_path: Path
) -> None:
    store = SyncCounting(tmp_path / "blobs")
    store.ensure_ready()
    with db.connection() as conn:
        model = helpers.model(conn)
    uploads = [Upload(0, body(f"group/{i}.txt", f"body {i}".encode())) for i in range(5)]
    # bytes that are not those the hash names: the store refuses them
    uploads[2] = Upload(0, body("group/2.txt", b"other bytes", sha256="0" * 64))
    uploads.append(Upload(7, body("group/urgent.txt", b"urgent")))
    with db.connection() as conn:
        results = store_and_enqueue(conn, uploads, store=store, model_id=model.id, max_attempts=3)
    assert isinstance(results[2], FileChanged)
    assert (store.blocks, store.puts_in_blocks) == (1, 6)  # the refused one tried too
    with db.connection() as conn:
        for upload, result in zip(uploads, results, strict=True):
            assert upload.body is not None
            key = upload.body.document_key
            if result is results[2]:
                assert versions_and_jobs(conn, key) == (0, 0)
                assert not (tmp_path / "blobs" / storage_key_for("0" * 64)).exists()
                continue
            assert isinstance(result, Enqueued)
            assert (result.result.document_key, result.result.status) == (key, "created")
            assert versions_and_jobs(conn, key) == (1, 1)
            assert store.get(result.stored.version.storage_key, max_bytes=100) == (
                upload.body.handle.getvalue()  # type: ignore[attr-defined]
            )
        priority = conn.execute(
            """SELECT j.priority FROM embedding_jobs j
               JOIN document_versions v ON v.id = j.document_version_id
               JOIN documents d ON d.id = v.document_id WHERE d.external_key = %s""",
            ("group/urgent.txt",),
        ).fetchone()
    assert priority == {"priority": 7}


def test_the_same_bytes_again_in_a_group_are_unchanged_and_a_key_twice_is_two_versions(
    db: Database, tmp_path: Path
) -> None:
    store = FolderStore(tmp_path / "blobs")
    store.ensure_ready()
    with db.connection() as conn:
        model = helpers.model(conn)
        first = store_and_enqueue(
            conn, [Upload(0, body("twice.txt", b"one"))], store=store, model_id=model.id,
            max_attempts=3,
        )  # fmt: skip
        again = [Upload(0, body("twice.txt", b"one")), Upload(0, body("twice.txt", b"two"))]
        results = store_and_enqueue(conn, again, store=store, model_id=model.id, max_attempts=3)
        assert versions_and_jobs(conn, "twice.txt") == (2, 2)
    assert isinstance(first[0], Enqueued)
    assert first[0].stored.was_intact is False
    statuses = [(r.result.status, r.result.version_no) for r in results if isinstance(r, Enqueued)]
    assert statuses == [("unchanged", 1), ("created", 2)]
    assert isinstance(results[0], Enqueued) and results[0].stored.was_intact


def test_a_group_the_database_refuses_commits_nothing(db: Database, tmp_path: Path) -> None:
    store = FolderStore(tmp_path / "blobs")
    store.ensure_ready()
    with db.connection() as conn:
        model = helpers.model(conn)
        uploads = [Upload(0, body("fine.txt", b"fine")), Upload(0, body(hostile_key(), b"x"))]
        with pytest.raises(Exception, match="index row"):
            store_and_enqueue(conn, uploads, store=store, model_id=model.id, max_attempts=3)
        assert versions_and_jobs(conn, "fine.txt") == (0, 0)


def hostile_key() -> str:
    """A key the service accepts (1,024 characters, no NUL) that PostgreSQL cannot index:
    4-byte characters that do not compress, over the B-tree's row size."""
    rng = random.Random(29)
    return "".join(chr(rng.randrange(0x10000, 0x10FFFF)) for _ in range(1024))


# -- the bounds, on the virtual clock ------------------------------------------------------------


@attrs.define
class RecordingDb:
    """``Database.run`` without a thread: records each group's uploads and answers them."""

    groups: list[list[Upload]] = attrs.field(factory=list)

    async def run(self, _fn: object, items: Sequence[Upload]) -> list[Any]:
        self.groups.append(list(items))
        await trio.sleep(0.01)  # the commit: the next uploads gather meanwhile
        return list(items)


async def test_groups_hold_at_most_max_group_uploads_and_max_group_bytes(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    db = RecordingDb()
    enqueuer = upload_enqueuer(
        db,  # type: ignore[arg-type]
        FolderStore(tmp_path),
        model_id=uuid.uuid4(),
        max_attempts=3,
    )
    small = [Upload(0, body(f"s{i}", b"x")) for i in range(3 * MAX_GROUP)]
    large = [Upload(0, body(f"l{i}", b"y" * (1 << 20))) for i in range(20)]
    answered: list[object] = []

    async def submit(upload: Upload) -> None:
        answered.append(await enqueuer.submit(upload))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(enqueuer.serve)
        async with trio.open_nursery() as clients:
            for upload in small + large:
                clients.start_soon(submit, upload)
        nursery.cancel_scope.cancel()
    assert sorted(map(id, answered)) == sorted(map(id, small + large))
    assert sum(len(g) for g in db.groups) == len(small + large)
    assert max(len(g) for g in db.groups) == MAX_GROUP  # full groups formed, none larger
    for group in db.groups:
        assert sum(u.body.size for u in group if u.body) <= MAX_GROUP_BYTES + 1024 * len(group)


# -- the service as a process -------------------------------------------------------------------


def upload_together(service: Running, token: str, keys: Sequence[str]) -> list[httpx.Response]:
    """Each key uploaded from a thread of its own, all released together; every 201 is checked
    against the database at once (a response is sent only after its row is committed)."""
    start = threading.Barrier(len(keys))
    answers: list[httpx.Response | None] = [None] * len(keys)
    not_committed: list[str] = []

    def one(i: int, key: str) -> None:
        with service.client(token) as client, connect(service.database_url) as conn:
            client.get("/healthz")
            start.wait()
            answer = client.post(f"/v1/documents/{key}", content=f"text of {i}".encode())
            answers[i] = answer
            if answer.status_code == 201 and versions_and_jobs(conn, key) != (1, 1):
                not_committed.append(key)

    threads = [threading.Thread(target=one, args=(i, k)) for i, k in enumerate(keys)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not_committed == []
    assert all(a is not None for a in answers)
    return [a for a in answers if a is not None]


def transactions_of(conn: Connection, prefix: str) -> list[int]:
    """How many versions each transaction created (rows one transaction inserts share xmin)."""
    rows = conn.execute(
        """SELECT count(*) AS n FROM document_versions v JOIN documents d ON d.id = v.document_id
           WHERE d.external_key LIKE %s GROUP BY v.xmin""",
        (prefix + "%",),
    ).fetchall()
    return [row["n"] for row in rows]


def test_concurrent_uploads_share_transactions_each_one_version_and_one_job(
    service: Running,
) -> None:
    token = service.key("uploader", "write")
    keys = [f"together/{i:02d}.txt" for i in range(40)]
    answers = upload_together(service, token, keys)
    assert [a.status_code for a in answers] == [201] * len(keys)
    assert [a.json()["document_key"] for a in answers] == keys
    with connect(service.database_url) as conn:
        assert [versions_and_jobs(conn, k) for k in keys] == [(1, 1)] * len(keys)
        sizes = transactions_of(conn, "together/")
    assert sum(sizes) == len(keys)
    assert max(sizes) <= MAX_GROUP
    assert len(sizes) < len(keys), f"no two uploads shared a transaction: {sizes}"


def test_a_hostile_upload_among_concurrent_ones_is_refused_alone(service: Running) -> None:
    token = service.key("uploader", "write")
    hostile = hostile_key()
    keys = [f"mixed/{i:02d}.txt" for i in range(24)]
    keys[11] = hostile
    answers = upload_together(service, token, keys)
    refused = answers[11]
    assert refused.status_code >= 400
    assert set(refused.json()) == {"error"}
    assert hostile not in refused.text
    good = [a for i, a in enumerate(answers) if i != 11]
    assert [a.status_code for a in good] == [201] * len(good)
    with connect(service.database_url) as conn:
        assert [versions_and_jobs(conn, k) for k in keys if k != hostile] == [(1, 1)] * 23
        assert versions_and_jobs(conn, hostile) == (0, 0)
    with service.client(token) as client:
        assert client.get("/healthz").status_code == 200


def test_the_same_bytes_after_their_blob_was_lost_are_repaired(
    service: Running, s3_server: S3Server
) -> None:
    token = service.key("uploader", "write")
    data = b"a document whose stored copy goes missing"
    blob = storage_key_for(hashlib.sha256(data).hexdigest())
    with service.client(token) as client:
        first = client.post("/v1/documents/lost.txt", content=data)
        assert (first.status_code, first.json()["status"]) == (201, "created")
        s3_server.client().remove_object(service.bucket, blob)
        again = client.post("/v1/documents/lost.txt", content=data)
        assert (again.status_code, again.json()["status"]) == (200, "repaired")
        assert again.json()["version_no"] == 1
        third = client.post("/v1/documents/lost.txt", content=data)
        assert (third.status_code, third.json()["status"]) == (200, "unchanged")
    stored = s3_server.client().get_object(service.bucket, blob)
    assert stored.read() == data
