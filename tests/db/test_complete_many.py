"""The grouped completion (``complete_many``) on real PostgreSQL: many claims completed in one
transaction, each fenced and refused alone, each ending exactly as ``complete_job`` ends it.
"""

from __future__ import annotations

import psycopg
import pytest

from tests import helpers
from trioindex.db import jobs as lifecycle
from trioindex.db.pool import Connection, Database
from trioindex.errors import JobRemoved, OwnershipLost, StateInconsistent
from trioindex.values import Claim, CompleteResult


def embedded_claims(conn: Connection, n: int) -> list[Claim]:
    """``n`` claims of one worker, each with its chunk set and full vector set stored."""
    model = helpers.model(conn, "complete-many", 4)
    for _ in range(n):
        helpers.enqueue(conn, model.id)
    group = lifecycle.claim_jobs(conn, helpers.worker(conn), n, 300)
    assert len(group) == n
    for claim in group:
        helpers.stage_embedded(conn, claim)
    return group


def test_a_group_completes_every_job_as_one_completion_does(db: Database) -> None:
    with db.connection() as conn:
        group = embedded_claims(conn, 4)
        results = lifecycle.complete_many(conn, group)
        assert results == [CompleteResult(became_current=True)] * 4
        for claim in group:
            row = helpers.job_row(conn, claim.job_id)
            assert (row["status"], row["chunk_count"], row["claim_token"]) == ("SUCCEEDED", 2, None)
            assert helpers.events(conn, claim.job_id)[-1] == "JOB_SUCCEEDED"
            assert helpers.serves(conn, claim)
            attempt = conn.execute(
                "SELECT status FROM trioindex_job_attempts WHERE id = %s", (claim.attempt_id,)
            ).fetchone()
            assert attempt is not None and attempt["status"] == "SUCCEEDED"


def test_refused_jobs_are_refused_alone_and_the_others_commit(db: Database) -> None:
    with db.connection() as conn:
        group = embedded_claims(conn, 5)
        # 1: the lease ran out; 2: the document was deleted; 3: a vector is missing
        helpers.expire_lease(conn, group[1].job_id)
        helpers.delete_document_of(conn, group[2])
        conn.execute(
            """DELETE FROM embeddings WHERE ctid IN (SELECT ctid FROM embeddings
               WHERE document_version_id = %s LIMIT 1)""",
            (group[3].document_version_id,),
        )
        results = lifecycle.complete_many(conn, group)
        assert isinstance(results[1], OwnershipLost)
        assert isinstance(results[2], JobRemoved)
        assert isinstance(results[3], StateInconsistent)
        assert results[0] == results[4] == CompleteResult(became_current=True)
        for kept in (group[0], group[4]):
            assert helpers.job_row(conn, kept.job_id)["status"] == "SUCCEEDED"
        for refused in (group[1], group[3]):
            assert helpers.job_row(conn, refused.job_id)["status"] == "PROCESSING"
            assert "JOB_SUCCEEDED" not in helpers.events(conn, refused.job_id)
            assert not helpers.serves(conn, refused)


@pytest.mark.parametrize("forgery", helpers.FORGERIES)
def test_a_forged_claim_in_a_group_is_refused_alone(db: Database, forgery: str) -> None:
    with db.connection() as conn:
        group = embedded_claims(conn, 3)
        forged = helpers.forge(conn, group[0], forgery)
        results = lifecycle.complete_many(conn, [forged, *group[1:]])
        assert isinstance(results[0], OwnershipLost)
        assert results[1:] == [CompleteResult(became_current=True)] * 2
        assert helpers.job_row(conn, group[0].job_id)["status"] == "PROCESSING"


def test_a_group_is_one_transaction(db: Database) -> None:
    with db.connection() as conn:
        group = embedded_claims(conn, 6)
        lifecycle.complete_many(conn, group)
        writers = conn.execute(
            """SELECT count(DISTINCT xmin::text) AS n FROM embedding_job_attempts
               WHERE id = ANY(%s)""",
            ([c.attempt_id for c in group],),
        ).fetchone()
        jobs = conn.execute(
            "SELECT count(DISTINCT xmin::text) AS n FROM embedding_jobs WHERE id = ANY(%s)",
            ([c.job_id for c in group],),
        ).fetchone()
        assert writers is not None and jobs is not None
        assert (writers["n"], jobs["n"]) == (1, 1)


def test_an_error_other_than_a_refusal_fails_the_whole_group(db: Database) -> None:
    with db.connection() as conn:
        group = embedded_claims(conn, 2)
        conn.execute("ALTER TABLE embedding_job_attempts ADD CHECK (finished_at IS NULL)")
        with pytest.raises(psycopg.errors.CheckViolation):
            lifecycle.complete_many(conn, group)
        for claim in group:
            assert helpers.job_row(conn, claim.job_id)["status"] == "PROCESSING"


def test_a_claims_commit_skips_the_wait_for_the_disk_in_its_own_transaction_only(
    db: Database,
) -> None:
    """The claim turns synchronous_commit off for its own transaction; the pooled connection's
    next transaction (a completion) commits as the session says (on, unless the operator chose
    otherwise)."""

    def setting(conn: Connection) -> str:
        row = conn.execute("SELECT current_setting('synchronous_commit') AS s").fetchone()
        assert row is not None
        return str(row["s"])

    with db.connection() as conn:
        model = helpers.model(conn, "claim-setting", 4)
        for _ in range(2):
            helpers.enqueue(conn, model.id)
        worker = helpers.worker(conn)
        conn.execute("SET synchronous_commit = on")  # the test server runs with it off
        with conn.transaction():  # inside a caller's transaction, seen before the commit
            assert len(lifecycle.claim_jobs(conn, worker, 1, 300)) == 1
            assert setting(conn) == "off"
        assert setting(conn) == "on"
        assert len(lifecycle.claim_jobs(conn, worker, 1, 300)) == 1  # its own transaction
        assert setting(conn) == "on"
        conn.execute("RESET synchronous_commit")
