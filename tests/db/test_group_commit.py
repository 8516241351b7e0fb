"""The group-commit functions on real PostgreSQL: many jobs in one transaction, the group
fenced in one statement and each job refused alone (pipeline/parse_step.py and
pipeline/embed_step.py call them).
"""

from __future__ import annotations

import hashlib

import attrs
import numpy as np
import psycopg
import pytest

from tests import helpers
from trioindex.db import jobs as lifecycle
from trioindex.db.models import EmbeddingModel, activate_model, finish_switch, remove_model
from trioindex.db.pool import Connection, Database
from trioindex.db.search import served_collection
from trioindex.db.steps import (
    ChunkCommit,
    EmbeddingCommit,
    EmbedSnapshot,
    StoredSlice,
    begin_embedding,
    store_chunks_many,
    store_embeddings_many,
)
from trioindex.errors import JobRemoved, OwnershipLost, StateInconsistent
from trioindex.pipeline.chunk_values import ChunkDraft
from trioindex.pipeline.embed_step import drafts_from_matrix
from trioindex.values import Claim, CompleteResult, ParseSnapshot

DONE = StoredSlice(CompleteResult(became_current=True))

DIM = 4


def claims(conn: Connection, n: int) -> list[Claim]:
    model = helpers.model(conn, "group-model", DIM)
    for _ in range(n):
        helpers.enqueue(conn, model.id)
    return lifecycle.claim_jobs(conn, helpers.worker(conn), n, 300)


def drafts_for(text: str, index: int) -> ChunkDraft:
    return ChunkDraft(
        index=index,
        text=text,
        start=0,
        end=len(text),
        token_count=1,
        content_sha256=hashlib.sha256(text.encode()).hexdigest(),
    )


def vectors_for(snapshot: EmbedSnapshot, seed: int) -> np.ndarray:
    rows = np.random.default_rng(seed).standard_normal((len(snapshot.chunks), DIM))
    return rows.astype(np.float32)


def parsing(claim: Claim) -> ParseSnapshot:
    """What the claim of a job that parses carries for its parse."""
    assert claim.parse is not None
    return claim.parse


def chunk_and_start(conn: Connection, group: list[Claim], per_job: int = 2) -> list[EmbedSnapshot]:
    """The chunk commit, grouped, for every claim of ``group``."""
    commits = [
        ChunkCommit(c, parsing(c), [drafts_for(f"{c.job_id} {i}", i) for i in range(per_job)])
        for c in group
    ]
    started = store_chunks_many(conn, commits)
    assert all(isinstance(s, EmbedSnapshot) for s in started)
    return started  # type: ignore[return-value]


def stored_vectors(conn: Connection, claim: Claim) -> list[list[float]]:
    rows = conn.execute(
        """SELECT e.vector FROM embeddings e JOIN document_chunks c ON c.id = e.chunk_id
           WHERE e.document_version_id = %s ORDER BY c.chunk_index""",
        (claim.document_version_id,),
    ).fetchall()
    return [row["vector"].to_list() for row in rows]


def test_each_job_of_a_group_gets_exactly_its_own_vectors(db: Database) -> None:
    with db.connection() as conn:
        group = claims(conn, 5)
        started = chunk_and_start(conn, group, per_job=3)
        matrices = [vectors_for(s, seed) for seed, s in enumerate(started)]
        commits = [
            EmbeddingCommit(c, s, drafts_from_matrix(s, m))
            for c, s, m in zip(group, started, matrices, strict=True)
        ]
        # handed in another order than the claims: results still come back per input position
        order = [3, 0, 4, 1, 2]
        results = store_embeddings_many(conn, [commits[i] for i in order])
        assert results == [DONE] * 5
        for claim, matrix in zip(group, matrices, strict=True):
            assert np.allclose(stored_vectors(conn, claim), matrix)
            assert helpers.job_row(conn, claim.job_id)["status"] == "SUCCEEDED"
            assert helpers.events(conn, claim.job_id)[-1] == "JOB_SUCCEEDED"
            assert helpers.steps(conn, claim.job_id)[-3:] == [
                "chunks_stored",
                "embedding_started",
                "embeddings_stored",
            ]
            attempt = helpers.attempt_row(conn, claim.job_id)
            assert (attempt["status"], attempt["chunks"], attempt["embeddings"]) == (
                "SUCCEEDED",
                3,
                3,
            )
            assert attempt["embedding_slices"] == 1


AWKWARD_TEXTS = ["NULL", 'a "quoted", {braced} \\ back\\slash', "tab\tnew\nline é 日本"]
AWKWARD_VALUES = [np.float32(1e-45), -0.0, np.finfo(np.float32).max, 0.1]


def test_group_parameters_round_trip_bit_exact(db: Database) -> None:
    """The group statements send their arrays in binary: chunk texts and float32 vectors come
    back exactly as handed in, whatever characters or values they hold."""
    with db.connection() as conn:
        (claim,) = claims(conn, 1)
        drafts = [drafts_for(text, i) for i, text in enumerate(AWKWARD_TEXTS)]
        (started,) = store_chunks_many(conn, [ChunkCommit(claim, parsing(claim), drafts)])
        assert isinstance(started, EmbedSnapshot)
        assert [c.text for c in started.chunks] == AWKWARD_TEXTS
        stored_texts = conn.execute(
            """SELECT content FROM document_chunks WHERE document_version_id = %s
               ORDER BY chunk_index""",
            (claim.document_version_id,),
        ).fetchall()
        assert [row["content"] for row in stored_texts] == AWKWARD_TEXTS
        matrix = np.array([AWKWARD_VALUES] * len(AWKWARD_TEXTS), dtype=np.float32)
        matrix[1] = np.float32(1) / np.float32(3)
        commit = EmbeddingCommit(claim, started, drafts_from_matrix(started, matrix))
        assert store_embeddings_many(conn, [commit]) == [DONE]
        stored = np.array(stored_vectors(conn, claim), dtype=np.float32)
        assert stored.tobytes() == matrix.tobytes()  # bit for bit, -0.0 and subnormals too


@pytest.mark.parametrize("forgery", helpers.FORGERIES)
def test_a_job_that_lost_its_lease_is_refused_alone_and_the_others_commit(
    db: Database, forgery: str
) -> None:
    with db.connection() as conn:
        group = claims(conn, 3)
        started = chunk_and_start(conn, group)
        commits = [
            EmbeddingCommit(c, s, drafts_from_matrix(s, vectors_for(s, i)))
            for i, (c, s) in enumerate(zip(group, started, strict=True))
        ]
        lost = helpers.forge(conn, group[1], forgery)
        commits[1] = EmbeddingCommit(lost, started[1], commits[1].drafts)
        results = store_embeddings_many(conn, commits)
        assert isinstance(results[1], OwnershipLost)
        assert results[0] == results[2] == DONE
        assert stored_vectors(conn, group[1]) == []
        assert helpers.job_row(conn, group[1].job_id)["status"] == "PROCESSING"
        assert "embeddings_stored" not in helpers.steps(conn, group[1].job_id)
        assert helpers.attempt_row(conn, group[1].job_id)["embeddings"] is None
        for kept in (group[0], group[2]):
            assert len(stored_vectors(conn, kept)) == 2
            assert helpers.job_row(conn, kept.job_id)["status"] == "SUCCEEDED"


def test_parse_groups_fence_each_job_alone(db: Database) -> None:
    with db.connection() as conn:
        group = claims(conn, 3)
        # between claim and commit, job 2's lease is lost: its chunks are not stored
        helpers.expire_lease(conn, group[2].job_id)
        commits = [ChunkCommit(c, parsing(c), [drafts_for("text", 0)]) for c in group[1:]]
        stored = store_chunks_many(conn, commits)
        assert isinstance(stored[0], EmbedSnapshot) and isinstance(stored[1], OwnershipLost)
        assert helpers.steps(conn, group[2].job_id) == []
        assert (
            helpers.count(
                conn,
                "SELECT count(*) FROM document_chunks WHERE document_version_id = %s",
                group[2].document_version_id,
            )
            == 0
        )
        assert helpers.job_row(conn, group[1].job_id)["progress"] == 50  # embedding began


def test_a_version_changed_since_the_claim_is_refused_as_inconsistent(db: Database) -> None:
    with db.connection() as conn:
        (claim,) = claims(conn, 1)
        changed = attrs.evolve(parsing(claim), sha256="0" * 64)
        (result,) = store_chunks_many(conn, [ChunkCommit(claim, changed, [drafts_for("a", 0)])])
        assert isinstance(result, StateInconsistent)


def test_embeddings_are_stored_exactly_once_across_a_crash_between_steps(db: Database) -> None:
    with db.connection() as conn:
        (claim,) = claims(conn, 1)
        (started,) = chunk_and_start(conn, [claim])
        matrix = vectors_for(started, 7)
        # the worker stored the vectors and completed, then crashed before it heard back: the
        # same commit sent again (a retry of the group) is refused, nothing is stored twice
        commit = EmbeddingCommit(claim, started, drafts_from_matrix(started, matrix))
        assert store_embeddings_many(conn, [commit]) == [DONE]
        (again,) = store_embeddings_many(conn, [commit])
        assert isinstance(again, OwnershipLost)
        assert len(stored_vectors(conn, claim)) == 2


def test_after_a_lost_claim_the_next_attempt_converges_on_the_stored_chunks(db: Database) -> None:
    with db.connection() as conn:
        (claim,) = claims(conn, 1)
        chunk_and_start(conn, [claim])
        # the worker died after storing the chunks; recovery hands the job to a new claim
        helpers.expire_lease(conn, claim.job_id)
        lifecycle.recover_expired(conn, lifecycle_backoff())
        helpers.make_available(conn, claim.job_id)
        (second,) = lifecycle.claim_jobs(conn, helpers.worker(conn), 1, 300)
        assert second.chunks_ready
        snapshot = begin_embedding(conn, second)
        (done,) = store_embeddings_many(
            conn,
            [
                EmbeddingCommit(
                    second, snapshot, drafts_from_matrix(snapshot, vectors_for(snapshot, 1))
                )
            ],
        )
        assert done == DONE
        assert len(stored_vectors(conn, claim)) == 2
        # the first claim's late commit is refused and stores nothing more
        (late,) = store_embeddings_many(
            conn,
            [
                EmbeddingCommit(
                    claim, snapshot, drafts_from_matrix(snapshot, vectors_for(snapshot, 2))
                )
            ],
        )
        assert isinstance(late, OwnershipLost)
        assert (
            helpers.count(
                conn,
                "SELECT count(*) FROM embeddings WHERE document_version_id = %s",
                claim.document_version_id,
            )
            == 2
        )


def lifecycle_backoff() -> object:
    from trioindex.values import BackoffPolicy

    return BackoffPolicy(initial=0.0, maximum=0.0, jitter=0.0)


def test_a_refused_job_is_not_locked_while_the_owned_jobs_of_its_group_are(
    db: Database,
) -> None:
    """The group's fence locks only the jobs it still owns: a refused job's row stays free for
    lease recovery while the group's transaction is open."""
    with db.connection() as conn, db.connection() as other:
        group = claims(conn, 2)
        helpers.expire_lease(conn, group[0].job_id)
        commits = [ChunkCommit(c, parsing(c), [drafts_for(f"{c.job_id}", 0)]) for c in group]
        with conn.transaction():
            stored = store_chunks_many(conn, commits)
            assert isinstance(stored[0], OwnershipLost)
            assert isinstance(stored[1], EmbedSnapshot)
            with other.transaction():
                free = other.execute(
                    "SELECT id FROM embedding_jobs WHERE id = %s FOR UPDATE NOWAIT",
                    (group[0].job_id,),
                ).fetchone()
                assert free is not None
            with pytest.raises(psycopg.errors.LockNotAvailable), other.transaction():
                other.execute(
                    "SELECT id FROM embedding_jobs WHERE id = %s FOR UPDATE NOWAIT",
                    (group[1].job_id,),
                )


def test_the_claim_carries_what_the_parse_reads(db: Database) -> None:
    """A job whose chunk set is not stored is claimed with its version's snapshot (the parse
    needs no transaction before its commit) and the claim's time as the parse's start; a job
    whose set is stored is claimed without one (it only embeds)."""
    with db.connection() as conn:
        (claim,) = claims(conn, 1)
        version = conn.execute(
            """SELECT document_id, storage_key, original_name, content_type, byte_size, sha256
               FROM document_versions WHERE id = %s""",
            (claim.document_version_id,),
        ).fetchone()
        assert version is not None
        started = helpers.attempt_row(conn, claim.job_id)["started_at"]
        assert claim.parse == ParseSnapshot(
            version_id=claim.document_version_id, parse_started_at=started, **version
        )
        (stored,) = store_chunks_many(
            conn, [ChunkCommit(claim, parsing(claim), [drafts_for("a", 0)])]
        )
        assert isinstance(stored, EmbedSnapshot)
        assert helpers.attempt_row(conn, claim.job_id)["parse_started_at"] == started
        lifecycle.release_job(conn, claim)
        (again,) = lifecycle.claim_jobs(conn, claim.worker_id, 1, 300)
        assert again.chunks_ready and again.parse is None


def test_two_jobs_of_one_group_on_one_chunk_set_store_it_once(db: Database) -> None:
    """Twin jobs of a switch (two models, one chunking) in one chunk commit: the first stores
    the set and starts embedding, the second converges on it (its count, nothing written)."""
    with db.connection() as conn:
        old = helpers.model(conn, "group-model", DIM)
        new = activate_model(conn, "group-model-2", DIM, max_attempts=3).model
        helpers.enqueue(conn, old.id, "twin.txt", priority=10)
        worker = helpers.worker(conn)
        twins = [
            lifecycle.claim_jobs(conn, worker, 1, 300, model_id=model.id)[0] for model in (old, new)
        ]
        assert twins[0].document_version_id == twins[1].document_version_id
        commits = [
            ChunkCommit(c, parsing(c), [drafts_for("one", 0), drafts_for("two", 1)]) for c in twins
        ]
        stored = store_chunks_many(conn, commits)
        assert isinstance(stored[0], EmbedSnapshot) and stored[1] == 2
        assert (
            helpers.count(
                conn,
                "SELECT count(*) FROM document_chunks WHERE document_version_id = %s",
                twins[0].document_version_id,
            )
            == 2
        )
        assert "chunks_stored" not in helpers.steps(conn, twins[1].job_id)
        assert helpers.attempt_row(conn, twins[0].job_id)["chunks"] == 2


def test_two_versions_of_a_document_completed_in_one_group_serve_the_newer(
    db: Database,
) -> None:
    with db.connection() as conn:
        model = helpers.model(conn, "group-model", DIM)
        helpers.enqueue(conn, model.id, "same-key", content=b"first text")
        helpers.enqueue(conn, model.id, "same-key", content=b"second text")
        group = lifecycle.claim_jobs(conn, helpers.worker(conn), 2, 300)
        started = chunk_and_start(conn, group)
        commits = [
            EmbeddingCommit(c, s, drafts_from_matrix(s, vectors_for(s, i)))
            for i, (c, s) in enumerate(zip(group, started, strict=True))
        ]
        numbers = {
            row["id"]: row["version_no"]
            for row in conn.execute(
                "SELECT id, version_no FROM document_versions WHERE id = ANY(%s)",
                ([c.document_version_id for c in group],),
            ).fetchall()
        }
        results = store_embeddings_many(conn, commits)
        newer = max(range(2), key=lambda i: numbers[group[i].document_version_id])
        assert results[newer] == DONE
        assert results[1 - newer] == StoredSlice(CompleteResult(became_current=False))
        served = conn.execute("SELECT document_version_id FROM served_versions").fetchall()
        assert [row["document_version_id"] for row in served] == [group[newer].document_version_id]


def test_the_chunk_commit_refuses_a_job_whose_document_was_deleted_after_its_claim(
    db: Database,
) -> None:
    """The parse locks nothing, so a delete may come between the claim and the chunk commit:
    the commit's fence refuses that job as removed, and the others store their sets."""
    with db.connection() as conn:
        group = claims(conn, 3)
        helpers.delete_document_of(conn, group[1])
        commits = [ChunkCommit(c, parsing(c), [drafts_for(f"{c.job_id}", 0)]) for c in group]
        results = store_chunks_many(conn, commits)
        assert isinstance(results[1], JobRemoved)
        assert isinstance(results[0], EmbedSnapshot) and isinstance(results[2], EmbedSnapshot)


def test_two_slices_of_one_job_in_one_group_are_written_one_after_the_other(
    db: Database,
) -> None:
    with db.connection() as conn:
        group = claims(conn, 2)
        started = chunk_and_start(conn, group)
        drafts = [drafts_from_matrix(s, vectors_for(s, i)) for i, s in enumerate(started)]
        results = store_embeddings_many(
            conn,
            [
                EmbeddingCommit(group[0], started[0], drafts[0][:1], 0),
                EmbeddingCommit(group[1], started[1], drafts[1]),
                EmbeddingCommit(group[0], started[0], drafts[0][1:], 1),
            ],
        )
        assert results == [StoredSlice(None), DONE, DONE]
        for claim in group:
            assert len(stored_vectors(conn, claim)) == 2
            assert helpers.job_row(conn, claim.job_id)["status"] == "SUCCEEDED"
        attempt = helpers.attempt_row(conn, group[0].job_id)
        assert (attempt["embeddings"], attempt["embedding_slices"]) == (2, 2)


def test_a_group_claim_naming_another_jobs_attempt_is_refused_alone(db: Database) -> None:
    with db.connection() as conn:
        group = claims(conn, 2)
        borrowed = attrs.evolve(group[0], attempt_id=group[1].attempt_id)
        results = store_chunks_many(
            conn, [ChunkCommit(c, parsing(c), [drafts_for("a", 0)]) for c in (borrowed, group[1])]
        )
        assert isinstance(results[0], OwnershipLost)
        assert "attempt" in str(results[0])
        assert isinstance(results[1], EmbedSnapshot)
        assert helpers.steps(conn, group[0].job_id) == []


def _complete(conn: Connection, group: list[Claim], per_job: int) -> list[StoredSlice | Exception]:
    started = chunk_and_start(conn, group, per_job=per_job)
    return store_embeddings_many(
        conn,
        [
            EmbeddingCommit(c, s, drafts_from_matrix(s, vectors_for(s, i)))
            for i, (c, s) in enumerate(zip(group, started, strict=True))
        ],
    )


def test_one_group_completion_keeps_the_text_statistics_of_new_and_moved_served_rows_exact(
    db: Database,
) -> None:
    """A group's completion serves new documents (inserted served rows) and newer versions
    (updated ones) in one statement: the statistics follow both, counted from the chunks."""
    statistics_sql = """SELECT s.document_id, s.chunks, s.text_length
        FROM served_versions s ORDER BY 1"""
    counted_sql = """SELECT s.document_id, count(*)::integer AS chunks,
               sum(length(c.content))::bigint AS text_length
        FROM served_versions s
        JOIN document_chunks c ON c.document_version_id = s.document_version_id
        GROUP BY s.document_id ORDER BY 1"""
    with db.connection() as conn:
        model = helpers.model(conn, "group-model", DIM)
        helpers.enqueue(conn, model.id, "moved.txt", content=b"first")
        first = lifecycle.claim_jobs(conn, helpers.worker(conn), 1, 300)
        assert _complete(conn, first, per_job=1) == [DONE]
        helpers.enqueue(conn, model.id, "moved.txt", content=b"second")
        helpers.enqueue(conn, model.id, "new.txt", content=b"new")
        group = lifecycle.claim_jobs(conn, helpers.worker(conn), 2, 300)
        assert _complete(conn, group, per_job=3) == [DONE, DONE]
        statistics = [tuple(r.values()) for r in conn.execute(statistics_sql).fetchall()]
        counted = [tuple(r.values()) for r in conn.execute(counted_sql).fetchall()]
        assert len(statistics) == 2 and statistics == counted
        assert {row[1] for row in statistics} == {3}  # the moved document: its new set's count


def _collections_counted(conn: Connection) -> dict[object, tuple[int, int]]:
    """Per model: the chunks with its vectors on the versions it serves, and their length,
    counted from the rows."""
    rows = conn.execute(
        """SELECT s.embedding_model_id AS model, count(c.id)::bigint AS chunks,
                  coalesce(sum(length(c.content)), 0)::bigint AS text_length
           FROM served_versions s
           JOIN embeddings e ON e.document_version_id = s.document_version_id
                            AND e.embedding_model_id = s.embedding_model_id
           JOIN document_chunks c ON c.id = e.chunk_id
           GROUP BY 1"""
    ).fetchall()
    return {r["model"]: (r["chunks"], r["text_length"]) for r in rows}


def _collections_read(conn: Connection, *models: EmbeddingModel) -> dict[object, tuple[int, int]]:
    """Per model, what BM25 reads (:func:`served_collection`), models serving nothing left out."""
    read = {m.id: served_collection(conn, m) for m in models}
    return {k: (c.chunks, c.text_length) for k, c in read.items() if c.chunks}


def test_bm25_statistics_stay_exact_through_stores_moves_deletes_and_a_model_switch(
    db: Database,
) -> None:
    with db.connection() as conn:
        first = helpers.model(conn, "group-model", DIM)
        worker = helpers.worker(conn)

        def complete_all(model: EmbeddingModel, per_job: int) -> None:
            group = lifecycle.claim_jobs(conn, worker, 10, 300, model_id=model.id)
            assert group and _complete(conn, group, per_job) == [DONE] * len(group)

        def embed_stored_sets(model: EmbeddingModel) -> None:
            group = lifecycle.claim_jobs(conn, worker, 10, 300, model_id=model.id)
            started = [begin_embedding(conn, c) for c in group]
            commits = [
                EmbeddingCommit(c, s, drafts_from_matrix(s, vectors_for(s, i)))
                for i, (c, s) in enumerate(zip(group, started, strict=True))
            ]
            assert group and store_embeddings_many(conn, commits) == [DONE] * len(group)

        def exact(*models: EmbeddingModel) -> None:
            assert _collections_read(conn, *models) == _collections_counted(conn)

        for key in ("a.txt", "b.txt", "c.txt"):
            helpers.enqueue(conn, first.id, key, content=key.encode())
        complete_all(first, per_job=2)  # stores
        exact(first)
        assert served_collection(conn, first).chunks == 6
        helpers.enqueue(conn, first.id, "a.txt", content=b"a, longer now")
        complete_all(first, per_job=3)  # a move: a.txt serves its second version
        exact(first)
        assert served_collection(conn, first).chunks == 7
        conn.execute("SELECT trioindex_delete_documents(ARRAY['b.txt'])")  # a delete
        exact(first)
        assert served_collection(conn, first).chunks == 5
        second = helpers.model(conn, "second-model", DIM)
        activate_model(conn, "second-model", DIM, max_attempts=3)
        embed_stored_sets(second)  # the switched-to model serves the stored sets
        assert finish_switch(conn)
        exact(first, second)
        assert served_collection(conn, second) == served_collection(conn, first)
        assert served_collection(conn, first).chunks == 5  # the other model's, unchanged
        remove_model(conn, "group-model")  # its served rows go, and their statistics
        exact(first, second)
        assert served_collection(conn, first).chunks == 0
