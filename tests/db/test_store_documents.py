"""A small document stored whole on real PostgreSQL (``trioindex_store_documents_many``): its
chunk set, its vectors and its completion in one call, for many jobs at once, each refused
alone; a set another job stored is converged on, chunk for chunk, or refused.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np
import pytest

from tests import helpers
from trioindex.db import jobs as lifecycle
from trioindex.db.models import activate_model
from trioindex.db.pool import Connection, Database
from trioindex.db.steps import (
    ChunkCommit,
    DocumentCommit,
    EmbeddingCommit,
    EmbedSnapshot,
    StoredSlice,
    store_chunks_many,
    store_documents_many,
    whole_snapshot,
)
from trioindex.errors import JobRemoved, OwnershipLost, StateInconsistent
from trioindex.pipeline.chunking import ChunkDraft
from trioindex.pipeline.embed_step import drafts_from_matrix
from trioindex.values import Claim, CompleteResult

DIM = 4
DONE = StoredSlice(CompleteResult(became_current=True))


def claims(conn: Connection, n: int) -> list[Claim]:
    model = helpers.model(conn, "whole-model", DIM)
    for _ in range(n):
        helpers.enqueue(conn, model.id)
    return lifecycle.claim_jobs(conn, helpers.worker(conn), n, 300)


def chunks_of(claim: Claim, texts: Sequence[str]) -> ChunkCommit:
    """The claim's parse: ``texts`` as its chunks, one after the other."""
    drafts, start = [], 0
    for index, text in enumerate(texts):
        digest = hashlib.sha256(text.encode()).hexdigest()
        drafts.append(ChunkDraft(index, text, start, start + len(text), 1, digest))
        start += len(text)
    assert claim.parse is not None
    return ChunkCommit(claim, claim.parse, drafts)


def whole(
    claim: Claim, texts: Sequence[str], seed: int = 0, dimension: int = DIM
) -> DocumentCommit:
    """The claim's document parsed into ``texts`` and embedded, nothing of it stored yet."""
    chunks = chunks_of(claim, texts)
    snapshot = whole_snapshot(chunks, claim.embedding_model_id, "whole-model", dimension)
    matrix = np.random.default_rng(seed).standard_normal((len(texts), dimension))
    drafts = drafts_from_matrix(snapshot, matrix.astype(np.float32))
    return DocumentCommit(chunks, EmbeddingCommit(claim, snapshot, drafts))


def stored(conn: Connection, claim: Claim) -> tuple[list[str], dict[object, int]]:
    """The texts of the version's chunks, in order, and its vectors per model."""
    texts = conn.execute(
        """SELECT content FROM document_chunks WHERE document_version_id = %s
           ORDER BY chunk_index""",
        (claim.document_version_id,),
    ).fetchall()
    vectors = conn.execute(
        """SELECT e.embedding_model_id AS model, count(*) AS n FROM embeddings e
           JOIN document_chunks c ON c.id = e.chunk_id
           WHERE e.document_version_id = %s GROUP BY 1""",
        (claim.document_version_id,),
    ).fetchall()
    return [r["content"] for r in texts], {r["model"]: r["n"] for r in vectors}


def test_a_group_of_documents_is_stored_whole_in_one_call(db: Database) -> None:
    with db.connection() as conn:
        group = claims(conn, 3)
        commits = [whole(c, [f"{c.job_id} a", f"{c.job_id} b"], i) for i, c in enumerate(group)]
        order = [2, 0, 1]  # results come back per input position
        assert store_documents_many(conn, [commits[i] for i in order]) == [DONE] * 3
        for claim, commit in zip(group, commits, strict=True):
            texts, vectors = stored(conn, claim)
            assert texts == [c.text for c in commit.chunks.chunks]
            assert vectors == {claim.embedding_model_id: 2}
            stored_vectors = conn.execute(
                """SELECT e.vector FROM embeddings e JOIN document_chunks c ON c.id = e.chunk_id
                   WHERE e.document_version_id = %s ORDER BY c.chunk_index""",
                (claim.document_version_id,),
            ).fetchall()
            assert np.array_equal(
                [r["vector"].to_numpy() for r in stored_vectors],
                [d.vector for d in commit.vectors.drafts],
            )
            job = helpers.job_row(conn, claim.job_id)
            assert (job["status"], job["progress"], job["chunk_count"]) == ("SUCCEEDED", 100, 2)
            assert helpers.steps(conn, claim.job_id) == list(helpers.ATTEMPT_STEPS)
            attempt = helpers.attempt_row(conn, claim.job_id)
            assert attempt["status"] == "SUCCEEDED" and attempt["became_current"]
            assert (attempt["chunks"], attempt["embeddings"], attempt["embedding_slices"]) == (
                2,
                2,
                1,
            )
            assert attempt["characters"] == commit.chunks.chunks[-1].end
            assert attempt["parse_started_at"] == claim.parse.parse_started_at  # type: ignore[union-attr]
            served = conn.execute(
                "SELECT chunks, text_length FROM served_versions WHERE document_version_id = %s",
                (claim.document_version_id,),
            ).fetchone()
            assert served == {"chunks": 2, "text_length": commit.chunks.chunks[-1].end}


def _rows_written(conn: Any) -> dict[str, tuple[int, int]]:
    """Rows inserted and updated per job table, as the statistics count them so far (the
    transaction's own counts, and earlier ones not yet reported)."""
    return {
        row["relname"]: (row["n_tup_ins"], row["n_tup_upd"])
        for row in conn.execute(
            """SELECT relname, n_tup_ins, n_tup_upd FROM pg_stat_xact_user_tables
               WHERE relname IN ('embedding_job_attempts', 'embedding_jobs')"""
        ).fetchall()
    }


def test_the_store_writes_each_attempt_row_once_and_each_job_row_once(db: Database) -> None:
    """The steps (parse start, the chunk set with its repairs, the embed step) are recorded in
    the attempt row the completion inserts as the attempt ends, and the job row is updated
    once: as the transaction's own statistics count the tables' inserts and updates."""
    with db.connection() as conn:
        group = claims(conn, 3)
        commits = [whole(c, [f"{c.job_id} a", "b"], i) for i, c in enumerate(group)]
        commits[1] = attrs.evolve(commits[1], chunks=attrs.evolve(commits[1].chunks, replaced=2))
        with conn.transaction():
            before = _rows_written(conn)
            assert store_documents_many(conn, commits) == [DONE] * 3
            after = _rows_written(conn)
        written = {t: (after[t][0] - before[t][0], after[t][1] - before[t][1]) for t in after}
        assert written == {"embedding_job_attempts": (3, 0), "embedding_jobs": (0, 3)}
        for claim, commit in zip(group, commits, strict=True):
            attempt = helpers.attempt_row(conn, claim.job_id)
            assert helpers.steps(conn, claim.job_id) == list(helpers.ATTEMPT_STEPS)
            assert attempt["replaced_sequences"] == (commit.chunks.replaced or None)


def plans_made(conn: Connection, commits: Sequence[DocumentCommit]) -> int:
    """The plans PostgreSQL made while ``commits`` were stored in one call on ``conn``."""

    def store() -> None:
        assert store_documents_many(conn, commits) == [DONE] * len(commits)

    return len(helpers.plans_made(conn, store))


def test_documents_stored_one_at_a_time_are_not_planned_again_on_every_call(
    db: Database,
) -> None:
    """Documents arriving one at a time are stored in groups of one. Past the first calls on a
    connection, such a call plans none of the store's own statements again (the store's main
    statement was planned anew on every call, about 1 ms a document): what is left is the
    call's own statement (until psycopg prepares it) and the two statements of
    ``trioindex_complete_owned``, which keep PostgreSQL's automatic choice."""
    with db.connection() as conn:
        group = claims(conn, 10)
        made = [plans_made(conn, [whole(claim, [f"{claim.job_id}"], i)])
                for i, claim in enumerate(group)]  # fmt: skip
    assert max(made[6:]) <= 3, made


def test_each_job_of_a_group_is_refused_alone_and_leaves_nothing(db: Database) -> None:
    with db.connection() as conn:
        group = claims(conn, 5)
        helpers.expire_lease(conn, group[0].job_id)
        helpers.delete_document_of(conn, group[1])
        commits = [whole(c, ["alpha", "bravo"], i) for i, c in enumerate(group)]
        changed = attrs.evolve(commits[2].chunks.snapshot, sha256="0" * 64)
        commits[2] = attrs.evolve(
            commits[2], chunks=attrs.evolve(commits[2].chunks, snapshot=changed)
        )
        commits[3] = whole(group[3], ["alpha", "bravo"], 3, dimension=DIM + 1)
        results = store_documents_many(conn, commits)
        assert isinstance(results[0], OwnershipLost)
        assert isinstance(results[1], JobRemoved)
        assert isinstance(results[2], StateInconsistent) and "version changed" in str(results[2])
        assert isinstance(results[3], StateInconsistent) and "model" in str(results[3])
        assert results[4] == DONE
        for claim in (group[0], group[2], group[3]):
            assert stored(conn, claim) == ([], {})
            assert helpers.steps(conn, claim.job_id) == []
            assert helpers.job_row(conn, claim.job_id)["status"] == "PROCESSING"
        assert stored(conn, group[4])[1] == {group[4].embedding_model_id: 2}


def test_a_repeated_store_is_refused_and_writes_nothing_twice(db: Database) -> None:
    """The worker stored the document and completed, then its group was sent again (a retry of
    a call whose answer was lost): the fence refuses it, nothing is stored twice."""
    with db.connection() as conn:
        (claim,) = claims(conn, 1)
        commit = whole(claim, ["one", "two"])
        assert store_documents_many(conn, [commit]) == [DONE]
        attempt = helpers.attempt_row(conn, claim.job_id)
        (again,) = store_documents_many(conn, [commit])
        assert isinstance(again, OwnershipLost)
        assert stored(conn, claim) == (["one", "two"], {claim.embedding_model_id: 2})
        assert helpers.attempt_row(conn, claim.job_id) == attempt


def test_problems_found_before_the_database_are_refused_alone(db: Database) -> None:
    with db.connection() as conn:
        group = claims(conn, 3)
        commits = [whole(c, ["x", "y"], i) for i, c in enumerate(group)]
        # vectors naming other chunks than the ones stored with them
        commits[0] = attrs.evolve(commits[0], vectors=commits[1].vectors)
        # a slice that does not end the set
        short = attrs.evolve(commits[1].vectors, drafts=commits[1].vectors.drafts[:1])
        commits[1] = attrs.evolve(commits[1], vectors=short)
        results = store_documents_many(conn, commits)
        assert isinstance(results[0], StateInconsistent)
        assert isinstance(results[1], StateInconsistent)
        assert results[2] == DONE
        assert stored(conn, group[0]) == ([], {}) and stored(conn, group[1]) == ([], {})


def _twins(conn: Connection) -> list[Claim]:
    """Jobs of two models on one version, sharing its character chunk set, both claimed
    before either stored anything."""
    old = helpers.model(conn, "whole-model", DIM)
    new = activate_model(conn, "whole-model-2", DIM, max_attempts=3).model
    helpers.enqueue(conn, old.id, "twin.txt")
    worker = helpers.worker(conn)
    twins = [lifecycle.claim_jobs(conn, worker, 1, 300, model_id=m.id)[0] for m in (old, new)]
    assert twins[0].document_version_id == twins[1].document_version_id
    assert not any(t.chunks_ready for t in twins)
    return twins


def test_a_set_stored_meanwhile_gets_the_vectors_of_the_same_chunks(db: Database) -> None:
    with db.connection() as conn:
        first, second = _twins(conn)
        (started,) = store_chunks_many(conn, [chunks_of(first, ["golf", "hotel"])])
        assert isinstance(started, EmbedSnapshot)
        assert store_documents_many(conn, [whole(second, ["golf", "hotel"])]) == [
            StoredSlice(CompleteResult(became_current=True))
        ]
        texts, vectors = stored(conn, second)
        assert texts == ["golf", "hotel"]  # no second set
        assert vectors == {second.embedding_model_id: 2}
        attempt = helpers.attempt_row(conn, second.job_id)
        # it stored no chunks: it parsed and embedded them
        assert helpers.steps(conn, second.job_id) == [
            "parse_started",
            "embedding_started",
            "embeddings_stored",
        ]
        assert attempt["chunks"] is None and attempt["embeddings"] == 2


def test_a_set_stored_meanwhile_with_other_chunks_is_refused(db: Database) -> None:
    """Another worker's chunker cut the text otherwise: these vectors are not the stored
    chunks'; the job is refused (its next attempt embeds the stored set) and writes nothing."""
    with db.connection() as conn:
        first, second = _twins(conn)
        store_chunks_many(conn, [chunks_of(first, ["golf hotel"])])
        (refused,) = store_documents_many(conn, [whole(second, ["golf", "hotel"])])
        assert isinstance(refused, StateInconsistent) and "chunks changed" in str(refused)
        assert stored(conn, second) == (["golf hotel"], {})
        assert helpers.steps(conn, second.job_id) == []


@pytest.mark.parametrize("same", [True, False])
def test_twins_in_one_call_store_one_set(db: Database, same: bool) -> None:
    """Of two jobs of one call on one set, the first stores it and the second puts its vectors
    on those chunks when they are the same, else it is refused alone."""
    with db.connection() as conn:
        twins = _twins(conn)
        other = ["india", "juliet"] if same else ["india juliet"]
        results = store_documents_many(
            conn, [whole(twins[0], ["india", "juliet"]), whole(twins[1], other, 1)]
        )
        assert results[0] == DONE
        texts, vectors = stored(conn, twins[0])
        assert texts == ["india", "juliet"]
        if same:
            assert results[1] == DONE
            assert vectors == {t.embedding_model_id: 2 for t in twins}
        else:
            assert isinstance(results[1], StateInconsistent)
            assert vectors == {twins[0].embedding_model_id: 2}
            assert helpers.job_row(conn, twins[1].job_id)["status"] == "PROCESSING"
