"""Bucket notifications end to end: MinIO-format events (tests/http/minio_events.py) posted
to ``/v1/hooks/s3`` of a running service, objects in a real S3 server, a real worker process
indexing what they enqueue, and the result searchable through ``/v1/search``; the same event
twice is one version, a removed object's document goes (the object stays the bucket's), and
hostile events are one error each while the rest of the request goes on; concurrent
notifications are enqueued together (one transaction for several)."""

from __future__ import annotations

import io
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from testkit.embed_server import FakeEmbedServer
from testkit.processes import query, spawn, stop_process, wait_for
from tests.fixtures.s3 import S3Server
from tests.http.conftest import WEBHOOK_TOKEN, Running, service_env, start
from tests.http.minio_events import minio_event
from tests.http.test_upload_groups import enqueues_held, transactions_of, versions_and_jobs
from trioindex.db.pool import connect

pytestmark = pytest.mark.slow

HOOK = {"Authorization": f"Bearer {WEBHOOK_TOKEN}"}
KEY = "reports/Q3 plan.md"
TEXT = b"# Q3 plan\nThe ingestion fleet drains the marker-webhook-lantern backlog by Friday.\n"


def _put(s3: S3Server, bucket: str, key: str, data: bytes) -> str:
    result = s3.client().put_object(bucket, key, io.BytesIO(data), len(data), "text/markdown")
    return str(result.etag)


def _notify(client: httpx.Client, *events: dict[str, Any]) -> list[dict[str, Any]]:
    records = [r for e in events for r in e["Records"]]
    answer = client.post("/v1/hooks/s3", json={"Records": records}, headers=HOOK)
    assert answer.status_code == 200, answer.text
    found: list[dict[str, Any]] = answer.json()["records"]
    return found


def test_an_object_notified_is_indexed_by_a_worker_and_searchable(
    service: Running, s3_server: S3Server
) -> None:
    token = service.key("page", "read")
    bucket = service.bucket
    etag = _put(s3_server, bucket, KEY, TEXT)
    created = minio_event("s3:ObjectCreated:Put", bucket, KEY, size=len(TEXT), etag=etag)
    with service.client(token) as client:
        (first,) = _notify(client, created)
        assert (first["status"], first["key"], first["version_no"]) == ("enqueued", KEY, 1)
        (again,) = _notify(client, created)  # MinIO delivers again after a lost answer
        assert (again["status"], again["version_no"]) == ("unchanged", 1)
        versions = query(service.database_url, "SELECT storage_key, sha256 FROM document_versions")
        assert [v["storage_key"] for v in versions] == [KEY]  # the bucket's object is the blob

        worker = spawn(service.env, "worker", log=service.log.with_name("worker.log"))
        try:

            def indexed() -> bool:
                doc = client.get(f"/v1/documents/{KEY}").json()
                return doc["versions"][-1]["models"][0]["job_status"] == "SUCCEEDED"

            wait_for(indexed, 120, "the worker to index the notified object")
            found = client.get(
                "/v1/search", params={"q": "marker-webhook-lantern backlog", "mode": "hybrid"}
            )
            assert found.json()["results"][0]["document_key"] == KEY

            # a new version of the object is a new version of the document
            _put(s3_server, bucket, KEY, TEXT + b"Moved to Monday.\n")
            (changed,) = _notify(client, minio_event("s3:ObjectCreated:Put", bucket, KEY))
            assert (changed["status"], changed["version_no"]) == ("enqueued", 2)
        finally:
            stop_process(worker)

        # removed: the document goes, rows only; a late duplicate finds nothing to delete
        s3_server.client().remove_object(bucket, KEY)
        removed = minio_event("s3:ObjectRemoved:Delete", bucket, KEY)
        (gone,) = _notify(client, removed)
        assert gone["status"] == "deleted"
        assert client.get(f"/v1/documents/{KEY}").status_code == 404
        (late,) = _notify(client, removed)
        assert late["status"] == "absent"
        # a Created delivered after the object was removed changes nothing either
        (stale,) = _notify(client, created)
        assert stale["status"] == "absent"
    assert WEBHOOK_TOKEN not in service.log_text()


def test_hostile_notifications_are_one_error_each(service: Running, s3_server: S3Server) -> None:
    bucket = service.bucket
    _put(s3_server, bucket, "ok.md", b"fine")
    own_blob = "sha256/ab/" + "ab" * 32
    with service.client() as client:
        event = minio_event("s3:ObjectCreated:Put", bucket, "ok.md")
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": WEBHOOK_TOKEN}):
            refused = client.post("/v1/hooks/s3", json=event, headers=headers)
            assert refused.status_code == 401, headers
            assert refused.json()["error"]["code"] == "unauthenticated"
        assert client.head("/v1/hooks/s3", headers=HOOK).status_code < 500  # MinIO's liveness probe
        for body in (b"{not json", b"[]", b'{"Records": 5}'):
            answer = client.post("/v1/hooks/s3", content=body, headers=HOOK)
            assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_request"
        records = [
            minio_event("s3:ObjectCreated:Put", "another-bucket", "ok.md"),
            minio_event("s3:ObjectCreated:Put", bucket, ".hidden/x.md"),
            minio_event("s3:ObjectCreated:Put", bucket, own_blob),
            minio_event("s3:ObjectAccessed:Get", bucket, "ok.md"),
            {"Records": [{"eventName": "s3:ObjectCreated:Put"}]},
            {"Records": [{"eventName": 7}]},
            {"Records": ["not a record"]},
            minio_event("s3:ObjectRemoved:Delete", bucket, "never-seen.md"),
            event,
        ]
        results = _notify(client, *records)
    assert [r.get("code", r["status"]) for r in results] == [
        "wrong_bucket",
        "invalid_key",
        "ignored",
        "ignored",
        "invalid_record",
        "invalid_record",
        "invalid_record",
        "absent",
        "enqueued",
    ]
    keys = query(service.database_url, "SELECT external_key FROM documents")
    assert keys == [{"external_key": "ok.md"}]


def test_the_webhook_needs_its_token_and_an_s3_store(
    database_url: str, tmp_path: Path, embed_server: FakeEmbedServer
) -> None:
    # a folder store: notifications cannot name its objects (409); with no webhook token set,
    # notifications are off (403) whatever the request carries
    store = f"file://{tmp_path / 'blobs'}"
    event = minio_event("s3:ObjectCreated:Put", "bucket", KEY, etag="0" * 32, size=len(TEXT))
    for token, expected in (
        (WEBHOOK_TOKEN, (409, "webhook_needs_s3")),
        ("", (403, "webhook_disabled")),
    ):
        env = service_env(database_url, store, tmp_path / "home", embed_server)
        if not token:
            del env["TRIOINDEX_HTTP_WEBHOOK_TOKEN"]
        url, process = start(env, tmp_path / f"serve{len(token)}.log")
        try:
            answer = httpx.post(f"{url}/v1/hooks/s3", json=event, headers=HOOK, timeout=60)
        finally:
            stop_process(process)
        assert (answer.status_code, answer.json()["error"]["code"]) == expected, answer.text
        assert query(database_url, "SELECT count(*) AS n FROM documents") == [{"n": 0}]


def test_concurrent_notifications_share_transactions_and_one_event_twice_is_one_version(
    service: Running, s3_server: S3Server
) -> None:
    bucket = service.bucket
    keys = [f"burst/{i:02d}.md" for i in range(16)]
    events = [
        minio_event(
            "s3:ObjectCreated:Put",
            bucket,
            key,
            size=len(TEXT),
            etag=_put(s3_server, bucket, key, TEXT + key.encode()),
        )
        for key in keys
    ]
    # each event delivered twice, every delivery from a thread of its own, all released together
    deliveries = [*events, *events]
    start = threading.Barrier(len(deliveries))
    answers: list[list[dict[str, Any]]] = [[] for _ in deliveries]

    def deliver(i: int) -> None:
        with service.client() as client:
            client.get("/healthz")
            start.wait()
            answers[i] = _notify(client, deliveries[i])

    threads = [threading.Thread(target=deliver, args=(i,)) for i in range(len(deliveries))]
    with enqueues_held(service) as release:
        for thread in threads:
            thread.start()
        release(len(threads))
    for thread in threads:
        thread.join()
    statuses: dict[str, list[str]] = {}
    for (record,) in answers:
        statuses.setdefault(record["key"], []).append(record["status"])
    assert {key: sorted(found) for key, found in statuses.items()} == {
        key: ["enqueued", "unchanged"] for key in keys
    }
    with connect(service.database_url) as conn:
        assert [versions_and_jobs(conn, key) for key in keys] == [(1, 1)] * len(keys)
        sizes = transactions_of(conn, "burst/")
    assert sum(sizes) == len(keys)
    assert len(sizes) < len(keys), f"no two notifications shared a transaction: {sizes}"
