"""Search with the local model through the Python API (as ``trioindex search`` runs it) on a
real PostgreSQL: it borrows the model a worker of the same home lends, and loads its own only
when nobody lends one; the SQL stays in the searching process.

The lender here is a Trio task holding a fake model named as the local default; loading the
real model is made to fail, so a search that would load it fails the test.
"""

from __future__ import annotations

import functools
import logging
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

import trioindex
import trioindex.api.index
import trioindex.services
from testkit.embed_server import fake_vector
from testkit.processes import base_env
from testkit.search_corpus import IndexedDocument, store_indexed
from tests.helpers import FakeEmbedder
from trioindex.config import Settings, load_settings
from trioindex.db.models import ensure_model
from trioindex.db.pool import Database
from trioindex.embedding import DEFAULT_MODEL, Embedder
from trioindex.embedding.warm import HOW_TO_WARM, lend_model

DIM = 384
TEXTS = ["Workers claim jobs with FOR UPDATE SKIP LOCKED.", "The lease is renewed on time."]


@pytest.fixture
def home() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="tw-", dir="/tmp"))  # a short unix socket path
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def env(database_url: str, home: Path) -> dict[str, str]:
    return base_env(
        TRIOINDEX_DATABASE_URL=database_url,
        TRIOINDEX_EMBEDDING_API="local",
        TRIOINDEX_EMBEDDING_MODEL=DEFAULT_MODEL,
        TRIOINDEX_EMBEDDING_DIMENSION=str(DIM),
        TRIOINDEX_HOME=str(home),
    )


@pytest.fixture
def settings(env: dict[str, str], home: Path, db: Database) -> Settings:
    with db.connection() as conn:
        vectors = [fake_vector(t, DIM) for t in TEXTS]
        store_indexed(
            conn,
            ensure_model(conn, DEFAULT_MODEL, DIM),
            [IndexedDocument("queue.md", TEXTS, vectors)],
        )
    return load_settings(environ=env, cwd=home)


class OwnModel:
    """Stands in for loading the local model in the searching process."""

    def __init__(self, allowed: bool, monkeypatch: pytest.MonkeyPatch) -> None:
        self.allowed = allowed
        self.opened = 0
        for module in (trioindex.services, trioindex.api.index):
            monkeypatch.setattr(module, "open_configured_embedder", self)

    async def __call__(self, settings: Settings) -> Embedder:
        assert self.allowed, "the search loaded its own model while a worker lends one"
        self.opened += 1
        return FakeEmbedder(dimension=DIM, model=DEFAULT_MODEL)


async def test_search_borrows_the_model_of_a_worker_of_its_home(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    OwnModel(False, monkeypatch)
    lender = FakeEmbedder(dimension=DIM, model=DEFAULT_MODEL)
    async with trio.open_nursery() as nursery:
        assert await nursery.start(lend_model, settings.home, lender) is not None
        async with trioindex.Index.open(settings) as index:
            [hit] = await index.search(TEXTS[1], mode="vector")
            assert hit.document_key == "queue.md"
            assert hit.chunks[0].chunk_index == 1
            assert hit.score == pytest.approx(1.0, abs=1e-5)
            [again] = await index.search(TEXTS[0], mode="vector")
            assert again.chunks[0].chunk_index == 0
        assert lender.calls == 2
        nursery.cancel_scope.cancel()


async def test_search_without_a_worker_loads_the_model_and_says_how_to_be_fast(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    own = OwnModel(True, monkeypatch)
    with caplog.at_level(logging.WARNING, logger="trioindex.embedding.warm"):
        async with trioindex.Index.open(settings) as index:
            [hit] = await index.search(TEXTS[1], mode="vector")
            await index.search(TEXTS[0], mode="vector")
    assert hit.chunks[0].chunk_index == 1
    assert own.opened == 1
    assert [r.getMessage() for r in caplog.records if r.name.endswith("warm")] == [
        f"search: loading the model in this process; {HOW_TO_WARM}"
    ]


async def test_a_service_keeps_its_own_model(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    own = OwnModel(True, monkeypatch)
    async with trio.open_nursery() as nursery:
        lender = FakeEmbedder(dimension=DIM, model=DEFAULT_MODEL)
        await nursery.start(lend_model, settings.home, lender)
        async with trioindex.Index.open(settings) as index:
            await index.open_model()
            await index.search(TEXTS[1], mode="vector")
        assert (own.opened, lender.calls) == (1, 0)
        nursery.cancel_scope.cancel()


async def test_the_search_command_borrowing_a_model_imports_no_torch(
    settings: Settings, env: dict[str, str]
) -> None:
    lender = FakeEmbedder(dimension=DIM, model=DEFAULT_MODEL)
    async with trio.open_nursery() as nursery:
        await nursery.start(lend_model, settings.home, lender)
        command = [sys.executable, "-X", "importtime", "-m", "trioindex.cli", "search", TEXTS[1]]
        done = await trio.run_process(
            [*command, "--mode", "vector", "--top-k", "1"], env=env, capture_stdout=True,
            capture_stderr=True, check=False,
        )  # fmt: skip
        nursery.cancel_scope.cancel()
    stdout, stderr = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 0, stderr[-2000:]
    assert "queue.md" in stdout and lender.calls == 1
    imported = re.findall(r"^import time:.*\|\s*([\w.]+)$", stderr, re.MULTILINE)
    assert "trioindex.embedding.warm" in imported
    heavy = [  # numpy too: a query vector is checked without it
        m
        for m in imported
        if m.split(".")[0] in {"torch", "transformers", "sentence_transformers", "numpy"}
    ]
    assert heavy == []
    assert "loading the model" not in stderr


async def test_a_service_with_the_local_model_lends_it_to_the_searches_of_its_home(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``trioindex serve`` (run_service, in this process) lends the model it loaded, as a
    worker does; a search of the same home then borrows it and loads nothing; the socket goes
    when the service stops."""
    from testkit.processes import free_port
    from trioindex.embedding.warm import lenders
    from trioindex.http import server
    from trioindex.http.server import run_service

    served = OwnModel(True, monkeypatch)  # the service's own model: a fake, loaded once
    lent = trio.Event()
    lend = server.lend_if_local

    async def lend_and_say(
        *args: Any, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED
    ) -> None:  # the service's own lending, and a word to this test once it listens
        async with trio.open_nursery() as inner:
            task_status.started(await inner.start(functools.partial(lend, *args)))
            lent.set()

    monkeypatch.setattr(server, "lend_if_local", lend_and_say)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            functools.partial(run_service, settings, host="127.0.0.1", port=free_port())
        )
        with trio.fail_after(60):
            await lent.wait()
        assert len(lenders(settings.home)) == 1
        served.allowed = False  # from here, a search that loads its own model fails
        async with trioindex.Index.open(settings) as index:
            [hit] = await index.search(TEXTS[1], mode="vector")
        assert hit.document_key == "queue.md" and hit.chunks[0].chunk_index == 1
        assert served.opened == 1
        nursery.cancel_scope.cancel()
    assert lenders(settings.home) == []
