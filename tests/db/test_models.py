"""The model switch on a real PostgreSQL (db/models.py, migration 0006): which model serves,
activation's jobs, the switch in one transaction once every current version is covered, new
ingests during a switch, an activation racing an ingest, and removing a model."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from uuid import UUID

import numpy as np
import pytest

from tests import helpers
from trioindex.db import jobs as lifecycle
from trioindex.db.documents import delete_documents
from trioindex.db.models import (
    EmbeddingModel,
    ModelNotServing,
    activate_model,
    check_serving,
    model_list,
    remove_model,
    serving_model,
)
from trioindex.db.pool import Connection, Database
from trioindex.db.steps import (
    EmbeddingCommit,
    StoredSlice,
    begin_embedding,
    store_embeddings_many,
)
from trioindex.errors import FailureType, ModelRemoved, TrioindexError
from trioindex.pipeline.embed_step import drafts_from_matrix

OLD, NEW = "old-model", "new-model"


@pytest.fixture
def worker(db: Database) -> UUID:
    with db.connection() as conn:
        return helpers.worker(conn)


def _index(conn: Connection, worker: UUID, model: EmbeddingModel, key: str, data: bytes) -> None:
    """Ingest ``key`` and run its job for ``model`` to completion (chunks staged by hand)."""
    helpers.enqueue(conn, model.id, key, content=data)
    _complete_pending(conn, worker, model)


def _complete_pending(conn: Connection, worker: UUID, model: EmbeddingModel) -> int:
    """Claim and complete every PENDING job of ``model``, the way the steps leave a version:
    chunks stored once (reused when another model stored them), then this model's vectors."""
    done = 0
    while claims := lifecycle.claim_jobs(conn, worker, 10, 300, model_id=model.id):
        for claim in claims:
            chunks = conn.execute(
                "SELECT id, document_id FROM document_chunks WHERE document_version_id = %s",
                (claim.document_version_id,),
            ).fetchall()
            if not chunks:
                helpers.stage_embedded(conn, claim, dimension=model.dimension, chunks=2)
            else:
                vector = "[" + ",".join(["0.5"] * model.dimension) + "]"
                for chunk in chunks:
                    conn.execute(
                        """INSERT INTO embeddings (chunk_id, document_id, document_version_id,
                               embedding_model_id, vector, dimension, vector_sha256)
                           VALUES (%s, %s, %s, %s, %s, %s, %s)""",
                        (
                            chunk["id"],
                            chunk["document_id"],
                            claim.document_version_id,
                            model.id,
                            vector,
                            model.dimension,
                            "c" * 64,
                        ),
                    )
            lifecycle.complete_job(conn, claim)
            done += 1
    return done


def _searchable(conn: Connection, model: EmbeddingModel) -> set[str]:
    """Keys whose version ``model`` serves has its vectors (what search over it can rank)."""
    rows = conn.execute(
        """SELECT DISTINCT d.external_key FROM served_versions s
           JOIN documents d ON d.id = s.document_id
           JOIN embeddings e ON e.document_version_id = s.document_version_id
                            AND e.embedding_model_id = s.embedding_model_id
           WHERE s.embedding_model_id = %s""",
        (model.id,),
    ).fetchall()
    return {r["external_key"] for r in rows}


def _served(conn: Connection, model: EmbeddingModel | None = None) -> dict[str, int]:
    """Key → version number that ``model`` (default: the serving model) serves."""
    rows = conn.execute(
        """SELECT d.external_key, v.version_no FROM served_versions s
           JOIN documents d ON d.id = s.document_id
           JOIN document_versions v ON v.id = s.document_version_id
           WHERE s.embedding_model_id = coalesce(%s, (SELECT id FROM embedding_models
                                                      WHERE is_active))""",
        (None if model is None else model.id,),
    ).fetchall()
    return {r["external_key"]: r["version_no"] for r in rows}


def _current_keys(conn: Connection) -> set[str]:
    """Keys the serving model serves (what search finds)."""
    return set(_served(conn))


def test_the_first_model_serves_and_a_query_with_another_is_refused(db: Database) -> None:
    with db.connection() as conn:
        assert serving_model(conn) is None
        old = helpers.model(conn, OLD, 4)
        other = helpers.model(conn, NEW, 8)
        assert serving_model(conn) == old
        assert check_serving(conn, old) == old
        with pytest.raises(ModelNotServing, match="served by model 'old-model'"):
            check_serving(conn, other)


def test_a_switch_enqueues_one_job_per_current_version_and_switches_when_all_are_covered(
    db: Database, worker: UUID
) -> None:
    with db.connection() as conn:
        old = helpers.model(conn, OLD, 4)
        for i in range(3):
            _index(conn, worker, old, f"doc{i}.txt", f"text {i}".encode())
        activation = activate_model(conn, NEW, 8, max_attempts=3)
        new = activation.model
        assert (activation.jobs, activation.switched) == (3, False)
        assert activate_model(conn, NEW, 8, max_attempts=3).jobs == 0  # no duplicate jobs
        for c in lifecycle.claim_jobs(conn, worker, 3, 300, model_id=new.id):
            lifecycle.release_job(conn, c)
        # the old model keeps serving while the new one covers none of the 3 documents
        views = {v.name: v for v in model_list(conn)}
        assert (views[OLD].serving, views[NEW].activating) == (True, True)
        assert (views[NEW].covered, views[NEW].documents) == (0, 3)
        assert _complete_pending(conn, worker, new) == 3
        assert serving_model(conn) == EmbeddingModel(new.id, NEW, 8, True)
        views = {v.name: v for v in model_list(conn)}
        assert (views[NEW].serving, views[NEW].activating, views[OLD].serving) == (
            True,
            False,
            False,
        )
        assert (views[NEW].covered, views[NEW].documents) == (3, 3)
        assert _searchable(conn, new) == _current_keys(conn) == {"doc0.txt", "doc1.txt", "doc2.txt"}
        switched = conn.execute(
            "SELECT count(*) AS n FROM indexing_events WHERE event_type = 'MODEL_SWITCHED'"
        ).fetchone()
    assert switched == {"n": 1}


def test_each_model_serves_its_own_versions_and_a_switch_never_serves_older_ones(
    db: Database, worker: UUID
) -> None:
    """New versions ingested during a switch get jobs for both models. Each model's completion
    moves only its own served version; the switch ends as soon as the new model serves every
    document at least as new as the serving one does, whichever model finished first."""
    with db.connection() as conn:
        old = helpers.model(conn, OLD, 4)
        _index(conn, worker, old, "a.txt", b"a1")
        new = activate_model(conn, NEW, 8, max_attempts=3).model
        helpers.enqueue(conn, old.id, "a.txt", content=b"a2")  # a new version of a
        helpers.enqueue(conn, new.id, "b.txt", content=b"b1")  # a new document
        jobs = conn.execute(
            """SELECT d.external_key, v.version_no, m.name FROM embedding_jobs j
               JOIN document_versions v ON v.id = j.document_version_id
               JOIN documents d ON d.id = v.document_id
               JOIN embedding_models m ON m.id = j.embedding_model_id
               WHERE j.status = 'PENDING' ORDER BY 1, 2, 3"""
        ).fetchall()
        assert [(j["external_key"], j["version_no"], j["name"]) for j in jobs] == [
            ("a.txt", 1, NEW),
            ("a.txt", 2, NEW),
            ("a.txt", 2, OLD),
            ("b.txt", 1, NEW),
            ("b.txt", 1, OLD),
        ]
        assert _served(conn) == {"a.txt": 1}
        # the new model finishes first: it serves a@2 and b@1 itself, which is no older than
        # what the old model serves, so search switches to it at once
        _complete_pending(conn, worker, new)
        assert _served(conn, old) == {"a.txt": 1}
        assert serving_model(conn).name == NEW  # type: ignore[union-attr]
        assert _served(conn) == {"a.txt": 2, "b.txt": 1}
        assert _current_keys(conn) == _searchable(conn, new) == {"a.txt", "b.txt"}
        # the old model catches up on its own versions; what search serves does not change
        _complete_pending(conn, worker, old)
        assert _served(conn, old) == {"a.txt": 2, "b.txt": 1}
        assert _served(conn) == {"a.txt": 2, "b.txt": 1}


def test_a_new_models_failure_never_stops_the_serving_model_indexing_a_new_version(
    db: Database, worker: UUID
) -> None:
    """The serving model indexes v2 although the new model's job for v2 failed for good (it
    used to mark the shared version FAILED, and the serving model's job then failed
    INDEXING_STATE_INCONSISTENT); the failure holds the switch, visibly, instead of serving
    an older version after it."""
    with db.connection() as conn:
        old = helpers.model(conn, OLD, 4)
        _index(conn, worker, old, "a.txt", b"a1")
        new = activate_model(conn, NEW, 8, max_attempts=1).model
        v2 = helpers.enqueue(conn, old.id, "a.txt", content=b"a2")
        for claim in lifecycle.claim_jobs(conn, worker, 10, 300, model_id=new.id):
            if claim.document_version_id == v2.version_id:
                lifecycle.fail_job(
                    conn, claim, FailureType.EMBEDDING_RESULT_INVALID, "NaN", helpers.BACKOFF
                )
            else:
                lifecycle.release_job(conn, claim)
        # the serving model's job on the same version still completes, and search moves
        assert _complete_pending(conn, worker, old) == 1
        assert _served(conn) == {"a.txt": 2}
        _complete_pending(conn, worker, new)  # the new model indexes a@1 only
        assert serving_model(conn) == old  # held: finishing would serve a@1
        views = {v.name: v for v in model_list(conn)}
        assert (views[NEW].failed_jobs, views[NEW].activating) == (1, True)


def test_a_switch_the_old_model_cannot_follow_still_ends_with_the_newest_versions(
    db: Database, worker: UUID
) -> None:
    """During a switch the old model's server rejects v2 (and the first version of a new
    document) while the new model indexes both: the switch ends, and search serves v2 and the
    new document (it used to keep v1 forever, and never show the new document)."""
    with db.connection() as conn:
        old = helpers.model(conn, OLD, 4)
        _index(conn, worker, old, "a.txt", b"a1")
        new = activate_model(conn, NEW, 8, max_attempts=1).model
        helpers.enqueue(conn, old.id, "a.txt", content=b"a2", max_attempts=1)
        helpers.enqueue(conn, old.id, "c.txt", content=b"c1", max_attempts=1)
        for claim in lifecycle.claim_jobs(conn, worker, 10, 300, model_id=old.id):
            lifecycle.fail_job(
                conn, claim, FailureType.EMBEDDING_RESULT_INVALID, "413", helpers.BACKOFF
            )
        assert _complete_pending(conn, worker, new) == 3  # a@1, a@2, c@1
        assert serving_model(conn).name == NEW  # type: ignore[union-attr]
        assert _served(conn) == {"a.txt": 2, "c.txt": 1}


def test_a_worker_whose_model_was_removed_is_told_so_at_its_next_claim(
    db: Database, worker: UUID
) -> None:
    """``models remove B`` then ``models activate B`` registers B under a new id: a worker
    started for the old id would claim nothing for ever; its claim says why instead."""
    with db.connection() as conn:
        old = helpers.model(conn, OLD, 4)
        _index(conn, worker, old, "a.txt", b"a1")
        removed = activate_model(conn, NEW, 8, max_attempts=1).model
        remove_model(conn, NEW)
        again = activate_model(conn, NEW, 8, max_attempts=1).model
        assert again.id != removed.id
        with pytest.raises(ModelRemoved, match="was removed"):
            lifecycle.claim_jobs(conn, worker, 1, 300, model_id=removed.id)
        assert len(lifecycle.claim_jobs(conn, worker, 1, 300, model_id=again.id)) == 1


def test_an_activation_racing_an_ingest_still_covers_the_ingested_version(
    db: Database, worker: UUID
) -> None:
    """Forced order: an ingest's transaction is open (its version inserted, its trigger saw no
    switch); activation must wait for it, then give the new version a job too."""
    with db.connection() as conn:
        old = helpers.model(conn, OLD, 4)
        _index(conn, worker, old, "a.txt", b"a1")
    holding, release = threading.Event(), threading.Event()
    pid: list[int] = []

    def ingest() -> None:
        with db.connection() as conn, conn.transaction():
            helpers.enqueue(conn, old.id, "late.txt", content=b"late")
            holding.set()
            assert release.wait(30)

    def activate() -> object:
        assert holding.wait(30)
        with db.connection() as conn:
            pid.append(conn.info.backend_pid)
            return activate_model(conn, NEW, 8, max_attempts=3)

    with ThreadPoolExecutor(2) as pool:
        ingesting, activating = pool.submit(ingest), pool.submit(activate)
        with db.connection() as conn:
            while not (pid and helpers.waits_on_a_lock(conn, pid[0])):
                assert not activating.done(), activating.result()
        release.set()
        ingesting.result()
        activation = activating.result()
    assert activation.jobs == 2  # type: ignore[attr-defined]
    with db.connection() as conn:
        _complete_pending(conn, worker, old)
        _complete_pending(conn, worker, activation.model)  # type: ignore[attr-defined]
        assert serving_model(conn).name == NEW  # type: ignore[union-attr]
        assert _searchable(conn, activation.model) == {"a.txt", "late.txt"}  # type: ignore[attr-defined]


def test_a_failed_switch_job_leaves_the_served_version_alone_and_retries_only_embedding(
    db: Database, worker: UUID
) -> None:
    with db.connection() as conn:
        old = helpers.model(conn, OLD, 4)
        _index(conn, worker, old, "a.txt", b"a1")
        new = activate_model(conn, NEW, 8, max_attempts=1).model
        (claim,) = lifecycle.claim_jobs(conn, worker, 1, 300, model_id=new.id)
        lifecycle.fail_job(
            conn, claim, FailureType.EMBEDDING_RESULT_INVALID, "too long", helpers.BACKOFF
        )
        assert _served(conn) == {"a.txt": 1}
        assert {v.name: v.failed_jobs for v in model_list(conn)}[NEW] == 1
        lifecycle.retry_failed(conn, claim.job_id, extra_attempts=1)
        (again,) = lifecycle.claim_jobs(conn, worker, 1, 300, model_id=new.id)
        assert again.chunks_ready  # the stored chunks are reused: only embedding runs again
        lifecycle.release_job(conn, again)
        assert _served(conn) == {"a.txt": 1}
        chunks = conn.execute("SELECT count(*) AS n FROM document_chunks").fetchone()
        assert chunks == {"n": 2}
        _complete_pending(conn, worker, new)
        assert serving_model(conn).name == NEW  # type: ignore[union-attr]


def test_deleting_the_last_uncovered_document_ends_the_switch(db: Database, worker: UUID) -> None:
    with db.connection() as conn:
        old = helpers.model(conn, OLD, 4)
        _index(conn, worker, old, "a.txt", b"a")
        _index(conn, worker, old, "b.txt", b"b")
        new = activate_model(conn, NEW, 8, max_attempts=1).model
        (claim,) = lifecycle.claim_jobs(conn, worker, 1, 300, model_id=new.id)
        lifecycle.fail_job(conn, claim, FailureType.EMBEDDING_RESULT_INVALID, "x", helpers.BACKOFF)
        _complete_pending(conn, worker, new)
        assert serving_model(conn) == old  # one document is not covered
        (key,) = _current_keys(conn) - _searchable(conn, new)
        delete_documents(conn, [key])
        assert serving_model(conn).name == NEW  # type: ignore[union-attr]


def test_an_empty_index_switches_at_activation(db: Database) -> None:
    with db.connection() as conn:
        helpers.model(conn, OLD, 4)
        assert activate_model(conn, NEW, 8, max_attempts=3).switched
        assert serving_model(conn).name == NEW  # type: ignore[union-attr]


def test_remove_drops_a_models_embeddings_jobs_and_index_but_never_the_serving_one(
    db: Database, worker: UUID
) -> None:
    with db.connection() as conn:
        old = helpers.model(conn, OLD, 4)
        _index(conn, worker, old, "a.txt", b"a")
        with pytest.raises(TrioindexError, match="serves search"):
            remove_model(conn, OLD)
        new = activate_model(conn, NEW, 8, max_attempts=3).model
        _complete_pending(conn, worker, new)
        assert serving_model(conn) == EmbeddingModel(new.id, NEW, 8, True)
        removed = remove_model(conn, OLD)
        assert (removed.embeddings, removed.jobs) == (2, 1)
        index = conn.execute("SELECT to_regclass(%s) AS i", (old.index_name,)).fetchone()
        assert index == {"i": None}
        assert [v.name for v in model_list(conn)] == [NEW]
        assert _searchable(conn, new) == {"a.txt"}


def test_removing_the_model_being_switched_to_cancels_the_switch(
    db: Database, worker: UUID
) -> None:
    with db.connection() as conn:
        old = helpers.model(conn, OLD, 4)
        _index(conn, worker, old, "a.txt", b"a")
        activate_model(conn, NEW, 8, max_attempts=3)
        with pytest.raises(TrioindexError, match="in progress"):
            activate_model(conn, "third", 4, max_attempts=3)
        assert remove_model(conn, NEW).jobs == 1
        assert serving_model(conn) == old
        assert activate_model(conn, "third", 4, max_attempts=3).jobs == 1


def test_switch_jobs_store_through_the_workers_group_commit(db: Database, worker: UUID) -> None:
    # The worker stores vectors with trioindex_store_embeddings_many; a switch job's version is
    # already served by the old model, which that function must accept.
    with db.connection() as conn:
        old = helpers.model(conn, OLD, 4)
        for i in range(2):
            _index(conn, worker, old, f"doc{i}.txt", f"text {i}".encode())
        new = activate_model(conn, NEW, 8, max_attempts=3).model
        commits = []
        for claim in lifecycle.claim_jobs(conn, worker, 2, 300, model_id=new.id):
            snapshot = begin_embedding(conn, claim)
            matrix = np.ones((len(snapshot.chunks), 8), dtype=np.float32)
            commits.append(EmbeddingCommit(claim, snapshot, drafts_from_matrix(snapshot, matrix)))
        results = store_embeddings_many(conn, commits)
        assert all(isinstance(r, StoredSlice) and r.result is not None for r in results), results
        assert serving_model(conn) == EmbeddingModel(new.id, NEW, 8, True)
        assert _searchable(conn, new) == _current_keys(conn) == {"doc0.txt", "doc1.txt"}
