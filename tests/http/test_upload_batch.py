"""Batch uploads (``POST /v1/documents``, multipart/form-data) against ``trioindex serve`` as a
process on real PostgreSQL and a real S3 server: each part one document with one version and
one job, searchable once a worker ran; hostile parts refused alone with their codes; the
request's bounds (parts, bytes, framing, media type, role); a client that aborts mid-part
leaves nothing enqueued; a 50 MB part is streamed within the memory budget."""

from __future__ import annotations

import hashlib
import re
import socket
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from testkit.embed_server import FakeEmbedServer
from testkit.processes import cli, stop_process, wait_for
from tests.fixtures.s3 import S3Server
from tests.http.conftest import Running, service_env, start
from tests.http.test_upload import (
    MB,
    RSS_BUDGET,
    PeakRss,
    _pieces,
    assert_stored,
    started_with_limit,
)
from tests.http.test_upload_groups import hostile_key, versions_and_jobs
from trioindex.db.pool import connect
from trioindex.http.batch import BATCH_DOCUMENTS, MAX_PARTS, STORE_PARTS

pytestmark = pytest.mark.slow

BOUNDARY = "batch-boundary-7e3d"
Part = tuple[bytes, bytes | None, bytes, bytes]  # field name, filename, content type, data


def part(
    key: str | bytes, data: bytes, filename: str | bytes | None = None, ctype: bytes = b"text/plain"
) -> Part:
    raw_key = key.encode() if isinstance(key, str) else key
    raw_name = filename.encode() if isinstance(filename, str) else filename
    return raw_key, raw_name, ctype, data


def _head(p: Part) -> bytes:
    key, filename, ctype, _ = p
    disposition = b'Content-Disposition: form-data; name="' + key + b'"'
    if filename is not None:
        disposition += b'; filename="' + filename + b'"'
    return (
        b"--"
        + BOUNDARY.encode()
        + b"\r\n"
        + disposition
        + b"\r\nContent-Type: "
        + ctype
        + b"\r\n\r\n"
    )


def multipart(parts: Sequence[Part]) -> bytes:
    """The multipart/form-data body of ``parts``, written by hand so that hostile bytes
    (non-UTF-8, NUL) reach the service as they are."""
    body = b"".join(_head(p) + p[3] + b"\r\n" for p in parts)
    return body + b"--" + BOUNDARY.encode() + b"--\r\n"


HEADERS = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}


def post(client: httpx.Client, parts: Sequence[Part], **kwargs: Any) -> httpx.Response:
    return client.post("/v1/documents", content=multipart(parts), headers=HEADERS, **kwargs)


def documents_under(database_url: str, prefix: str) -> list[str]:
    with connect(database_url) as conn:
        rows = conn.execute(
            "SELECT external_key FROM documents WHERE starts_with(external_key, %s)"
            " ORDER BY external_key",
            (prefix,),
        ).fetchall()
    return [row["external_key"] for row in rows]


def note(i: int) -> bytes:
    return f"# Note {i}\nbatchmarker{i} the queue hands jobs to workers, note {i}.\n".encode()


def test_a_batch_is_one_version_and_one_job_per_part_and_searchable(service: Running) -> None:
    count = STORE_PARTS + 16  # past one store group: two stores, one answer
    parts = [
        part(f"batch/{i:03d}.md", note(i), f"note-{i}.md", b"text/markdown") for i in range(count)
    ]
    with service.client(service.key("app", "write")) as client:
        answer = post(client, parts, params={"priority": "5"})
        assert answer.status_code == 200, answer.text
        shown = answer.json()
        assert (shown["created"], shown["unchanged"], shown["refused"]) == (count, 0, 0)
        results = shown["documents"]
        assert [r["part"] for r in results] == list(range(count))
        assert [r["document_key"] for r in results] == [f"batch/{i:03d}.md" for i in range(count)]
        assert results[7]["sha256"] == hashlib.sha256(note(7)).hexdigest()
        assert results[7]["byte_size"] == len(note(7))
        with connect(service.database_url) as conn:
            for i in (0, 63, 64, count - 1):
                assert versions_and_jobs(conn, f"batch/{i:03d}.md") == (1, 1)
            row = conn.execute(
                """SELECT v.original_name, v.content_type, j.priority FROM documents d
                   JOIN document_versions v ON v.document_id = d.id
                   JOIN embedding_jobs j ON j.document_version_id = v.id
                   WHERE d.external_key = 'batch/005.md'"""
            ).fetchone()
        assert row == {"original_name": "note-5.md", "content_type": "text/markdown", "priority": 5}
        again = post(client, parts)
        assert again.status_code == 200, again.text
        assert (again.json()["unchanged"], again.json()["created"]) == (count, 0)
        drained = cli(service.env, "worker", "--drain", timeout=300)
        assert drained.returncode == 0, drained.stderr[-2000:]
        found = client.get("/v1/search", params={"q": "batchmarker42", "mode": "text"})
        assert found.status_code == 200, found.text
        assert found.json()["results"][0]["document_key"] == "batch/042.md"
    with connect(service.database_url) as conn:
        assert versions_and_jobs(conn, "batch/042.md") == (1, 1)


def test_hostile_parts_are_refused_alone_and_the_rest_goes_on(
    service: Running, s3_server: S3Server
) -> None:
    parts = [
        part("ok/first.txt", b"first good part"),
        part(b"bad\x00key", b"a NUL in the key"),
        part(b"bad-\xff\xfe", b"a key that is not UTF-8"),
        part("ok/empty-name.txt", b"an empty filename", b""),
        part("ok/latin1-name.txt", b"a filename that is not UTF-8", b"caf\xe9.txt"),
        part("ok/long-name.txt", b"a very long filename", "n" * 5000),
        part("ok/nul-name.txt", b"a NUL in the filename", b"a\x00b.txt"),
        part("k" * 1025, b"a key over 1024 characters"),
        part("ok/first.txt", b"the same key again"),
        part("ok/type.txt", b"a content type of 300 characters", ctype=b"text/" + b"x" * 300),
        part(hostile_key(), b"a key too large for the key index"),
        part("../escape.txt", b"a key is opaque text", "../../etc/passwd"),
        part("ok/last.txt", b"last good part"),
    ]
    with service.client(service.key("app", "write")) as client:
        answer = post(client, parts)
    assert answer.status_code == 200, answer.text
    results = answer.json()["documents"]
    assert [r["part"] for r in results] == list(range(len(parts)))
    codes = [r["error"]["code"] if r["status"] == "refused" else r["status"] for r in results]
    assert codes == [
        "created",
        "invalid_key",
        "invalid_key",
        "invalid_name",
        "invalid_name",
        "invalid_name",
        "invalid_name",
        "invalid_key",
        "duplicate_key",
        "invalid_content_type",
        "invalid_request",
        "created",
        "created",
    ]
    assert results[1]["document_key"] is None and results[8]["document_key"] == "ok/first.txt"
    for refused in (r for r in results if r["status"] == "refused"):
        message = refused["error"]["message"]
        assert "\x00" not in message and "nnnnnnnn" not in message and "kkkkkkkk" not in message
    assert documents_under(service.database_url, "") == [
        "../escape.txt",
        "ok/first.txt",
        "ok/last.txt",
    ]
    with connect(service.database_url) as conn:
        row = conn.execute(
            """SELECT v.original_name FROM documents d JOIN document_versions v
               ON v.document_id = d.id WHERE d.external_key = '../escape.txt'"""
        ).fetchone()
    assert row == {"original_name": "passwd"}  # the filename's last segment
    # the key never names a place in the store: objects live under their hash only
    listed = s3_server.client().list_objects(service.bucket, recursive=True)
    names = {o.object_name for o in listed}
    assert all(re.fullmatch(r"sha256/[0-9a-f]{2}/[0-9a-f]{64}", n) for n in names), names


@pytest.fixture
def small_service(
    database_url: str, s3_url: str, tmp_path: Path, embed_server: FakeEmbedServer
) -> Iterator[Running]:
    """``serve`` whose documents are at most 1 MB (so the batch bound is 4 MB)."""
    env = service_env(
        database_url,
        s3_url,
        tmp_path / "home",
        embed_server,
        TRIOINDEX_PARSING_MAX_DOCUMENT_SIZE="1MB",
    )
    log = tmp_path / "serve.log"
    url, process = start(env, log)
    try:
        yield Running(
            url,
            process,
            log,
            env,
            database_url,
            s3_url.rsplit("/", 1)[-1].split("?", maxsplit=1)[0],
        )
    finally:
        stop_process(process)


def test_a_part_over_the_document_size_is_refused_alone(small_service: Running) -> None:
    parts = [
        part("big/before.txt", b"before"),
        part("big/huge.bin", b"x" * (MB + 1), ctype=b"application/octet-stream"),
        part("big/exactly.bin", b"y" * MB, ctype=b"application/octet-stream"),
        part("big/after.txt", b"after"),
    ]
    with small_service.client(small_service.key("app", "write")) as client:
        answer = post(client, parts)
    assert answer.status_code == 200, answer.text
    statuses = [
        r["error"]["code"] if r["status"] == "refused" else r["status"]
        for r in answer.json()["documents"]
    ]
    assert statuses == ["created", "document_too_large", "created", "created"]
    assert documents_under(small_service.database_url, "big/") == [
        "big/after.txt",
        "big/before.txt",
        "big/exactly.bin",
    ]


def error_code(answer: httpx.Response) -> tuple[int, str]:
    return answer.status_code, answer.json()["error"]["code"]


def test_the_request_bounds_refuse_the_whole_batch(small_service: Running) -> None:
    one = [part("bound/a.txt", b"a")]
    over_parts = [part(f"bound/p{i}", b"p") for i in range(MAX_PARTS + 1)]
    at_parts = [part(f"bound/q{i}", b"q") for i in range(MAX_PARTS)]
    too_big = [part(f"bound/big{i}.bin", b"z" * MB) for i in range(BATCH_DOCUMENTS + 1)]
    with small_service.client(small_service.key("app", "write")) as client:
        assert error_code(post(client, over_parts)) == (413, "too_many_parts")
        declared = post(client, too_big)
        assert error_code(declared) == (413, "body_too_large")
        streamed = client.post(
            "/v1/documents", content=iter([multipart(too_big)]), headers=HEADERS
        )  # no Content-Length: refused once it passes the bound
        assert error_code(streamed) == (413, "body_too_large")
        cut = multipart(one)[:-10]  # no closing boundary
        assert error_code(client.post("/v1/documents", content=cut, headers=HEADERS)) == (
            400,
            "invalid_request",
        )
        plain = client.post("/v1/documents", content=b"a", headers={"Content-Type": "text/plain"})
        assert error_code(plain) == (415, "unsupported_media_type")
        assert documents_under(small_service.database_url, "bound/") == []
        at_limit = post(client, at_parts)
        assert at_limit.status_code == 200 and at_limit.json()["created"] == MAX_PARTS
    with small_service.client(small_service.key("reader", "read")) as reader:
        assert error_code(post(reader, one)) == (403, "forbidden")
        described = reader.get("/openapi.json").json()["paths"]["/v1/documents"]["post"]
        assert "multipart/form-data" in described["requestBody"]["content"]
        assert described["x-trioindex-role"] == "write"
    with small_service.client() as anonymous:
        assert error_code(post(anonymous, one)) == (401, "unauthenticated")
    assert len(documents_under(small_service.database_url, "bound/")) == MAX_PARTS


def _batch_requests(url: str, token: str, status: str) -> float:
    metrics = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"}).text
    pattern = rf'trioindex_http_requests_total{{method="POST",route="/v1/documents",status="{status}"}} (\S+)'
    found = re.search(pattern, metrics)
    return float(found.group(1)) if found else 0.0


def test_a_client_that_aborts_mid_part_leaves_no_version(service: Running) -> None:
    token = service.key("app", "write")
    parts = [part(f"abort/{i}.txt", f"whole part {i}".encode()) for i in range(3)]
    body = multipart([*parts, part("abort/cut.txt", b"c" * 10_000)])
    sent = body[: len(body) - 5_000]  # the first three parts whole, the fourth cut
    host, port = service.url.removeprefix("http://").split(":")
    before = _batch_requests(service.url, token, "400")
    with socket.create_connection((host, int(port))) as raw:
        raw.sendall(
            b"POST /v1/documents HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token.encode()
            + b"\r\nContent-Type: multipart/form-data; boundary=" + BOUNDARY.encode()
            + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + sent
        )  # fmt: skip
    # the service ends the request when it sees the client gone (400 client_disconnected)
    wait_for(
        lambda: _batch_requests(service.url, token, "400") > before, 60, "the cut request to end"
    )
    assert documents_under(service.database_url, "abort/") == []
    with service.client(token) as client:
        assert post(client, parts).json()["created"] == 3  # the service goes on


def test_a_batch_with_a_50_mb_part_stays_within_the_memory_budget(
    database_url: str,
    s3_url: str,
    s3_server: S3Server,
    tmp_path: Path,
    embed_server: FakeEmbedServer,
) -> None:
    url, process, token = started_with_limit(database_url, s3_url, tmp_path, embed_server, "64MB")
    size = 50 * MB
    small = part("mem/small.txt", b"a small part beside the large one")
    big_head = _head(part("mem/big.bin", b"", "big.bin", b"application/octet-stream"))

    def stream() -> Iterator[bytes]:
        yield _head(small) + small[3] + b"\r\n" + big_head
        yield from _pieces(size, b"big")
        yield b"\r\n--" + BOUNDARY.encode() + b"--\r\n"

    digest = hashlib.sha256()
    for piece in _pieces(size, b"big"):
        digest.update(piece)
    try:
        with httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=300
        ) as client:
            assert post(client, [part("mem/warm.txt", b"warm")]).status_code == 200
            baseline = psutil.Process(process.pid).memory_info().rss
            with PeakRss(process.pid) as rss:
                answer = client.post("/v1/documents", content=stream(), headers=HEADERS)
            assert answer.status_code == 200, answer.text
    finally:
        stop_process(process)
    growth = rss.peak - baseline
    print(f"batch with a 50 MB part: RSS grew {growth / MB:.1f} MB")
    assert growth < RSS_BUDGET, f"RSS grew {growth / MB:.0f} MB during a batch with a 50 MB part"
    results = answer.json()["documents"]
    assert [r["status"] for r in results] == ["created", "created"]
    assert (results[1]["byte_size"], results[1]["sha256"]) == (size, digest.hexdigest())
    assert_stored(s3_server, s3_url, digest.hexdigest(), size)
