"""``ingest --wait`` (``progress.wait_for_jobs``) on real PostgreSQL: it ends when every job it
waits for has finished or was removed with its document, and without a terminal it prints a
progress line every few seconds (on Trio's virtual clock)."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any, cast
from uuid import UUID, uuid4

import trio

from tests import helpers
from trioindex.db.documents import delete_documents
from trioindex.db.operations import jobs_progress, live_worker_count
from trioindex.db.pool import Database
from trioindex.progress import LINE_SECONDS, wait_for_jobs


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

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        if fn is jobs_progress:
            return [dict(self.row)]
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
