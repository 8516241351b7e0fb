"""Uploads stored and enqueued in groups (http/enqueuer.py): the group function on real
PostgreSQL and a real folder store, its bounds on Trio's virtual clock, and many concurrent
uploads against ``trioindex serve`` as a process (the ``service`` fixture: real PostgreSQL,
a real S3 server)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import random
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import httpx
import psycopg
import pytest
import trio
import trio.testing

from testkit.processes import wait_for
from tests import helpers
from tests.fixtures.s3 import S3Server
from tests.http.conftest import Running
from trioindex.db.pool import Connection, Database, connect
from trioindex.http.enqueuer import (
    MAX_GROUP,
    Body,
    StoredBody,
    Upload,
    enqueue_group,
    store_body,
    upload_enqueuer,
)
from trioindex.ingest.files import storage_key_for
from trioindex.ingest.results import IngestResult
from trioindex.storage.folder import FolderStore
from trioindex.worker.committer import GroupCommitter

#: The enqueuer's group loops: this many groups are committed at once.
ENQUEUER_LOOPS = attrs.fields(GroupCommitter).parallel.default


def body(key: str, data: bytes) -> Body:
    digest = hashlib.sha256(data).hexdigest()
    return Body(key, key.rsplit("/", 1)[-1], digest, len(data), None, io.BytesIO(data))


def stored(store: FolderStore, key: str, data: bytes, priority: int = 0) -> Upload:
    return Upload(store_body(store, body(key, data)), priority)


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


def transactions_of(conn: Connection, prefix: str) -> list[int]:
    """How many versions each transaction created: ``created_at`` is ``now()``, the start of
    the transaction (the same in its savepoints, whose rows have an ``xmin`` of their own)."""
    rows = conn.execute(
        """SELECT count(*) AS n FROM document_versions v JOIN documents d ON d.id = v.document_id
           WHERE d.external_key LIKE %s GROUP BY v.created_at""",
        (prefix + "%",),
    ).fetchall()
    return [row["n"] for row in rows]


def requests_in_flight(service: Running, token: str) -> int:
    """What the service's ``/metrics`` says it is handling now, this request included."""
    with service.client(token) as client:
        text = client.get("/metrics").text
    (line,) = [x for x in text.splitlines() if x.startswith("trioindex_http_requests_in_flight ")]
    return int(float(line.split()[1]))


@contextlib.contextmanager
def enqueues_held(service: Running) -> Iterator[Callable[[int], None]]:
    """Hold the service's enqueue transactions at their first version row (a lock on
    ``document_versions``) until ``release(n)`` has seen the service handling ``n`` requests
    besides its own and every enqueuer loop waiting on the lock: the requests then gather
    behind the held groups, however slowly the machine runs them, rather than racing the
    commits. Leaving the block releases the lock in any case."""
    token = service.key("gather-watch", "read")
    with (
        connect(service.database_url, autocommit=False) as holder,
        connect(service.database_url) as watch,
    ):
        holder.execute("LOCK TABLE document_versions IN EXCLUSIVE MODE")

        def waiting_loops() -> int:
            row = watch.execute(
                """SELECT count(*) AS n FROM pg_stat_activity
                   WHERE datname = current_database() AND wait_event_type = 'Lock'"""
            ).fetchone()
            assert row is not None
            return int(row["n"])

        def release(requests: int) -> None:
            wait_for(
                lambda: (
                    waiting_loops() == ENQUEUER_LOOPS
                    and requests_in_flight(service, token) == requests + 1
                ),
                60,
                f"{requests} requests in flight behind {ENQUEUER_LOOPS} held groups",
            )
            holder.rollback()

        yield release


@pytest.fixture
def store(tmp_path: Path) -> FolderStore:
    folder = FolderStore(tmp_path / "blobs")
    folder.ensure_ready()
    return folder


@pytest.fixture
def model_id(db: Database) -> uuid.UUID:
    with db.connection() as conn:
        found: uuid.UUID = helpers.model(conn).id
    return found


def test_a_group_is_one_transaction_with_each_upload_its_version_job_and_priority(
    db: Database, store: FolderStore, model_id: uuid.UUID
) -> None:
    uploads = [stored(store, f"group/{i}.txt", f"body {i}".encode()) for i in range(5)]
    uploads.insert(2, stored(store, "group/urgent.txt", b"urgent", priority=7))
    with db.connection() as conn:
        results = enqueue_group(conn, uploads, model_id=model_id, max_attempts=3)
        keys = [u.stored.version.document_key for u in uploads]
        assert [r.document_key for r in results if isinstance(r, IngestResult)] == keys
        assert {r.status for r in results if isinstance(r, IngestResult)} == {"created"}
        assert [versions_and_jobs(conn, k) for k in keys] == [(1, 1)] * len(keys)
        assert transactions_of(conn, "group/") == [len(keys)]
        priorities = conn.execute(
            """SELECT d.external_key, j.priority FROM embedding_jobs j
               JOIN document_versions v ON v.id = j.document_version_id
               JOIN documents d ON d.id = v.document_id WHERE j.priority <> 0"""
        ).fetchall()
    assert priorities == [{"external_key": "group/urgent.txt", "priority": 7}]


def test_the_same_bytes_again_in_a_group_are_unchanged_and_a_key_twice_is_two_versions(
    db: Database, store: FolderStore, model_id: uuid.UUID
) -> None:
    with db.connection() as conn:
        first = stored(store, "twice.txt", b"one")
        enqueue_group(conn, [first], model_id=model_id, max_attempts=3)
        again = [stored(store, "twice.txt", b"one"), stored(store, "twice.txt", b"two")]
        results = enqueue_group(conn, again, model_id=model_id, max_attempts=3)
        assert versions_and_jobs(conn, "twice.txt") == (2, 2)
    assert (first.stored.was_intact, again[0].stored.was_intact) == (False, True)
    statuses = [(r.status, r.version_no) for r in results if isinstance(r, IngestResult)]
    assert statuses == [("unchanged", 1), ("created", 2)]


def test_a_group_the_database_refuses_commits_nothing(
    db: Database, store: FolderStore, model_id: uuid.UUID
) -> None:
    with db.connection() as conn:
        uploads = [stored(store, "fine.txt", b"fine"), stored(store, hostile_key(), b"x")]
        with pytest.raises(psycopg.errors.ProgramLimitExceeded):
            enqueue_group(conn, uploads, model_id=model_id, max_attempts=3)
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


async def test_a_group_holds_at_most_max_group_uploads(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    db = RecordingDb()
    enqueuer = upload_enqueuer(db, model_id=uuid.uuid4(), max_attempts=3)  # type: ignore[arg-type]
    version = store_body(FolderStore(tmp_path), body("k", b"x")).version
    uploads = [Upload(StoredBody(version, False), i) for i in range(3 * MAX_GROUP + 5)]
    answered: list[object] = []

    async def submit(upload: Upload) -> None:
        answered.append(await enqueuer.submit(upload))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(enqueuer.serve)
        async with trio.open_nursery() as clients:
            for upload in uploads:
                clients.start_soon(submit, upload)
        nursery.cancel_scope.cancel()
    assert sorted(map(id, answered)) == sorted(map(id, uploads))  # each its own answer
    assert sorted(map(len, db.groups), reverse=True)[:3] == [MAX_GROUP] * 3
    assert sum(map(len, db.groups)) == len(uploads)


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
    with enqueues_held(service) as release:
        for thread in threads:
            thread.start()
        release(len(threads))
    for thread in threads:
        thread.join()
    assert not_committed == []
    assert all(a is not None for a in answers)
    return [a for a in answers if a is not None]


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
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "invalid_request"
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
