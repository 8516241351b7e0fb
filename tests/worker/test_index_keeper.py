"""The worker's index keeper on a real PostgreSQL (worker/index_keeper.py): it builds the model's
vector index when it is due, wakes after enough stored vectors, stops once the index is valid,
replaces an older release's float32 index and rebuilds a graph with other parameters at its
first check, waits for the model's jobs under way or due to end before a first build (and looks
again by itself meanwhile), and a worker stopping mid-build does not wait for the build."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import trio
import trio.testing

from testkit.search_corpus import IndexedDocument, store_indexed
from tests import helpers
from trioindex.db import jobs as lifecycle
from trioindex.db.models import EmbeddingModel, ensure_model
from trioindex.db.pool import Connection, Database
from trioindex.db.vector_index import (
    IndexState,
    hnsw_parameters,
    index_parameters,
    index_state,
    quantized_sql,
)
from trioindex.values import FailureType
from trioindex.worker.index_keeper import DEFERRED_RECHECK, VectorIndexKeeper

DIM = 8


def _store(db: Database, model: EmbeddingModel, first: int, n: int) -> None:
    vectors = np.random.default_rng(first).standard_normal((n, DIM)).astype(np.float32)
    with db.connection() as conn:
        store_indexed(
            conn,
            model,
            [IndexedDocument(f"doc-{first + i}", ["t"], vectors[i : i + 1]) for i in range(n)],
        )


def _state(db: Database, model: EmbeddingModel) -> IndexState:
    with db.connection() as conn:
        return index_state(conn, model)


async def test_the_keeper_builds_once_the_stored_vectors_reach_the_threshold(
    db: Database, database_url: str
) -> None:
    with db.connection() as conn:
        model = ensure_model(conn, "m", DIM)
    keeper = VectorIndexKeeper(database_url, model, min_vectors=6, check_every=3)
    assert not await keeper.check()  # no vectors yet
    _store(db, model, 0, 4)
    keeper.note_stored(4)
    assert not await keeper.check()  # 4 of 6
    assert _state(db, model) is IndexState.MISSING
    _store(db, model, 4, 2)
    assert await keeper.check()
    assert (keeper.built, keeper.indexed) == (1, True)
    assert _state(db, model) is IndexState.VALID


async def test_a_check_that_hands_off_sends_a_first_build_that_postgresql_finishes(
    db: Database, database_url: str
) -> None:
    # a drain's last check: the first build is sent and left; the keeper does not know it
    # valid, and the next check finds it built by the server alone
    with db.connection() as conn:
        model = ensure_model(conn, "m", DIM)
    _store(db, model, 0, 6)
    keeper = VectorIndexKeeper(database_url, model, min_vectors=6)
    assert not await keeper.check(hand_off=True)
    assert (keeper.sent, keeper.built, keeper.indexed) == (1, 0, False)
    with db.connection() as conn:
        while helpers.build_lock_held(conn, model):
            pass
    assert await keeper.check(hand_off=True)
    assert (keeper.sent, keeper.built, keeper.indexed) == (1, 0, True)
    assert _state(db, model) is IndexState.VALID


async def test_a_check_that_hands_off_still_runs_a_rebuild_to_its_end(
    db: Database, database_url: str
) -> None:
    # only a first build is left to the server: a rebuild renames and drops after its build
    with db.connection() as conn:
        model = ensure_model(conn, "m", DIM)
    _store(db, model, 0, 4)
    with db.connection() as conn:
        conn.execute(_bit_index_with_other_parameters(conn, model))
    keeper = VectorIndexKeeper(database_url, model, min_vectors=4)
    assert await keeper.check(hand_off=True)
    assert (keeper.sent, keeper.built) == (0, 1)
    with db.connection() as conn:
        assert index_parameters(conn, model.index_name) == hnsw_parameters(DIM)


def _due_with_a_backlog(db: Database) -> EmbeddingModel:
    """A model with 6 vectors (the tests' threshold) and 3 jobs pending."""
    with db.connection() as conn:
        model = ensure_model(conn, "m", DIM)
        for i in range(3):
            helpers.enqueue(conn, model.id, f"pending-{i}")
    _store(db, model, 0, 6)
    return model


def _finish_all(db: Database, model: EmbeddingModel) -> None:
    """Claim and end every job of the model (a failure is an end as good as a success)."""
    with db.connection() as conn:
        for claim in lifecycle.claim_jobs(conn, helpers.worker(conn), 100, 300, model_id=model.id):
            lifecycle.fail_job(
                conn, claim, FailureType.EMBEDDING_RESULT_INVALID, "NaN", helpers.BACKOFF
            )


async def test_a_due_build_waits_until_the_models_jobs_under_way_or_due_have_ended(
    db: Database, database_url: str
) -> None:
    model = _due_with_a_backlog(db)
    keeper = VectorIndexKeeper(database_url, model, min_vectors=6, check_every=3)
    assert not await keeper.check()
    assert keeper.deferred and keeper.built == 0
    with db.connection() as conn:  # claimed, not finished: still the load
        claims = lifecycle.claim_jobs(conn, helpers.worker(conn), 100, 300, model_id=model.id)
    assert len(claims) == 3
    assert not await keeper.check()
    assert keeper.deferred and _state(db, model) is IndexState.MISSING
    with db.connection() as conn:
        for claim in claims:
            lifecycle.fail_job(
                conn, claim, FailureType.EMBEDDING_RESULT_INVALID, "NaN", helpers.BACKOFF
            )
    assert await keeper.check()
    assert (keeper.built, keeper.indexed, keeper.deferred) == (1, True, False)
    assert _state(db, model) is IndexState.VALID


def _float32_index(_conn: Connection, model: EmbeddingModel) -> str:
    return f"""CREATE INDEX {model.retired_index_name} ON embeddings
               USING hnsw ((vector::vector({DIM})) vector_cosine_ops)
               WHERE embedding_model_id = '{model.id}'"""


def _bit_index_with_other_parameters(conn: Connection, model: EmbeddingModel) -> str:
    return f"""CREATE INDEX {model.index_name} ON embeddings
               USING hnsw (({quantized_sql(conn, DIM, "vector")}) bit_hamming_ops)
               WITH (m = 4, ef_construction = 10) WHERE embedding_model_id = '{model.id}'"""


@pytest.mark.parametrize("older", [_float32_index, _bit_index_with_other_parameters])
async def test_the_keeper_replaces_an_older_releases_index_at_its_first_check(
    db: Database, database_url: str, older: Callable[[Connection, EmbeddingModel], str]
) -> None:
    with db.connection() as conn:
        model = ensure_model(conn, "m", DIM)
    _store(db, model, 0, 4)
    with db.connection() as conn:
        conn.execute(older(conn, model))
    # far below the threshold, but the model had an index: it keeps one
    keeper = VectorIndexKeeper(database_url, model, min_vectors=10_000)
    assert await keeper.check()
    assert (keeper.built, keeper.indexed) == (1, True)
    with db.connection() as conn:
        assert index_state(conn, model) is IndexState.VALID
        assert index_parameters(conn, model.index_name) == hnsw_parameters(DIM)
        assert index_state(conn, model, model.retired_index_name) is IndexState.MISSING
    # a second keeper (the next worker start) finds nothing to do
    again = VectorIndexKeeper(database_url, model, min_vectors=10_000)
    assert await again.check()
    assert again.built == 0


class _Observed(VectorIndexKeeper):
    """The real keeper, announcing each finished check (they run in a thread, which Trio's
    test helpers cannot see)."""

    checked: trio.Event
    started: int = 0

    async def check(self) -> bool:
        self.started += 1
        try:
            return await super().check()
        finally:
            self.checked.set()


async def test_serve_checks_again_after_check_every_vectors_and_then_ends(
    db: Database, database_url: str
) -> None:
    with db.connection() as conn:
        model = ensure_model(conn, "m", DIM)
    keeper = _Observed(database_url, model, min_vectors=5, check_every=5)
    keeper.checked = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(keeper.serve)
        with trio.fail_after(30):
            await keeper.checked.wait()  # at start: no vectors
        _store(db, model, 0, 5)
        keeper.checked = trio.Event()
        keeper.note_stored(4)  # below check_every: no check, so no index yet
        await trio.testing.wait_all_tasks_blocked()
        assert keeper._since_check == 4  # a check would have started over from 0
        assert _state(db, model) is IndexState.MISSING
        keeper.note_stored(1)
    # serve returned by itself: the index is valid, nothing is left to watch
    assert keeper.indexed and keeper.built == 1
    assert _state(db, model) is IndexState.VALID
    keeper.note_stored(100)  # and stays quiet
    assert await keeper.check()
    assert keeper.built == 1


async def test_cancelling_a_check_blocked_on_the_database_returns_at_once(
    db: Database, database_url: str
) -> None:
    with db.connection() as conn:
        model = ensure_model(conn, "m", DIM)
    _store(db, model, 0, 3)
    keeper = VectorIndexKeeper(database_url, model, min_vectors=1)
    with db.connection() as holder:
        # a transaction that wrote to the table: CREATE INDEX CONCURRENTLY waits for it to end
        holder.execute("BEGIN")
        holder.execute("UPDATE embeddings SET dimension = dimension")
        with trio.move_on_after(1.0) as scope:
            await keeper.check()
        holder.execute("ROLLBACK")
    assert scope.cancelled_caught and not keeper.indexed
    # the server stopped the build: what it left is INVALID (or nothing), and the next check
    # replaces it with a valid index
    assert _state(db, model) in {IndexState.INVALID, IndexState.MISSING}
    assert await keeper.check()
    assert _state(db, model) is IndexState.VALID


async def test_a_deferred_build_is_checked_again_without_a_wake_up(
    db: Database, database_url: str, mock_clock: trio.testing.MockClock
) -> None:
    model = _due_with_a_backlog(db)
    keeper = _Observed(database_url, model, min_vectors=6, check_every=3)
    keeper.checked = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(keeper.serve)
        await keeper.checked.wait()
        assert keeper.deferred and _state(db, model) is IndexState.MISSING
        _finish_all(db, model)  # no vector is stored after this, so nothing wakes the keeper
        keeper.checked = trio.Event()
        mock_clock.jump(DEFERRED_RECHECK - 1)
        await trio.testing.wait_all_tasks_blocked()
        assert keeper.started == 1
        mock_clock.jump(1)
        await trio.testing.wait_all_tasks_blocked()
        assert keeper.started == 2  # the check runs (in its thread): wait for it
        await keeper.checked.wait()
    # and serve returned by itself: the index is built
    assert (keeper.built, keeper.indexed) == (1, True)
