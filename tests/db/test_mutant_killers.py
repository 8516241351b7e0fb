"""Rules of the model switch and the chunk-set commit that no other test pins down alone, each
found by a surviving mutant of bench/mutants.toml (docs/test-results/mutation.md), on a real
PostgreSQL.

``trioindex_finish_switch`` ends a switch when (1) the new model owes no work — no open job,
no job FAILED on a newer version than it serves — and (2) it serves every document at least as
new as the serving model does; completions hold their model's row FOR KEY SHARE and the switch
takes the serving model's row FOR UPDATE, so no completion slips between the comparison and
the switch (docs/design/state-machine.md, "The switch"). Through the public operations (2)
follows from (1): the activation's backfill and the follow_models trigger give the new model a
job on every version newer than the one the serving model serves. So the tests of (2) and of
its locks remove the new model's job of the newest version by hand, the gap (2) is there to
catch, and check the switch function's own contract.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from uuid import UUID

import pytest

from tests import helpers
from trioindex.db import jobs as lifecycle
from trioindex.db.models import EmbeddingModel, activate_model, finish_switch, serving_model
from trioindex.db.pool import Connection, Database
from trioindex.db.steps import ChunkCommit, store_chunks_many
from trioindex.errors import FailureType
from trioindex.pipeline.chunk_values import ChunkDraft
from trioindex.values import Claim, WorkerStatus, token_chunking

OLD, NEW = "old-model", "new-model"


@pytest.fixture
def worker(db: Database) -> UUID:
    with db.connection() as conn:
        return helpers.worker(conn)


def _embed(conn: Connection, claim: Claim, model: EmbeddingModel) -> None:
    """Give the claim's version its chunk set (once) and ``model``'s vectors on it."""
    chunks = conn.execute(
        "SELECT id, document_id FROM document_chunks WHERE document_version_id = %s",
        (claim.document_version_id,),
    ).fetchall()
    if not chunks:
        helpers.stage_embedded(conn, claim, dimension=model.dimension, chunks=2)
        return
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


def _run_jobs(
    conn: Connection,
    worker: UUID,
    model: EmbeddingModel,
    outcome: Callable[[Claim], str] = lambda claim: "complete",
) -> None:
    """Claim every claimable job of ``model`` and end each as ``outcome(claim)`` says:
    "complete", or "fail" (for good, when it has no attempts left)."""
    while claims := lifecycle.claim_jobs(conn, worker, 10, 300, model_id=model.id):
        for claim in claims:
            if outcome(claim) == "complete":
                _embed(conn, claim, model)
                lifecycle.complete_job(conn, claim)
            else:
                lifecycle.fail_job(
                    conn, claim, FailureType.EMBEDDING_RESULT_INVALID, "refused", helpers.BACKOFF
                )


def _served_no(conn: Connection, model: EmbeddingModel, key: str) -> int | None:
    row = conn.execute(
        """SELECT v.version_no FROM served_versions s
           JOIN documents d ON d.id = s.document_id
           JOIN document_versions v ON v.id = s.document_version_id
           WHERE s.embedding_model_id = %s AND d.external_key = %s""",
        (model.id, key),
    ).fetchone()
    return None if row is None else row["version_no"]


def _activating(conn: Connection, model: EmbeddingModel) -> bool:
    row = conn.execute("SELECT activating FROM embedding_models WHERE id = %s", (model.id,))
    found = row.fetchone()
    assert found is not None
    return bool(found["activating"])


# -- rule (1): the work the new model owes ------------------------------------------------


def test_a_failed_job_of_the_new_model_on_a_newer_version_holds_the_switch_alone(
    db: Database, worker: UUID
) -> None:
    """Both models fail a@2 (the old one as well): the new model serves a@1 like the old one,
    so the coverage comparison would let the switch end; its failed job on a newer version
    must still hold it (rule 1), until it is retried and indexed."""
    with db.connection() as conn:
        old = helpers.model(conn, OLD, 4)
        helpers.enqueue(conn, old.id, "a.txt", content=b"a1")
        _run_jobs(conn, worker, old)
        new = activate_model(conn, NEW, 8, max_attempts=1).model
        v2 = helpers.enqueue(conn, old.id, "a.txt", content=b"a2", max_attempts=1)

        def fail_v2(claim: Claim) -> str:
            return "fail" if claim.document_version_id == v2.version_id else "complete"

        _run_jobs(conn, worker, old, fail_v2)
        _run_jobs(conn, worker, new, fail_v2)
        assert (_served_no(conn, old, "a.txt"), _served_no(conn, new, "a.txt")) == (1, 1)
        assert serving_model(conn) == old
        assert _activating(conn, new)
        (failed,) = conn.execute(
            "SELECT id FROM embedding_jobs WHERE embedding_model_id = %s AND status = 'FAILED'",
            (new.id,),
        ).fetchall()
        lifecycle.retry_failed(conn, failed["id"], extra_attempts=1)
        _run_jobs(conn, worker, new)
        assert serving_model(conn).name == NEW  # type: ignore[union-attr]
        assert _served_no(conn, new, "a.txt") == 2


def test_a_failed_job_on_an_older_version_than_the_new_model_serves_does_not_hold_it(
    db: Database, worker: UUID
) -> None:
    """a@2 exists before the activation (its old-model job still pending); the new model gets
    a@2 and a@1 (the served one), fails a@1 and indexes a@2: it serves a newer version than
    the failed job's, so it owes nothing and the switch ends."""
    with db.connection() as conn:
        old = helpers.model(conn, OLD, 4)
        v1 = helpers.enqueue(conn, old.id, "a.txt", content=b"a1")
        _run_jobs(conn, worker, old)
        helpers.enqueue(conn, old.id, "a.txt", content=b"a2")
        activation = activate_model(conn, NEW, 8, max_attempts=1)
        new = activation.model
        assert activation.jobs == 2
        _run_jobs(
            conn,
            worker,
            new,
            lambda claim: "fail" if claim.document_version_id == v1.version_id else "complete",
        )
        assert _served_no(conn, new, "a.txt") == 2
        assert serving_model(conn).name == NEW  # type: ignore[union-attr]


def test_an_ingest_in_flight_when_the_switch_checks_is_waited_for_and_its_job_counted(
    db: Database, worker: UUID
) -> None:
    """The new model owes nothing when the switch first looks; an ingest's transaction holds
    the serving model's row (its job's foreign key) and adds the new model's twin job. The
    switch waits for it, then sees the twin job and does not end."""
    with db.connection() as conn:
        old = helpers.model(conn, OLD, 4)
        helpers.enqueue(conn, old.id, "a.txt", content=b"a1")
        _run_jobs(conn, worker, old)
        new = activate_model(conn, NEW, 8, max_attempts=3).model
        _run_jobs(conn, worker, new)  # no finish_switch call: the switch is still due

    holding, release = threading.Event(), threading.Event()
    pid: list[int] = []

    def ingest() -> None:
        with db.connection() as conn, conn.transaction():
            helpers.enqueue(conn, old.id, "b.txt", content=b"b1")
            holding.set()
            assert release.wait(30)

    def switch() -> bool:
        assert holding.wait(30)
        with db.connection() as conn:
            pid.append(conn.info.backend_pid)
            return finish_switch(conn)

    with ThreadPoolExecutor(2) as pool:
        ingesting, switching = pool.submit(ingest), pool.submit(switch)
        with db.connection() as conn:
            while not (pid and helpers.waits_on_a_lock(conn, pid[0])):
                assert not switching.done(), f"the switch did not wait: {switching.result()}"
        release.set()
        ingesting.result()
        assert switching.result() is False
    with db.connection() as conn:
        assert _activating(conn, new)
        assert serving_model(conn) == old  # the twin job of b is still PENDING
        _run_jobs(conn, worker, new)
        assert serving_model(conn).name == NEW  # type: ignore[union-attr]


# -- rule (2): the coverage comparison and its locks ----------------------------------------


def _gap(conn: Connection, worker: UUID) -> tuple[EmbeddingModel, EmbeddingModel, Claim]:
    """Old serves a@1 and has a@2 claimed (not completed); the new model serves a@1, owes no
    work and has no job on a@2 (removed by hand: the gap the comparison catches)."""
    old = helpers.model(conn, OLD, 4)
    helpers.enqueue(conn, old.id, "a.txt", content=b"a1")
    _run_jobs(conn, worker, old)
    v2 = helpers.enqueue(conn, old.id, "a.txt", content=b"a2")
    new = activate_model(conn, NEW, 8, max_attempts=3).model
    gone = conn.execute(
        "DELETE FROM embedding_jobs WHERE embedding_model_id = %s AND document_version_id = %s",
        (new.id, v2.version_id),
    ).rowcount
    assert gone == 1
    _run_jobs(conn, worker, new)
    assert _served_no(conn, new, "a.txt") == 1
    (claim,) = lifecycle.claim_jobs(conn, worker, 1, 300, model_id=old.id)
    assert claim.document_version_id == v2.version_id
    _embed(conn, claim, old)
    return old, new, claim


def test_the_switch_compares_what_each_model_serves(db: Database, worker: UUID) -> None:
    with db.connection() as conn:
        old, new, claim = _gap(conn, worker)
        lifecycle.complete_job(conn, claim)  # old serves a@2, new a@1
        assert finish_switch(conn) is False
        assert serving_model(conn) == old
        assert _activating(conn, new)


def test_the_switch_waits_for_a_serving_model_completion_in_flight(
    db: Database, worker: UUID
) -> None:
    """The old model's completion of a@2 is uncommitted when the switch compares: the switch
    waits for it (the model row lock), then sees old a@2 against new a@1 and does not end."""
    with db.connection() as conn:
        old, new, claim = _gap(conn, worker)

    holding, release = threading.Event(), threading.Event()
    pid: list[int] = []

    def complete() -> Any:
        with db.connection() as conn, conn.transaction():
            result = lifecycle.complete_job(conn, claim)
            holding.set()
            assert release.wait(30)
            return result

    def switch() -> bool:
        assert holding.wait(30)
        with db.connection() as conn:
            pid.append(conn.info.backend_pid)
            return finish_switch(conn)

    with ThreadPoolExecutor(2) as pool:
        completing, switching = pool.submit(complete), pool.submit(switch)
        with db.connection() as conn:
            while not (pid and helpers.waits_on_a_lock(conn, pid[0])):
                assert not switching.done(), f"the switch did not wait: {switching.result()}"
        release.set()
        assert completing.result().became_current
        assert switching.result() is False
    with db.connection() as conn:
        assert serving_model(conn) == old
        assert (_served_no(conn, old, "a.txt"), _served_no(conn, new, "a.txt")) == (2, 1)


# -- one chunk set per (version, chunking), stored once ------------------------------------


def _drafts(claim: Claim, n: int) -> list[ChunkDraft]:
    texts = [f"{claim.job_id} chunk {i}" for i in range(n)]
    return [
        ChunkDraft(
            index=i,
            text=t,
            start=0,
            end=len(t),
            token_count=1,
            content_sha256=hashlib.sha256(t.encode()).hexdigest(),
        )
        for i, t in enumerate(texts)
    ]


def _twin_parses(conn: Connection, worker: UUID) -> list[ChunkCommit]:
    """A version with a job for each of two models of one chunking, both claimed before either
    stored the set, each with its parse prepared."""
    old = helpers.model(conn, OLD, 4)
    helpers.enqueue(conn, old.id, "a.txt", content=b"a1")
    _run_jobs(conn, worker, old)
    new = activate_model(conn, NEW, 8, max_attempts=3).model
    _run_jobs(conn, worker, new)
    helpers.enqueue(conn, old.id, "b.txt", content=b"b1")  # jobs for both models
    claims = [lifecycle.claim_jobs(conn, worker, 1, 300, model_id=m.id)[0] for m in (old, new)]
    assert claims[0].document_version_id == claims[1].document_version_id
    assert not any(c.chunks_ready for c in claims)
    commits = []
    for claim in claims:
        assert claim.parse is not None
        commits.append(ChunkCommit(claim, claim.parse, _drafts(claim, 3)))
    return commits


def test_the_second_twin_to_store_the_set_converges_on_the_first_ones(
    db: Database, worker: UUID
) -> None:
    with db.connection() as conn:
        first, second = _twin_parses(conn, worker)
        (stored,) = store_chunks_many(conn, [first])
        assert not isinstance(stored, Exception | int), stored
        (again,) = store_chunks_many(conn, [second])
        assert again == 3  # the stored set's size: nothing written, the embed step reads it
        rows = helpers.count(
            conn,
            "SELECT count(*) FROM document_chunks WHERE document_version_id = %s",
            first.claim.document_version_id,
        )
        assert rows == 3


def test_twins_storing_the_set_at_once_wait_on_the_version_and_converge(
    db: Database, worker: UUID
) -> None:
    """The first twin's chunk commit is uncommitted; the second waits on the version row and,
    once the first commits, finds the set stored (instead of inserting a second one)."""
    with db.connection() as conn:
        first, second = _twin_parses(conn, worker)

    holding, release = threading.Event(), threading.Event()
    pid: list[int] = []

    def store_first() -> object:
        with db.connection() as conn, conn.transaction():
            (result,) = store_chunks_many(conn, [first])
            holding.set()
            assert release.wait(30)
            return result

    def store_second() -> object:
        assert holding.wait(30)
        with db.connection() as conn:
            pid.append(conn.info.backend_pid)
            try:
                (result,) = store_chunks_many(conn, [second])
            except Exception as exc:
                return exc
            return result

    with ThreadPoolExecutor(2) as pool:
        one, two = pool.submit(store_first), pool.submit(store_second)
        with db.connection() as conn:
            while not (pid and helpers.waits_on_a_lock(conn, pid[0])):
                assert not two.done(), two.result()
        release.set()
        assert not isinstance(one.result(), Exception | int), one.result()
        late = two.result()
    assert late == 3, late
    with db.connection() as conn:
        rows = helpers.count(
            conn,
            "SELECT count(*) FROM document_chunks WHERE document_version_id = %s",
            first.claim.document_version_id,
        )
    assert rows == 3


def test_a_token_aware_job_on_a_version_with_only_the_character_set_is_told_to_parse(
    db: Database, worker: UUID
) -> None:
    """The claim's ``chunks_ready`` looks for the job's own chunk set: a version the serving
    model indexed from character chunks has none of a token-aware model's, so the claim must
    say "parse" (with what the parse reads and its start time for the chunk commit) rather
    than "embed"."""
    with db.connection() as conn:
        old = helpers.model(conn, OLD, 4)
        helpers.enqueue(conn, old.id, "a.txt", content=b"alpha bravo")
        _run_jobs(conn, worker, old)
        new = activate_model(conn, NEW, 4, max_attempts=3).model
        tokens_worker = helpers.worker(conn, chunking=token_chunking(NEW))
        (claim,) = lifecycle.claim_jobs(conn, tokens_worker, 1, 300, model_id=new.id)
        assert not claim.chunks_ready
        assert claim.parse is not None and claim.parse.parse_started_at is not None


# -- workers ------------------------------------------------------------------------------------


def test_a_second_stopped_write_changes_nothing(db: Database, worker: UUID) -> None:
    """STOPPED is final for the STOPPED write too: a repeated one (a cleanup write retried after
    a timeout whose first try did commit) neither moves stopped_at nor records a second
    WORKER_STOPPED."""
    with db.connection() as conn:
        lifecycle.set_worker_status(conn, worker, WorkerStatus.STOPPED)
        first = conn.execute(
            "SELECT stopped_at FROM indexing_workers WHERE id = %s", (worker,)
        ).fetchone()
        lifecycle.set_worker_status(conn, worker, WorkerStatus.STOPPED)
        again = conn.execute(
            "SELECT stopped_at FROM indexing_workers WHERE id = %s", (worker,)
        ).fetchone()
        events = conn.execute(
            "SELECT event_type FROM indexing_events WHERE worker_id = %s ORDER BY id", (worker,)
        ).fetchall()
    assert again == first
    assert [e["event_type"] for e in events] == ["WORKER_REGISTERED", "WORKER_STOPPED"]
