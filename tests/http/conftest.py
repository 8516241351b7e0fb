"""The HTTP service as a real process: ``trioindex serve`` on a free loopback port, against a
fresh database (tests/fixtures/database.py), a real S3 server (moto or MinIO,
tests/fixtures/s3.py) and the fake embedding server; keys are made with the database function
the ``keys`` command calls."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest

from testkit.embed_server import FakeEmbedServer
from testkit.processes import (
    FAST_WORKER,
    base_env,
    free_port,
    spawn,
    stop_process,
    wait_for,
    wait_for_port,
)
from tests.fixtures.s3 import S3Server
from trioindex.db.api_keys import Role, create_key
from trioindex.db.pool import connect

WEBHOOK_TOKEN = "hook-" + "7" * 24


@attrs.frozen
class Running:
    """A started service: its base URL, process, log file, environment and bucket."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path
    env: dict[str, str]
    database_url: str = attrs.field(repr=False)
    bucket: str

    def client(self, token: str | None = None, **kwargs: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        kwargs.setdefault("timeout", 60)
        return httpx.Client(base_url=self.url, headers=headers, **kwargs)

    def key(self, name: str, role: str) -> str:
        with connect(self.database_url) as conn:
            return create_key(conn, name, Role(role))[1]

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def service_env(
    database_url: str, storage_url: str, home: Path, embed: FakeEmbedServer, **extra: str
) -> dict[str, str]:
    return base_env(
        TRIOINDEX_DATABASE_URL=database_url,
        TRIOINDEX_STORAGE_URL=storage_url,
        TRIOINDEX_EMBEDDING_API="tei",
        TRIOINDEX_EMBEDDING_URL=embed.url,
        TRIOINDEX_EMBEDDING_MODEL="BAAI/bge-m3",
        TRIOINDEX_EMBEDDING_DIMENSION="1024",
        TRIOINDEX_HOME=str(home),
        TRIOINDEX_HTTP_WEBHOOK_TOKEN=WEBHOOK_TOKEN,
        **FAST_WORKER,
        **extra,
    )


def start(env: dict[str, str], log: Path, *args: str) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    process = spawn(env, "serve", "--port", str(port), *args, log=log)
    try:
        wait_for_port(port, process, 120, "trioindex serve")
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _healthy(url), 60, "/healthz to answer 200")
    except BaseException:
        stop_process(process)
        raise
    return url, process


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture
def service(
    database_url: str,
    s3_url: str,
    s3_server: S3Server,
    tmp_path: Path,
    embed_server: FakeEmbedServer,
) -> Iterator[Running]:
    """``trioindex serve`` with API keys required, on S3, with the webhook token set."""
    env = service_env(database_url, s3_url, tmp_path / "home", embed_server)
    log = tmp_path / "serve.log"
    url, process = start(env, log)
    bucket = s3_url.rsplit("/", 1)[-1].split("?", maxsplit=1)[0]
    try:
        yield Running(url, process, log, env, database_url, bucket)
    finally:
        stop_process(process)
