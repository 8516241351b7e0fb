"""``ingest --wait`` (``progress.wait_for_jobs``) on real PostgreSQL: it ends when every job it
waits for has finished or was removed with its document, without a terminal it prints a
progress line every few seconds (on Trio's virtual clock), and it says whose lease it waits
for, and until when, when a job's worker died holding it."""

from __future__ import annotations

import io
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, cast
from uuid import UUID, uuid4

import pytest
import trio

from tests import helpers
from trioindex.db import jobs as lifecycle
from trioindex.db.documents import delete_documents
from trioindex.db.operations.wait_progress import abandoned_leases, jobs_progress
from trioindex.db.operations.workers import live_worker_count
from trioindex.db.pool import Database
from trioindex.progress import LINE_SECONDS, POLL_SECONDS, WORKER_CHECK_POLLS, wait_for_jobs


async def test_a_wait_ends_when_a_waited_for_document_is_deleted_and_says_so(
    db: Database,
) -> None:
    with db.connection() as conn:
        model = helpers.model(conn)
        kept = helpers.enqueue(conn, model.id, "kept.txt")
        gone = helpers.enqueue(conn, model.id, "gone.txt")
        conn.execute(
            """UPDATE embedding_jobs SET status = 'FAILED', finished_at = now(),
                   last_failure_type = 'DOCUMENT_CONTENT_INVALID' WHERE id = %s""",
            (kept.job_id,),
        )
        delete_documents(conn, ["gone.txt"])
    assert kept.job_id is not None and gone.job_id is not None
    with trio.fail_after(10):  # it used to wait for ever for the deleted job's row
        waited = await wait_for_jobs(db, [kept.job_id, gone.job_id], show=False)
    assert [(r["id"], r["status"]) for r in waited.finals] == [(kept.job_id, "FAILED")]
    assert waited.removed == {gone.job_id}


class _Jobs:
    """The jobs a wait polls, in memory: a thread-free stand-in for :class:`Database`, so that
    Trio's virtual clock moves only when the wait sleeps (threads would let it jump)."""

    def __init__(self, job: UUID) -> None:
        self.row = {"id": job, "status": "PENDING", "embedded": 0, "external_key": "slow.txt"}
        self.leases: list[dict[str, Any]] = []  # what abandoned_leases answers

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        if fn is jobs_progress:
            return [dict(self.row)]
        if fn is abandoned_leases:
            return list(self.leases)
        assert fn is live_worker_count
        return 1


async def test_without_a_terminal_a_line_every_few_seconds_and_one_at_the_end(
    autojump_clock: trio.abc.Clock,
) -> None:
    jobs = _Jobs(uuid4())
    out = io.StringIO()  # not a terminal

    async def finish_later() -> None:
        await trio.sleep(LINE_SECONDS * 2.5 + 0.1)  # between two polls (every 0.5 s)
        jobs.row.update(status="SUCCEEDED", embedded=3)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(finish_later)
        waited = await wait_for_jobs(
            cast(Database, jobs), [jobs.row["id"]], show=True, heartbeat_timeout=60, out=out
        )
    assert [r["status"] for r in waited.finals] == ["SUCCEEDED"]
    assert out.getvalue().splitlines() == [
        "indexing: 0/1 documents done, 0 chunks embedded (0s)",
        "indexing: 0/1 documents done, 0 chunks embedded (5s)",
        "indexing: 0/1 documents done, 0 chunks embedded (10s)",
        "indexing: 1/1 documents done, 3 chunks embedded (13s)",
    ]


def test_a_job_held_by_a_worker_that_is_not_live_is_found_with_its_lease(db: Database) -> None:
    with db.connection() as conn:
        model = helpers.model(conn)
        held = helpers.enqueue(conn, model.id, "held.txt")
        other = helpers.enqueue(conn, model.id, "other.txt")
        worker = helpers.worker(conn)
        claims = lifecycle.claim_jobs(conn, worker, 2, 40)
        assert {c.job_id for c in claims} == {held.job_id, other.job_id}
        jobs = [held.job_id, other.job_id]
        assert abandoned_leases(conn, jobs, 60) == []  # its worker is live
        conn.execute(
            "UPDATE indexing_workers SET last_heartbeat_at = now() - interval '1 hour'"
        )  # killed: no heartbeat since
        found = abandoned_leases(conn, [held.job_id], 60)
        assert [(r["id"], r["external_key"], r["worker_id"]) for r in found] == [
            (held.job_id, "held.txt", worker)
        ]
        assert 30 < found[0]["seconds_left"] <= 40
        helpers.expire_lease(conn, held.job_id)
        assert abandoned_leases(conn, [held.job_id], 60)[0]["seconds_left"] == 0


async def test_a_wait_says_once_whose_lease_it_waits_for_and_until_when(
    autojump_clock: trio.abc.Clock, capsys: pytest.CaptureFixture[str]
) -> None:
    jobs = _Jobs(uuid4())
    jobs.row["status"] = "PROCESSING"
    worker = UUID("1a2b3c4d-0000-0000-0000-000000000000")
    until = datetime(2026, 12, 2, 4, 41, 7, tzinfo=UTC)
    lease = {"id": jobs.row["id"], "external_key": "slow.txt", "worker_id": worker}
    jobs.leases = [{**lease, "lease_expires_at": until, "seconds_left": 25.0}]

    async def lease_runs_out_then_done() -> None:
        await trio.sleep(POLL_SECONDS * WORKER_CHECK_POLLS * 2.5)  # two checks, said once
        jobs.leases = [{**lease, "lease_expires_at": until, "seconds_left": 0.0}]
        await trio.sleep(POLL_SECONDS * WORKER_CHECK_POLLS * 2)
        jobs.row.update(status="SUCCEEDED", embedded=3)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(lease_runs_out_then_done)
        await wait_for_jobs(
            cast(Database, jobs), [jobs.row["id"]], show=False, heartbeat_timeout=60
        )
    assert capsys.readouterr().err.splitlines() == [
        "waiting for the lease on slow.txt: its worker 1a2b3c4d stopped without handing the job"
        " back; the lease runs until 04:41:07 UTC (in 25s), then a live worker takes it over",
        "waiting for slow.txt: its worker 1a2b3c4d stopped without handing the job back; its"
        " lease ran out at 04:41:07 UTC, and the next live worker's recovery check takes it over",
    ]
