"""``ingest --wait``: poll the jobs an ingest created and draw a live progress bar."""

from __future__ import annotations

import sys
from typing import Any
from uuid import UUID

import attrs
import trio
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from trioindex.db.operations import jobs_progress, live_worker_count
from trioindex.db.pool import Database

POLL_SECONDS = 0.5
WORKER_CHECK_POLLS = 10  # look for a live worker every 5 s

NO_WORKER_HINT = (
    "no live worker is registered (none RUNNING with a heartbeat in the last {timeout:.0f}s), "
    "so nothing will index these jobs: start one with `trioindex worker` (`just worker` in the "
    "project) in another terminal; still waiting"
)


@attrs.frozen
class WaitResult:
    """How a wait ended: the final rows of the jobs that still exist, and the ids of the jobs
    that were removed meanwhile (their document deleted, or their model removed)."""

    finals: tuple[dict[str, Any], ...]
    removed: frozenset[UUID]


async def wait_for_jobs(
    db: Database,
    job_ids: list[UUID],
    *,
    show: bool = True,
    heartbeat_timeout: float | None = None,
) -> WaitResult:
    """Wait until every job is SUCCEEDED, FAILED or gone (a removed job never finishes).

    With ``heartbeat_timeout``, says once (on stderr) when no live worker is registered, since
    then the wait would otherwise sit at 0 done with no explanation.
    """
    if not job_ids:
        return WaitResult((), frozenset())
    polls, hinted = 0, False
    columns = (
        TextColumn("[bold]indexing"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(
            "documents · {task.fields[chunks]} chunks embedded · {task.fields[failed]} failed"
        ),
        TimeElapsedColumn(),
    )
    with Progress(*columns, disable=not show, transient=False) as bar:
        task = bar.add_task("jobs", total=len(job_ids), chunks=0, failed=0)
        while True:
            rows = await db.run(jobs_progress, job_ids)
            done = [r for r in rows if r["status"] in ("SUCCEEDED", "FAILED")]
            bar.update(
                task,
                completed=len(done) + len(job_ids) - len(rows),
                chunks=sum(r["embedded"] for r in rows),
                failed=sum(1 for r in rows if r["status"] == "FAILED"),
            )
            if len(done) == len(rows):
                removed = frozenset(job_ids) - {r["id"] for r in rows}
                return WaitResult(tuple(rows), removed)
            check = heartbeat_timeout is not None and not hinted
            if check and polls % WORKER_CHECK_POLLS == 0:
                assert heartbeat_timeout is not None
                hinted = await db.run(live_worker_count, heartbeat_timeout) == 0
                if hinted:  # stderr: the live bar redraws below it
                    print(NO_WORKER_HINT.format(timeout=heartbeat_timeout), file=sys.stderr)
            polls += 1
            await trio.sleep(POLL_SECONDS)
