"""A model's vector index on a real PostgreSQL (db/vector_index.py): none at registration, built
once the model has enough vectors, one builder at a time, an interrupted build built again, an
older release's float32 index replaced, a graph with other build parameters rebuilt beside
the one search uses, and vector search answering the exact top k before and after."""

from __future__ import annotations

import contextlib
import re
import threading
import uuid
from collections.abc import Callable, Iterator

import numpy as np
import psycopg
import pytest

from testkit.search_corpus import IndexedDocument, store_indexed
from tests import helpers
from trioindex.db import jobs as lifecycle
from trioindex.db.models import INDEX_BUILD_LOCK, EmbeddingModel, ensure_model, remove_model
from trioindex.db.pool import Connection, Database, connect
from trioindex.db.search import NO_FILTERS, Filters, HnswSettings, IterativeScan, nearest_chunks
from trioindex.db.vector_index import (
    DEFER_FACTOR,
    IndexState,
    build_deferred,
    build_vector_index,
    candidate_count,
    create_index_sql,
    has_vectors,
    hnsw_parameters,
    index_parameters,
    index_state,
    loading,
    quantized_sql,
    send_first_build,
)
from trioindex.errors import TrioindexError
from trioindex.search import text_ranking, vector_ranking
from trioindex.values import BackoffPolicy, FailOutcome, FailureType

DIM = 8


def _store(conn: Connection, model: EmbeddingModel, n: int, seed: int = 1) -> np.ndarray:
    vectors = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    docs = [IndexedDocument(f"doc-{i:03}", [f"text {i}"], vectors[i : i + 1]) for i in range(n)]
    store_indexed(conn, model, docs)
    return vectors


def _plan(conn: Connection, model: EmbeddingModel) -> str:
    """The plan of the indexed candidate query (sign bits by Hamming distance)."""
    order = f"{quantized_sql(conn, DIM, 'vector')} <~> {quantized_sql(conn, DIM, '%s')}"
    with conn.transaction():
        conn.execute("SET LOCAL enable_seqscan = off")
        rows = conn.execute(
            f"""EXPLAIN SELECT id FROM embeddings WHERE embedding_model_id = %s
                ORDER BY {order} LIMIT 3""",
            (model.id, [0.1] * DIM),
        ).fetchall()
    return "\n".join(next(iter(r.values())) for r in rows)


def _float32_index(conn: Connection, model: EmbeddingModel) -> None:
    """What an older release built: float32 HNSW over the model's vectors."""
    conn.execute(
        f"""CREATE INDEX {model.retired_index_name} ON embeddings
            USING hnsw ((vector::vector({DIM})) vector_cosine_ops)
            WHERE embedding_model_id = '{model.id}'"""
    )


def test_registration_creates_no_index_and_the_build_waits_for_enough_vectors(
    db: Database,
) -> None:
    with db.connection() as conn:
        model = ensure_model(conn, "m", DIM)
        assert index_state(conn, model) is IndexState.MISSING
        _store(conn, model, 20)
        assert has_vectors(conn, model, 20) and not has_vectors(conn, model, 21)
        assert build_vector_index(conn, model, min_vectors=21) is False
        assert index_state(conn, model) is IndexState.MISSING
        assert build_vector_index(conn, model, min_vectors=20) is True
        assert index_state(conn, model) is IndexState.VALID
        assert model.index_name in _plan(conn, model)
        # a valid index is never built again
        assert build_vector_index(conn, model, min_vectors=0) is False


def test_a_first_build_waits_while_a_job_is_under_way_or_due_up_to_defer_factor_times_the_threshold(
    db: Database,
) -> None:
    with db.connection() as conn:
        model = ensure_model(conn, "m", DIM)
        _store(conn, model, 20)
        assert not loading(conn, model) and not build_deferred(conn, model, min_vectors=20)
        jobs = [helpers.enqueue(conn, model.id, f"pending-{i}") for i in range(2)]
        assert all(j.job_id is not None for j in jobs) and loading(conn, model)
        # not due yet (21 vectors wanted): nothing to defer
        assert not build_deferred(conn, model, min_vectors=21)
        # due, jobs pending: the build waits
        assert build_deferred(conn, model, min_vectors=20)
        assert build_deferred(conn, model, min_vectors=20 // DEFER_FACTOR + 1)
        # index-min-vectors 0 asks for the index from the first vector: never deferred
        assert not build_deferred(conn, model, min_vectors=0)
        # the model already has DEFER_FACTOR times the threshold: build now
        assert not build_deferred(conn, model, min_vectors=20 // DEFER_FACTOR)
        # both claimed, then one fails and is retried in an hour: the other, PROCESSING, is
        # still the load
        retried, running = lifecycle.claim_jobs(
            conn, helpers.worker(conn), 2, 300, model_id=model.id
        )
        later = BackoffPolicy(initial=3600, maximum=3600, jitter=0)
        unavailable = FailureType.EMBEDDING_PROVIDER_UNAVAILABLE
        outcome = lifecycle.fail_job(conn, retried, unavailable, "down", later).outcome
        assert outcome is FailOutcome.RETRY_SCHEDULED
        assert build_deferred(conn, model, min_vectors=20)
        # the other ended: a retry due later is not a load, build now
        lifecycle.fail_job(conn, running, FailureType.EMBEDDING_RESULT_INVALID, "NaN", later)
        assert not loading(conn, model) and not build_deferred(conn, model, min_vectors=20)
        # the retry came due: a load again
        helpers.make_available(conn, retried.job_id)
        assert build_deferred(conn, model, min_vectors=20)
        _float32_index(conn, model)
        # an index to replace is never deferred
        assert not build_deferred(conn, model, min_vectors=20)


def test_vector_search_ranks_the_same_exactly_and_through_the_index(db: Database) -> None:
    with db.connection() as conn:
        model = ensure_model(conn, "m", DIM)
        vectors = _store(conn, model, 30)
        query = vectors[7] + 0.01
        exact = [r.document_key for r in vector_ranking(conn, model, query, 5)]
        assert model.index_name not in _plan(conn, model)
        assert build_vector_index(conn, model, min_vectors=30)
        indexed = [r.document_key for r in vector_ranking(conn, model, query, 5)]
    assert exact[0] == "doc-007"
    assert indexed == exact  # 30 vectors, all of them candidates: the exact top 5


def _store_clusters(
    conn: Connection, rng: np.random.Generator, dim: int, n: int
) -> tuple[EmbeddingModel, np.ndarray, np.ndarray]:
    """``n`` vectors in clusters of 10 around random centres, one document each (``doc-000``,
    ...) of a model called "wide": the model, the centres and the vectors."""
    centres = rng.standard_normal((n // 10, dim)).astype(np.float32)
    noise = 0.3 * rng.standard_normal((n, dim)).astype(np.float32)
    vectors = np.repeat(centres, 10, axis=0) + noise
    model = ensure_model(conn, "wide", dim)
    docs = [IndexedDocument(f"doc-{i:03}", [f"t {i}"], vectors[i : i + 1]) for i in range(n)]
    store_indexed(conn, model, docs)
    return model, centres, vectors


def test_search_through_the_index_returns_the_exact_top_k_and_before_it_scans_exactly(
    db: Database,
) -> None:
    # 600 vectors in 60 clusters of 10, 64 dimensions: each query's 10 nearest by cosine
    # computed here, and the ranking before the index (an exact scan) and through it (200
    # candidates by their sign bits, re-ranked by cosine) both return exactly those, in order
    dim, n = 64, 600
    rng = np.random.default_rng(5)
    with db.connection() as conn:
        model, centres, vectors = _store_clusters(conn, rng, dim, n)
        queries = centres[:20] + 0.3 * rng.standard_normal((20, dim)).astype(np.float32)
        unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        truth = [
            [f"doc-{i:03}" for i in np.argsort(-(unit @ (q / np.linalg.norm(q))))[:10]]
            for q in queries
        ]
        before = [[r.document_key for r in vector_ranking(conn, model, q, 10)] for q in queries]
        assert build_vector_index(conn, model, min_vectors=n)
        assert index_state(conn, model) is IndexState.VALID
        after = [[r.document_key for r in vector_ranking(conn, model, q, 10)] for q in queries]
    assert before == truth
    assert after == truth


def test_a_deeper_list_ranked_from_a_shorter_lists_candidates(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    # hybrid ranks its vector list twice as deep as the chunks asked for, from the candidates
    # of a list as deep as those: its first ranks are a vector search's
    dim, n = 64, 600
    rng = np.random.default_rng(6)
    with db.connection() as conn:
        model, centres, _ = _store_clusters(conn, rng, dim, n)
        assert build_vector_index(conn, model, min_vectors=n)
        query = centres[3] + 0.3 * rng.standard_normal(dim).astype(np.float32)
        top = [r.document_key for r in vector_ranking(conn, model, query, 5)]
        deeper = vector_ranking(conn, model, query, 10, candidates_for=5)
        # one candidate per result: a list never takes fewer candidates than it is deep
        monkeypatch.setattr("trioindex.db.vector_index.NARROW_RERANK_FACTOR", 1)
        short = vector_ranking(conn, model, query, 10, candidates_for=3)
    assert [r.document_key for r in deeper[:5]] == top
    assert len(deeper) == 10 and len(short) == 10
    assert [r.score for r in deeper] == sorted((r.score for r in deeper), reverse=True)


@contextlib.contextmanager
def _plans_run(conn: Connection) -> Iterator[list[str]]:
    """The plans of every statement run inside (those a function runs too), as auto_explain
    sends them to this session."""
    plans: list[str] = []

    def keep(diagnostic: psycopg.errors.Diagnostic) -> None:
        if "plan:" in (diagnostic.message_primary or ""):
            plans.append(diagnostic.message_primary or "")

    conn.execute("LOAD 'auto_explain'")
    for setting in ("log_min_duration = 0", "log_nested_statements = on", "log_verbose = on"):
        conn.execute(f"SET auto_explain.{setting}")
    conn.execute("SET client_min_messages = log")
    conn.add_notice_handler(keep)
    try:
        yield plans
    finally:
        conn.remove_notice_handler(keep)
        conn.execute("RESET client_min_messages")


def test_the_filters_are_inlined_and_the_ranking_still_scans_the_index(db: Database) -> None:
    # the one text of the filters (trioindex_search_filters_pass) is expanded in place by the
    # planner, in the vector ranking's statement as in the text ranking's, the filters given
    # folded into constants and those not given gone: no function call per row, and the
    # vector ranking's candidates still come from the bit index
    dim, n = 64, 600
    rng = np.random.default_rng(7)
    filters = Filters(content_types=("text",), low_confidence=False)
    with db.connection() as conn:
        model, centres, _ = _store_clusters(conn, rng, dim, n)
        assert build_vector_index(conn, model, min_vectors=n)
        with _plans_run(conn) as plans:
            hits = vector_ranking(conn, model, centres[12], 5, filters=filters)
            texts = text_ranking(conn, model, "125", 5, filters=filters)
    assert {h.document_key for h in hits} <= {f"doc-{i}" for i in range(120, 130)}
    assert [h.document_key for h in texts] == ["doc-125"]
    # (the query's text, then its plan)
    calling = [p.split("(cost=", 1) for p in plans if "trioindex_search_filters_pass(" in p]
    ranking = [body for text, body in calling if "<~>" in text]
    assert len(calling) == 2 and len(ranking) == 1  # the vector and the text ranking's
    for _, body in calling:
        assert "trioindex_search_filters_pass" not in body
        assert re.search(r"split_part\(v(_\d+)?\.content_type, '/'::text, 1\) = ANY", body)
        assert re.search(r"v(_\d+)?\.ocr_low_confidence_pages IS NULL", body)
        assert "starts_with" not in body
    assert f"Index Scan using {model.index_name}" in ranking[0]


def test_narrow_vectors_take_twice_the_candidates_per_result_up_to_the_ceiling() -> None:
    # fewer sign bits say less about cosine: 40 per result below 768 dimensions, 20 from there
    assert (candidate_count(10, 384), candidate_count(10, 768)) == (400, 200)
    assert candidate_count(50, 384) == candidate_count(50, 1024) == 1000
    assert candidate_count(2000, 384) == 2000  # never fewer than the results asked for


def test_the_ranking_sets_the_scan_for_its_transaction_once_indexed(db: Database) -> None:
    """The ranking statement makes pgvector's scan settings for its own transaction, and only
    while it ranks through the index: read back inside an explicit transaction, and gone after
    it (an autocommit ranking leaves the pooled connection as it found it)."""

    def scan_settings() -> tuple[str, str]:
        row = conn.execute(
            """SELECT current_setting('hnsw.ef_search') AS ef,
                      current_setting('hnsw.iterative_scan') AS scan"""
        ).fetchone()
        assert row is not None
        return row["ef"], row["scan"]

    def rank(ef_search: int | None, scan: IterativeScan) -> int:
        hnsw = HnswSettings(ef_search=ef_search, iterative_scan=scan)
        return len(nearest_chunks(conn, model, [0.1] * DIM, 3, filters=NO_FILTERS, hnsw=hnsw))

    with db.connection() as conn:
        model = ensure_model(conn, "m", DIM)
        _store(conn, model, 5)
        conn.execute("SELECT '[1]'::vector")  # pgvector loaded: its settings exist
        server = scan_settings()
        assert server == ("40", "off")
        with conn.transaction():
            assert rank(200, "relaxed_order") == 3
            assert scan_settings() == server  # exact search: nothing to set
        assert build_vector_index(conn, model, min_vectors=5)
        with conn.transaction():
            assert rank(200, "relaxed_order") == 3
            assert scan_settings() == ("200", "relaxed_order")
        assert scan_settings() == server
        assert rank(300, "relaxed_order") == 3  # autocommit: its own transaction
        assert scan_settings() == server


def test_a_float32_index_left_beside_a_valid_bit_index_is_dropped(db: Database) -> None:
    # a process stopped between the build and the drop: the next check drops the old index
    with db.connection() as conn:
        model = ensure_model(conn, "m", DIM)
        _store(conn, model, 5)
        assert build_vector_index(conn, model, min_vectors=1)
        _float32_index(conn, model)
        assert build_vector_index(conn, model, min_vectors=1) is False
        assert index_state(conn, model) is IndexState.VALID
        assert index_state(conn, model, model.retired_index_name) is IndexState.MISSING


def _index_with(conn: Connection, model: EmbeddingModel, name: str, m: int, efc: int) -> None:
    """A bit graph of the model built with other parameters than today's."""
    assert (m, efc) != hnsw_parameters(model.dimension)
    conn.execute(
        f"""CREATE INDEX {name} ON embeddings
            USING hnsw (({quantized_sql(conn, model.dimension, "vector")}) bit_hamming_ops)
            WITH (m = {m}, ef_construction = {efc}) WHERE embedding_model_id = '{model.id}'"""
    )


def _only_the_index_with_todays_parameters(conn: Connection, model: EmbeddingModel) -> None:
    assert index_state(conn, model) is IndexState.VALID
    assert index_parameters(conn, model.index_name) == hnsw_parameters(model.dimension)
    assert index_state(conn, model, model.retired_index_name) is IndexState.MISSING
    assert index_state(conn, model, model.next_index_name) is IndexState.MISSING
    assert model.index_name in _plan(conn, model)


def _bit_index_with_other_parameters(conn: Connection, model: EmbeddingModel) -> None:
    _index_with(conn, model, model.index_name, 4, 10)
    assert index_parameters(conn, model.index_name) == (4, 10)


@pytest.mark.parametrize("older", [_float32_index, _bit_index_with_other_parameters])
def test_an_older_releases_index_is_replaced_by_the_bit_index_with_todays_parameters(
    db: Database, older: Callable[[Connection, EmbeddingModel], None]
) -> None:
    with db.connection() as conn:
        model = ensure_model(conn, "m", DIM)
        vectors = _store(conn, model, 12)
        older(conn, model)
        # replaced whatever the count: the model was indexed before, search keeps an index
        assert build_vector_index(conn, model, min_vectors=1_000_000) is True
        _only_the_index_with_todays_parameters(conn, model)
        top = [r.document_key for r in vector_ranking(conn, model, vectors[3], 3)]
        assert top[0] == "doc-003"
        assert build_vector_index(conn, model, min_vectors=0) is False


def test_an_index_without_build_parameters_has_pgvectors_defaults(db: Database) -> None:
    with db.connection() as conn:
        model = ensure_model(conn, "m", DIM)
        _store(conn, model, 3)
        assert index_parameters(conn, model.index_name) is None
        conn.execute(
            f"""CREATE INDEX {model.index_name} ON embeddings
                USING hnsw (({quantized_sql(conn, DIM, "vector")}) bit_hamming_ops)"""
        )
        assert index_parameters(conn, model.index_name) == (16, 64)


def test_a_rebuild_stopped_after_its_build_takes_the_name_at_the_next_check(
    db: Database,
) -> None:
    with db.connection() as conn:
        model = ensure_model(conn, "m", DIM)
        _store(conn, model, 6)
        _index_with(conn, model, model.index_name, 4, 10)
        # the new graph was built, the process stopped before the names were swapped
        conn.execute(create_index_sql(conn, model, concurrently=False, name=model.next_index_name))
        next_oid = conn.execute("SELECT %s::regclass::oid AS o", (model.next_index_name,))
        built_oid = next_oid.fetchone()
        assert build_vector_index(conn, model, min_vectors=1) is True
        _only_the_index_with_todays_parameters(conn, model)
        now = conn.execute("SELECT %s::regclass::oid AS o", (model.index_name,)).fetchone()
        assert now == built_oid  # taken over, not built a second time


def test_a_rebuild_interrupted_during_its_build_is_built_again(db: Database) -> None:
    with db.connection() as conn:
        model = ensure_model(conn, "m", DIM)
        _store(conn, model, 6)
        _index_with(conn, model, model.index_name, 4, 10)
        conn.execute(create_index_sql(conn, model, concurrently=False, name=model.next_index_name))
        conn.execute(
            "UPDATE pg_index SET indisvalid = false WHERE indexrelid = %s::regclass",
            (model.next_index_name,),
        )
        assert build_vector_index(conn, model, min_vectors=1) is True
        _only_the_index_with_todays_parameters(conn, model)


def test_search_keeps_the_old_index_while_the_rebuild_waits(db: Database) -> None:
    # A real CREATE INDEX CONCURRENTLY of the new graph kept waiting by an open snapshot:
    # meanwhile the model's index is the old, valid one and search ranks through it
    with db.connection() as conn:
        model = ensure_model(conn, "m", DIM)
        vectors = _store(conn, model, 8)
        _index_with(conn, model, model.index_name, 4, 10)
    built: list[bool] = []
    with _build_waiting_on_a_snapshot(db, model, built) as watcher:
        assert index_state(watcher, model, model.next_index_name) is IndexState.INVALID
        assert index_state(watcher, model) is IndexState.VALID
        assert index_parameters(watcher, model.index_name) == (4, 10)
        assert model.index_name in _plan(watcher, model)
        top = [r.document_key for r in vector_ranking(watcher, model, vectors[5], 1)]
        assert top == ["doc-005"]
    assert built == [True]
    with db.connection() as conn:
        _only_the_index_with_todays_parameters(conn, model)


def test_removing_a_model_drops_a_rebuild_left_beside_its_index(db: Database) -> None:
    with db.connection() as conn:
        ensure_model(conn, "serving", DIM)
        model = ensure_model(conn, "m", DIM)
        _store(conn, model, 4)
        _index_with(conn, model, model.index_name, 4, 10)
        conn.execute(create_index_sql(conn, model, concurrently=False, name=model.next_index_name))
        remove_model(conn, "m")
        for name in (model.index_name, model.next_index_name):
            assert index_state(conn, model, name) is IndexState.MISSING


def test_a_session_already_building_makes_another_skip(db: Database) -> None:
    with db.connection() as builder, db.connection() as other:
        model = ensure_model(builder, "m", DIM)
        _store(builder, model, 5)
        builder.execute(
            "SELECT pg_advisory_lock(%s::int, hashtext(%s))", (INDEX_BUILD_LOCK, str(model.id))
        )
        assert build_vector_index(other, model, min_vectors=1) is False
        assert index_state(other, model) is IndexState.MISSING
        builder.execute(
            "SELECT pg_advisory_unlock(%s::int, hashtext(%s))", (INDEX_BUILD_LOCK, str(model.id))
        )
        assert build_vector_index(other, model, min_vectors=1) is True
        # and the builder let its lock go: the next caller is not shut out
        free = other.execute(
            "SELECT pg_try_advisory_lock(%s::int, hashtext(%s)) AS got",
            (INDEX_BUILD_LOCK, str(model.id)),
        ).fetchone()
        assert free is not None and free["got"]


def test_a_first_build_sent_and_left_is_finished_by_postgresql(
    db: Database, database_url: str
) -> None:
    # What a draining worker does at its end: the build is sent, and its connection closed
    # while the build still waits (on an open snapshot); the server finishes it alone, its
    # build lock held until then, and the index ends valid, even on a server that polls its
    # clients for a lost connection (which cancels a statement whose client left)
    with db.connection() as conn:
        model = ensure_model(conn, "m", DIM)
        vectors = _store(conn, model, 6)
        conn.execute(
            f'ALTER DATABASE "{conn.info.dbname}" SET client_connection_check_interval = 10'
        )
    with db.connection() as blocker, db.connection() as watcher:
        blocker.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        blocker.execute("SELECT count(*) FROM embedding_models")  # a snapshot the build waits on
        sender = connect(database_url)
        pid = sender.info.backend_pid
        assert send_first_build(sender, model, min_vectors=6) is True
        sender.close()
        while not helpers.waits_on_a_lock(watcher, pid):
            assert _backend_alive(watcher, pid), "the build ended with its client"
        assert index_state(watcher, model) is IndexState.INVALID
        assert helpers.build_lock_held(watcher, model)
        assert build_vector_index(watcher, model, min_vectors=1) is False  # another skips
        blocker.execute("COMMIT")
        while _backend_alive(watcher, pid):
            pass
        assert index_state(watcher, model) is IndexState.VALID
        assert index_parameters(watcher, model.index_name) == hnsw_parameters(DIM)
        assert not helpers.build_lock_held(watcher, model)
        assert model.index_name in _plan(watcher, model)
        top = [r.document_key for r in vector_ranking(watcher, model, vectors[4], 1)]
        assert top == ["doc-004"]


def _backend_alive(conn: Connection, pid: int) -> bool:
    row = conn.execute("SELECT count(*) AS n FROM pg_stat_activity WHERE pid = %s", (pid,))
    found = row.fetchone()
    return found is not None and found["n"] > 0


def test_only_a_due_first_build_is_sent_and_otherwise_the_session_goes_on(db: Database) -> None:
    # too few vectors, or an index of any kind (to finish, replace or rename): nothing is
    # sent, the build lock is let go and the connection answers the next statement
    with db.connection() as conn:
        model = ensure_model(conn, "m", DIM)
        _store(conn, model, 3)
        assert send_first_build(conn, model, min_vectors=4) is False
        assert not helpers.build_lock_held(conn, model)
        _index_with(conn, model, model.index_name, 4, 10)
        assert send_first_build(conn, model, min_vectors=1) is False
        assert not helpers.build_lock_held(conn, model)
        assert index_parameters(conn, model.index_name) == (4, 10)


def test_an_interrupted_build_is_dropped_and_built_again(db: Database) -> None:
    with db.connection() as conn:
        model = ensure_model(conn, "m", DIM)
        _store(conn, model, 5)
        assert build_vector_index(conn, model, min_vectors=1)
        # what a cancelled CREATE INDEX CONCURRENTLY leaves behind
        conn.execute(
            "UPDATE pg_index SET indisvalid = false WHERE indexrelid = %s::regclass",
            (model.index_name,),
        )
        assert index_state(conn, model) is IndexState.INVALID
        assert build_vector_index(conn, model, min_vectors=1) is True
        assert index_state(conn, model) is IndexState.VALID


def test_a_model_past_the_float32_limit_is_indexed_by_its_bits(db: Database) -> None:
    # pgvector's float32 HNSW stops at 2,000 dimensions, its bit HNSW at 64,000
    dim = 2001
    with db.connection() as conn:
        model = ensure_model(conn, "wide", dim)
        vectors = np.random.default_rng(2).standard_normal((3, dim)).astype(np.float32)
        docs = [IndexedDocument(f"doc-{i}", [f"t {i}"], vectors[i : i + 1]) for i in range(3)]
        store_indexed(conn, model, docs)
        assert build_vector_index(conn, model, min_vectors=1) is True
        assert index_state(conn, model) is IndexState.VALID
        # a wide model's graph is built with the wide parameters, a narrow one's thinner
        assert index_parameters(conn, model.index_name) == hnsw_parameters(dim)
        assert hnsw_parameters(dim) != hnsw_parameters(DIM)
        assert vector_ranking(conn, model, vectors[1], 1)[0].document_key == "doc-1"


@pytest.mark.parametrize("dimension", [64_001])
def test_a_model_beyond_pgvectors_bit_hnsw_limit_gets_no_index(
    db: Database, dimension: int
) -> None:
    with db.connection() as conn:
        model = EmbeddingModel(uuid.uuid4(), "too-wide", dimension, False)
        assert build_vector_index(conn, model, min_vectors=0) is False
        assert index_state(conn, model) is IndexState.MISSING


def test_removing_a_model_during_its_index_build_is_refused_until_the_build_ends(
    db: Database,
) -> None:
    # A real build kept waiting by an open transaction, and `models remove` of the model
    # meanwhile: before
    # migration 0008's lock this was a deadlock that PostgreSQL broke by cancelling one side.
    with db.connection() as conn:
        ensure_model(conn, "serving", DIM)
        model = ensure_model(conn, "m", DIM)
        _store(conn, model, 5)
    built: list[bool] = []
    with _build_waiting_on_a_snapshot(db, model, built), db.connection() as remover:
        # bounded: without the build lock the removal would wait for the build's table
        # lock while the build waits for this test
        remover.execute("SET lock_timeout = '10s'")
        with pytest.raises(TrioindexError, match="building"):
            remove_model(remover, "m")
        remover.execute("RESET lock_timeout")
    assert built == [True]
    with db.connection() as conn:
        assert index_state(conn, model) is IndexState.VALID
        assert remove_model(conn, "m").embeddings == 5
        assert index_state(conn, model) is IndexState.MISSING
        # a build after the removal (a keeper holding the old model) builds nothing
        assert build_vector_index(conn, model, min_vectors=0) is False
        assert index_state(conn, model) is IndexState.MISSING


@contextlib.contextmanager
def _build_waiting_on_a_snapshot(
    db: Database, model: EmbeddingModel, built: list[bool]
) -> Iterator[Connection]:
    """A real ``build_vector_index`` in a thread, its CREATE INDEX CONCURRENTLY kept waiting
    by an open transaction (it waits for every transaction older than its snapshot) while the
    block runs on the connection it yields; then the transaction ends and the build finishes
    (its result appended to ``built``)."""
    with db.connection() as blocker, db.connection() as watcher:
        blocker.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        blocker.execute("SELECT count(*) FROM embedding_models")  # a snapshot the build waits on
        pid: list[int] = []
        builder = threading.Thread(
            target=lambda: built.append(_build_on_own_connection(db, model, pid)), daemon=True
        )
        builder.start()
        while not (pid and helpers.waits_on_a_lock(watcher, pid[0])):
            assert builder.is_alive(), "the build did not wait for the open snapshot"
        try:
            yield watcher
        finally:
            blocker.execute("COMMIT")
            builder.join(timeout=60)


def _build_on_own_connection(db: Database, model: EmbeddingModel, pid: list[int]) -> bool:
    with db.connection() as conn:
        pid.append(conn.info.backend_pid)
        return build_vector_index(conn, model, min_vectors=1)
