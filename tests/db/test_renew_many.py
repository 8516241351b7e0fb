"""The group renewal (``renew_leases``) on real PostgreSQL: the leases of many claims extended in
one statement, each claim fenced and refused alone, a refused job left as it was.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import attrs
import pytest

from tests import helpers
from trioindex.db import jobs as lifecycle
from trioindex.db.pool import Connection, Database
from trioindex.errors import JobRemoved, OwnershipLost
from trioindex.values import Claim


def claims_of_one_worker(conn: Connection, n: int) -> list[Claim]:
    model = helpers.model(conn, "renew-many", 4)
    for _ in range(n):
        helpers.enqueue(conn, model.id)
    group = lifecycle.claim_jobs(conn, helpers.worker(conn), n, 60)
    assert len(group) == n
    return group


def lease_of(conn: Connection, claim: Claim) -> Any:
    return helpers.job_row(conn, claim.job_id)["lease_expires_at"]


def test_a_group_extends_every_lease_it_still_owns_and_only_the_lease(db: Database) -> None:
    with db.connection() as conn:
        group = claims_of_one_worker(conn, 3)
        before: dict[Any, dict[str, Any]] = {
            c.job_id: helpers.job_row(conn, c.job_id) for c in group
        }
        results = lifecycle.renew_leases(conn, group, 600)
        for claim, result in zip(group, results, strict=True):
            row: dict[str, Any] = helpers.job_row(conn, claim.job_id)
            assert result == row["lease_expires_at"]
            assert row["lease_expires_at"] > before[claim.job_id]["lease_expires_at"]
            kept = ("status", "worker_id", "claim_token", "locked_at", "attempt_count")
            assert {k: row[k] for k in kept} == {k: before[claim.job_id][k] for k in kept}
        jobs = conn.execute(
            "SELECT count(DISTINCT xmin::text) AS n FROM embedding_jobs WHERE id = ANY(%s)",
            ([c.job_id for c in group],),
        ).fetchone()
        assert jobs is not None and jobs["n"] == 1  # one transaction


def test_refused_claims_are_refused_alone_in_their_own_result(db: Database) -> None:
    with db.connection() as conn:
        group = claims_of_one_worker(conn, 4)
        # 3: recovered and claimed again; 1: the lease ran out; 2: the document was deleted
        helpers.expire_lease(conn, group[3].job_id)
        lifecycle.recover_expired(conn, helpers.BACKOFF)
        helpers.make_available(conn, group[3].job_id)
        (again,) = lifecycle.claim_jobs(conn, helpers.worker(conn), 1, 60)
        assert again.job_id == group[3].job_id
        helpers.expire_lease(conn, group[1].job_id)
        expired_at = lease_of(conn, group[1])
        helpers.delete_document_of(conn, group[2])
        results = lifecycle.renew_leases(conn, group, 600)
        assert isinstance(results[1], OwnershipLost)
        assert "expired" in str(results[1])
        assert isinstance(results[2], JobRemoved)
        assert isinstance(results[3], OwnershipLost) and not isinstance(results[3], JobRemoved)
        assert results[0] == lease_of(conn, group[0])
        assert lease_of(conn, group[1]) == expired_at
        assert lease_of(conn, again) == again.lease_expires_at  # the new claim's lease untouched


@pytest.mark.parametrize("forgery", helpers.FORGERIES)
def test_a_forged_claim_in_a_group_is_refused_and_its_lease_kept(
    db: Database, forgery: str
) -> None:
    with db.connection() as conn:
        group = claims_of_one_worker(conn, 2)
        forged = helpers.forge(conn, group[0], forgery)
        before = lease_of(conn, group[0])
        results = lifecycle.renew_leases(conn, [forged, group[1]], 600)
        assert isinstance(results[0], OwnershipLost)
        assert lease_of(conn, group[0]) == before
        assert results[1] == lease_of(conn, group[1])


def test_a_claim_naming_another_jobs_attempt_is_refused(db: Database) -> None:
    """The other job's attempt is STARTED, by the same worker, with the same number: only its
    job id tells it apart."""
    with db.connection() as conn:
        group = claims_of_one_worker(conn, 2)
        borrowed = attrs.evolve(group[0], attempt_id=group[1].attempt_id)
        before = lease_of(conn, group[0])
        (result,) = lifecycle.renew_leases(conn, [borrowed], 600)
        assert isinstance(result, OwnershipLost)
        assert lease_of(conn, group[0]) == before


def test_no_claims_is_no_statement(db: Database) -> None:
    with db.connection() as conn:
        assert lifecycle.renew_leases(conn, [], 600) == []


def test_a_renewal_waiting_on_a_completion_is_refused_once_it_commits(db: Database) -> None:
    """The completion holds the job row; the renewal waits for it (on its own connection) and
    then finds the job SUCCEEDED: refused, and the other claim of the group renewed."""
    with db.connection() as setup:
        group = claims_of_one_worker(setup, 2)
        helpers.stage_embedded(setup, group[0])
    results: list[Any] = []
    with db.connection() as completer, db.connection() as renewer, db.connection() as observer:
        with completer.transaction():
            lifecycle.complete_job(completer, group[0])
            thread = threading.Thread(
                target=lambda: results.extend(lifecycle.renew_leases(renewer, group, 600))
            )
            thread.start()
            deadline = time.monotonic() + 30
            while not helpers.waits_on_a_lock(observer, renewer.info.backend_pid):
                assert time.monotonic() < deadline, "the renewal never waited on the row lock"
            assert not results  # still waiting while the completion holds the row
        thread.join(timeout=30)
    assert isinstance(results[0], OwnershipLost)
    assert "SUCCEEDED" in str(results[0])
    assert not isinstance(results[1], Exception)
