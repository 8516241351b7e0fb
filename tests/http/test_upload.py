"""Uploads are streamed: a 50 MB document through ``trioindex serve`` leaves the service's
resident memory within a budget far below the document, the stored object has the body's
exact bytes and hash, and a body over ``indexing.parsing.max-document-size`` is refused
(413 ``document_too_large``) whether its length is declared or only discovered."""

from __future__ import annotations

import hashlib
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from testkit.embed_server import FakeEmbedServer
from testkit.processes import stop_process
from tests.fixtures.s3 import S3Server
from tests.http.conftest import service_env, start
from trioindex.db.api_keys import Role, create_key
from trioindex.db.pool import connect

pytestmark = pytest.mark.slow

MB = 1_000_000
RSS_BUDGET = 150 * MB


def _pieces(total: int, seed: bytes) -> Iterator[bytes]:
    """``total`` pseudo-random bytes in 1 MiB pieces (the test never holds them whole)."""
    block = hashlib.sha256(seed).digest() * (1 << 15)  # 1 MiB
    sent = 0
    while sent < total:
        piece = block[: min(len(block), total - sent)]
        sent += len(piece)
        yield piece


class PeakRss:
    """Samples a process's resident memory every 20 ms while it runs."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.peak = self.process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def test_a_50_mb_upload_is_streamed_within_the_memory_budget(
    database_url: str,
    s3_url: str,
    s3_server: S3Server,
    tmp_path: Path,
    embed_server: FakeEmbedServer,
) -> None:
    url, process, token = started_with_limit(database_url, s3_url, tmp_path, embed_server, "64MB")
    headers = {"Authorization": f"Bearer {token}"}
    try:
        with httpx.Client(base_url=url, headers=headers, timeout=300) as client:
            # warm every code path once, so the measurement sees the upload, not imports
            assert client.post("/v1/documents/warm.bin", content=b"warm").status_code == 201
            size = 50 * MB
            digest = hashlib.sha256()
            for piece in _pieces(size, b"big"):
                digest.update(piece)
            baseline = psutil.Process(process.pid).memory_info().rss
            with PeakRss(process.pid) as rss:
                answer = client.post(
                    "/v1/documents/big/archive.bin",
                    content=_pieces(size, b"big"),
                    headers={"Content-Length": str(size)},
                )
            assert answer.status_code == 201, answer.text
    finally:
        stop_process(process)
    growth = rss.peak - baseline
    print(
        f"50 MB upload: service RSS {baseline / MB:.0f} MB -> peak {rss.peak / MB:.0f} MB"
        f" (growth {growth / MB:.1f} MB)"
    )
    assert growth < RSS_BUDGET, f"RSS grew {growth / MB:.0f} MB during a 50 MB upload"
    body = answer.json()
    assert (body["byte_size"], body["sha256"]) == (size, digest.hexdigest())
    assert_stored(s3_server, s3_url, digest.hexdigest(), size)


def started_with_limit(
    database_url: str, s3_url: str, tmp_path: Path, embed_server: FakeEmbedServer, limit: str
) -> tuple[str, subprocess.Popen[bytes], str]:
    """``serve`` whose documents are at most ``limit``: its URL, its process and a write
    key."""
    env = service_env(
        database_url,
        s3_url,
        tmp_path / "home",
        embed_server,
        TRIOINDEX_PARSING_MAX_DOCUMENT_SIZE=limit,
    )
    url, process = start(env, tmp_path / "serve.log")
    with connect(database_url) as conn:
        token = create_key(conn, "uploader", Role.WRITE)[1]
    return url, process, token


def assert_stored(s3_server: S3Server, s3_url: str, sha256: str, size: int) -> None:
    """The object of these bytes is in the bucket, whole, with its hash noted."""
    bucket = s3_url.rsplit("/", 1)[-1].split("?", maxsplit=1)[0]
    stored = s3_server.client().stat_object(bucket, f"sha256/{sha256[:2]}/{sha256}")
    assert stored.size == size
    assert (stored.metadata or {}).get("x-amz-meta-sha256") == sha256


def test_a_body_over_the_document_size_is_refused_declared_or_not(
    database_url: str, s3_url: str, tmp_path: Path, embed_server: FakeEmbedServer
) -> None:
    url, process, token = started_with_limit(database_url, s3_url, tmp_path, embed_server, "1MB")
    headers = {"Authorization": f"Bearer {token}"}
    try:
        with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
            exactly = client.post("/v1/documents/fits.bin", content=os.urandom(MB))
            assert exactly.status_code == 201, exactly.text
            declared = client.post("/v1/documents/big.bin", content=os.urandom(3 * MB))
            assert declared.status_code == 413
            assert declared.json()["error"]["code"] == "document_too_large"
            # chunked: no length to refuse by, so the body is cut off once it passes the limit
            try:
                streamed = client.post("/v1/documents/big.bin", content=_pieces(3 * MB, b"x"))
            except httpx.TransportError:
                streamed = None  # the server closed while the client was still sending
            if streamed is not None:
                assert streamed.status_code == 413
                assert streamed.json()["error"]["code"] == "document_too_large"
            # the connection pool recovers; nothing was enqueued for the refused bodies
            keys = [d["key"] for d in client.get("/v1/documents").json()["documents"]]
            assert keys == ["fits.bin"]
    finally:
        stop_process(process)
